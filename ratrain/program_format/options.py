"""CompileOptions: what a user asks the compiler for, checked on construction; the one
description of a configuration (docs/DESIGN.md section 10). The planner's Candidate names
a subset of its fields, the compiler's FLAGS are its fields, and the defaults the
commands share are set here.

Kept free of jax and of the IR so the command line can build its parser and validate
flags without importing them.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from ratrain.program_format.placement import Placement, parse_placement

SCHEDULES = ("ratrain", "baseline")
PIPELINE_SCHEDULES = ("1f1b", "zb1")  # NOTE [zb1 schedule] (passes/schedule_zb1.py)
RECOMPUTE_POLICIES = ("none", "full", "selective", "auto")
PRECISIONS = ("fp32", "fp16", "bf16")
# the dtype a precision traces activations and parameter views in (master state is fp32)
GRAPH_DTYPE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
PRECISION_HELP = ("fp32 exact mode; fp16 mixed precision (fp16 activations and views, fp32 "
                  "master weights and optimizer state, dynamic loss scaling); or bf16 (the same "
                  "in bf16, no loss scaling) (default: the profile's, fp16 on mt3000, fp32 on cpu)")
GRAD_ACCUMULATION = ("auto", "local", "scatter")
UPDATE_RULES = ("commit", "after-norm")  # NOTE [commit rule] (passes/insert_update.py)
# which vocabulary-sized layers --vocab-parallel spreads over the stages by rows: none, the
# LM head (NOTE [vocabulary-parallel head], ir/vocab.py), or the head and the input
# embedding (NOTE [vocabulary-parallel embedding]); the bare flag means "both"
VOCAB_PARALLEL = ("none", "head", "both")

# Every command's default --seq-len (compile, plan, train, info, the tracer), cut to the
# model's context by models/config.default_seq_len: short enough to train on a CPU, and
# any longer sequence is one flag away.
DEFAULT_SEQ_LEN = 128
MAX_DEFAULT_MICRO_BATCHES = 4   # more, smaller micro-batches only add per-call overhead


@dataclass(frozen=True)
class CompileOptions:
    pp: int = 1                         # pipeline stages
    dp: int = 1                         # data-parallel replicas of every stage
    micro_batches: int = 1              # M micro-batches per step (a command without
                                        # --micro-batches: default_micro_batches)
    micro_batch_size: int = 1           # sequences per micro-batch
    seq_len: int = DEFAULT_SEQ_LEN      # tokens per sequence
    schedule: str = "ratrain"           # "ratrain" (lifecycle scheduling) or "baseline"
    recompute: str = "auto"             # activation recovery policy, RECOMPUTE_POLICIES
    zero: int = 0                       # ZeRO stage 0, 1, 2 or 3 over the DP group
    budget: int | None = None           # usable bytes per rank; None = unlimited
    hw: str = "cpu"                     # hardware profile name
    precision: str = "fp32"             # "fp32" exact mode, "fp16" mixed precision with
                                        # loss scaling, "bf16" mixed precision without
    clip: float | None = None           # global-norm gradient clipping; None = off
    grad_accum: str = "auto"            # ZeRO-2: "local", "scatter" or "auto" per stage
    stage_speeds: tuple[float, ...] | None = None  # relative speed per stage (hetero ranks)
    zero3_prefetch: int = 1             # ZeRO-3: layer views gathered this many uses
                                        # ahead (NOTE [ZeRO-3 lifecycle]); 0 = at use
    update_rule: str = "commit"         # with a NORM: "commit" (speculative UPDs, NOTE
                                        # [commit rule]) or "after-norm"; baseline: after-norm
    pipeline_schedule: str = "1f1b"     # order of F, B (and W) per stage: "1f1b" or "zb1"
                                        # (B/W split, NOTE [zb1 schedule])
    placement: str = "pipeline"         # rank order: "pipeline", "dp" or "dp:B" (NOTE
                                        # [placement], program_format/placement.py)
    vocab_parallel: str = "none"        # the rows spread over every stage: "none",
                                        # "head" (NOTE [vocabulary-parallel head]) or
                                        # "both" (and the input embedding's, NOTE
                                        # [vocabulary-parallel embedding]); VOCAB_PARALLEL

    def __post_init__(self):
        _check_options(self)

    @property
    def world_size(self) -> int:
        return self.pp * self.dp

    @property
    def rank_placement(self) -> Placement:
        """Which (stage, replica) each rank runs (NOTE [placement])."""
        return parse_placement(self.placement, self.pp, self.dp)

    @property
    def splits_head(self) -> bool:
        """Are the LM head's rows spread over the stages (NOTE [vocabulary-parallel
        head])?"""
        return self.vocab_parallel != "none"

    @property
    def splits_embedding(self) -> bool:
        """Are the input embedding's rows spread too (NOTE [vocabulary-parallel
        embedding])?"""
        return self.vocab_parallel == "both"

    @classmethod
    def from_dict(cls, fields: dict) -> CompileOptions:
        """The options a manifest or runtime.json holds (asdict of them, through JSON);
        programs written before --vocab-parallel took a value hold true or false there
        (legacy_vocab_parallel)."""
        speeds = fields.get("stage_speeds")
        fields = {**fields, "stage_speeds": None if speeds is None else tuple(speeds)}
        if "vocab_parallel" in fields:
            fields["vocab_parallel"] = legacy_vocab_parallel(fields["vocab_parallel"])
        return cls(**fields)


def legacy_vocab_parallel(value):
    """A program's recorded vocab_parallel: true (written while --vocab-parallel split the
    head alone) reads as "head", false as "none"; anything else as it is."""
    return {True: "head", False: "none"}[value] if isinstance(value, bool) else value


# fields no compile flag sets: the profile's name (--hw names the profile, which fills
# other fields too: compiler.resolve_options) and the stages' relative speeds (built in
# code for heterogeneous ranks)
NOT_FLAGS = ("hw", "stage_speeds")


def flag_fields() -> tuple[str, ...]:
    """The CompileOptions fields a compile flag sets (`seq_len` is --seq-len), in field
    order: compiler.FLAGS."""
    return tuple(f.name for f in fields(CompileOptions) if f.name not in NOT_FLAGS)


# NOTE [default micro-batches]: a step of one micro-batch leaves a pipeline idle most of
# the time (pp 2: a bubble of 1/2, pp 4: 3/4), and more, smaller micro-batches only add
# per-call overhead; so without --micro-batches a replica's sequences are split into the
# most micro-batches up to MAX_DEFAULT_MICRO_BATCHES that divide them, at least 2 where
# they allow. `ratrain compile` takes no global batch (--micro-batch-size is what it gets),
# so it has nothing to divide and takes MAX_DEFAULT_MICRO_BATCHES micro-batches.
def default_micro_batches(per_replica: int | None = None) -> int:
    """Micro-batches of a step whose command was given no --micro-batches (NOTE [default
    micro-batches]): of `per_replica` sequences, the largest divisor up to
    MAX_DEFAULT_MICRO_BATCHES, or one sequence each when that would be a single
    micro-batch (an odd prime count); with no sequence count (compile),
    MAX_DEFAULT_MICRO_BATCHES."""
    if per_replica is None:
        return MAX_DEFAULT_MICRO_BATCHES
    best = max(m for m in range(1, MAX_DEFAULT_MICRO_BATCHES + 1) if per_replica % m == 0)
    return best if best >= 2 or per_replica == 1 else per_replica


def _check_options(o: CompileOptions) -> None:
    problems = [f"--{name} must be >= 1 (got {value})" for name, value in
                (("pp", o.pp), ("dp", o.dp), ("micro-batches", o.micro_batches),
                 ("micro-batch-size", o.micro_batch_size), ("seq-len", o.seq_len))
                if value < 1]
    if o.schedule not in SCHEDULES:
        problems.append(f"--schedule must be one of {', '.join(SCHEDULES)}")
    if o.pipeline_schedule not in PIPELINE_SCHEDULES:
        problems.append(f"--pipeline-schedule must be one of {', '.join(PIPELINE_SCHEDULES)}")
    if o.recompute not in RECOMPUTE_POLICIES:
        problems.append(f"--recompute must be one of {', '.join(RECOMPUTE_POLICIES)}")
    if o.zero not in (0, 1, 2, 3):
        problems.append(f"--zero must be 0, 1, 2 or 3 (got {o.zero})")
    if o.zero3_prefetch < 0:
        problems.append(f"--zero3-prefetch must be >= 0 (got {o.zero3_prefetch})")
    if o.precision not in PRECISIONS:
        problems.append(f"--precision must be one of {', '.join(PRECISIONS)}")
    if o.update_rule not in UPDATE_RULES:
        problems.append(f"--update-rule must be one of {', '.join(UPDATE_RULES)}")
    if o.grad_accum not in GRAD_ACCUMULATION:
        problems.append(f"--grad-accum must be one of {', '.join(GRAD_ACCUMULATION)}")
    elif o.grad_accum == "scatter" and o.zero < 2:
        problems.append("--grad-accum scatter reduce-scatters shards: it needs --zero 2 or 3")
    if o.vocab_parallel not in VOCAB_PARALLEL:
        problems.append(f"--vocab-parallel must be one of {', '.join(VOCAB_PARALLEL)}")
    elif o.splits_head and (o.pp < 2 or o.zero == 3):
        problems.append("--vocab-parallel spreads the LM head over the pipeline stages: it "
                        "needs --pp 2 or more and --zero 0, 1 or 2")
    if o.stage_speeds is not None and len(o.stage_speeds) != o.pp:
        problems.append(f"stage speeds give {len(o.stage_speeds)} values for {o.pp} stages")
    try:
        o.rank_placement
    except ValueError as e:
        problems.append(str(e))
    if problems:
        raise ValueError("; ".join(problems))
