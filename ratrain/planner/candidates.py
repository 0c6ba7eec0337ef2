"""The planner's search space: one Candidate per way to run a global batch on N ranks.

pp x dp = N ranks, dp x micro_batches x micro_batch_size = the global batch, any ZeRO
stage (0 without data parallelism; ZeRO-3 with the default zero3_prefetch, one layer
view gathered ahead), under ZeRO 2 and 3 either gradient accumulation (NOTE [planned
gradient accumulation]), every recompute policy and the requested schedules. pp may be
any divisor of N up to the number of layers (partition_stages balances uneven splits).
On nodes of several ranks every placement that changes what crosses nodes
(hw/topology.placements, NOTE [placement]) is a candidate too.
Traced graphs depend only on the micro-batch size (and a vocabulary-parallel program's
shard count and what it splits), so GraphCache traces each once for all candidates.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from ratrain.hw.profiles import Profile
from ratrain.hw.topology import placements
from ratrain.program_format.options import GRAPH_DTYPE, RECOMPUTE_POLICIES, CompileOptions

# least memory first: insert_recovery's auto needs no more than full, which needs no
# more than selective, which needs no more than none (NOTE [dominance] in screen.py)
POLICIES_BY_MEMORY = ("auto", "full", "selective", "none")
assert sorted(POLICIES_BY_MEMORY) == sorted(RECOMPUTE_POLICIES)


@dataclass(frozen=True)
class Candidate:
    """The options a plan chooses: each field is the CompileOptions field of its name
    (None: the compiler's default); the search supplies the rest (options)."""
    pp: int                             # pipeline stages
    dp: int                             # data-parallel replicas
    zero: int                           # ZeRO stage over the DP group
    micro_batch_size: int               # sequences per micro-batch
    micro_batches: int                  # micro-batches per step
    recompute: str                      # recompute policy
    schedule: str                       # "ratrain" or "baseline"
    zero3_prefetch: int | None = None   # ZeRO-3 gathers issued ahead (0: at use); None:
                                        # the compiler's default (strategies.py)
    update_rule: str | None = None      # None: the compiler's default (commit where a NORM
                                        # rules); "after-norm" where its undo copies do
                                        # not fit (NOTE [update rule fallback], search.py)
    grad_accum: str | None = None       # None: the compiler's default (auto: local unless
                                        # a stage cannot fit so); "scatter" (NOTE [planned
                                        # gradient accumulation])
    placement: str = "pipeline"         # rank order (NOTE [placement]): memory alike,
                                        # nodes crossed not
    pipeline_schedule: str = "1f1b"     # "zb1": the simulated twin of a pipelined 1f1b
                                        # candidate (NOTE [zb1 twins], search.py)
    vocab_parallel: str = "none"        # "both": the LM head's and the embedding's rows
                                        # over the stages, a simulated twin too (NOTE
                                        # [zb1 twins], search.py)

    def options(self, search) -> CompileOptions:
        """The CompileOptions of this candidate in `search` (search.Search): its fields
        that are set, and the search's sequence length, budget, profile and precision."""
        chosen = {f.name: getattr(self, f.name) for f in fields(self)
                  if getattr(self, f.name) is not None}
        if self.pipeline_schedule == "zb1":  # a twin keeps gradients local (NOTE [zb1 twins])
            chosen["grad_accum"] = "local"
        return CompileOptions(**chosen, seq_len=search.seq_len, budget=search.budget,
                              hw=Profile.of(search.profile).name, precision=search.precision)

    @property
    def batching(self) -> str:
        """`16 micro-batches of 1`."""
        batches = "micro-batch" if self.micro_batches == 1 else "micro-batches"
        return f"{self.micro_batches} {batches} of {self.micro_batch_size}"

    def __str__(self) -> str:
        ahead = self.zero3_prefetch
        how = ([] if ahead is None else [f"gathers {f'{ahead} ahead' if ahead else 'at use'}"]) \
            + ([] if self.grad_accum is None else [f"gradients {SCATTERED}"])
        zero = f"{self.zero} ({'; '.join(how)})" if how else f"{self.zero}"
        rule = "" if self.update_rule is None else f", {self.update_rule} updates"
        placed = "" if self.placement == "pipeline" else f" ({self.placement}-major)" \
            if self.placement == "dp" else f" (placement {self.placement})"
        pipeline = (", zb1 pipeline" if self.pipeline_schedule == "zb1" else "") + \
            ({"none": "", "head": ", vocabulary-parallel head",
              "both": ", vocabulary-parallel head and embedding"}[self.vocab_parallel])
        return (f"pp {self.pp} x dp {self.dp}{placed}, zero {zero}, {self.batching}, "
                f"recompute {self.recompute}, {self.schedule} schedule{pipeline}{rule}")


# NOTE [planned gradient accumulation]: under ZeRO 2 and 3 a stage may keep its full fp32
# gradient from the first B to the step's SYNC (local) or reduce-scatter every
# micro-batch's gradient and keep a shard (scatter; NOTE [gradient accumulation]). The
# compiler's auto scatters only a stage that cannot fit locally under any recompute, so a
# stage that fits by recomputing recomputes. Which is faster is a cost question: the
# scatter's reduce-scatters share the DP link with the stage's other traffic and overlap
# its backward, where the full gradient's bytes force recompute (LLaMA-2-7B on 768
# mt3000 clusters, pp 3: 8.8 GiB of gradients on stage 0). So the planner searches both,
# the scatter twin first: it needs no more memory (NOTE [dominance], screen.py).
SCATTERED = "reduce-scattered each micro-batch"
GRAD_ACCUMULATIONS = ("scatter", None)  # least memory first; None: the compiler's auto


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts(clusters: int, global_batch: int, num_layers: int) -> list[tuple[int, int]]:
    """(pp, dp) pairs with pp x dp = clusters, pp <= layers and dp dividing the batch."""
    return [(pp, clusters // pp) for pp in divisors(clusters)
            if pp <= num_layers and global_batch % (clusters // pp) == 0]


def candidates(clusters: int, global_batch: int, num_layers: int,
               schedules: tuple[str, ...], ranks_per_node: int = 1) -> list[Candidate]:
    """Every candidate, grouped so that each one's memory dominators come before it;
    each with every placement that differs on nodes of `ranks_per_node` ranks."""
    out = []
    for pp, dp in layouts(clusters, global_batch, num_layers):
        placed = [str(p) for p in placements(pp, dp, ranks_per_node)]
        for size in divisors(global_batch // dp):
            for zero in (3, 2, 1, 0) if dp > 1 else (0,):
                out += [Candidate(pp, dp, zero, size, global_batch // dp // size, policy,
                                  schedule, grad_accum=grads, placement=placement)
                        for grads in (GRAD_ACCUMULATIONS if zero >= 2 else (None,))
                        for policy in POLICIES_BY_MEMORY for schedule in schedules
                        for placement in placed]
    return out


def cluster_counts(global_batch: int, num_layers: int, limit: int) -> list[int]:
    """Every N <= limit that some (pp, dp) can use, ascending."""
    return sorted({pp * dp for pp in range(1, num_layers + 1) for dp in divisors(global_batch)
                   if pp * dp <= limit})


class GraphCache:
    """TrainGraphs of one model and sequence length, traced once per micro-batch size."""

    def __init__(self, config: dict, name: str, seq_len: int, precision: str):
        self.config, self.name, self.seq_len = config, name, seq_len
        self.dtype = GRAPH_DTYPE[precision]
        self._graphs: dict[int, object] = {}

    def get(self, micro_batch_size: int, vocab_shards: int = 0, split_embed: bool = False):
        """The graph of that micro-batch size; with `vocab_shards`, its head split in that
        many row shards (NOTE [vocabulary-parallel head]), and its embedding too where
        `split_embed` (NOTE [vocabulary-parallel embedding])."""
        from ratrain.models.trace import split_vocabulary, trace_model
        if micro_batch_size not in self._graphs:
            self._graphs[micro_batch_size] = trace_model(
                self.config, micro_batch_size=micro_batch_size, seq_len=self.seq_len,
                dtype=self.dtype, name=self.name)
        key = (micro_batch_size, vocab_shards, split_embed)
        if vocab_shards and key not in self._graphs:
            self._graphs[key] = split_vocabulary(self._graphs[micro_batch_size], vocab_shards,
                                                 split_embed)
        return self._graphs[key if vocab_shards else micro_batch_size]

    def splits(self, pp: int) -> bool:
        """Can the head's and the embedding's rows be split over pp stages (the vocabulary
        divisible by pp, and a pipeline layer left for each stage once the embedding
        leaves it: the decoders and the final norm, NOTE [vocabulary-parallel
        embedding])?"""
        return 1 < pp <= int(self.config["num_hidden_layers"]) + 1 and \
            int(self.config["vocab_size"]) % pp == 0
