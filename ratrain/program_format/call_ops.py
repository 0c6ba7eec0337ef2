"""The grammar of runtime calls: every call a lowered program runs that is not an IR op
(`CallOp`), declared once in `CALL_OPS` with what it does, whether it is asynchronous,
how it is calibrated, what it puts on the link and the schema of its params and operands.

lower (passes/lower.py, lower_state.py) makes these calls, the runtime runs them
(rt/calls.py CALLS), the simulator charges them (sim/calls.py CHARGES), calibration times
some (calibrate/rt_cases.py), the cluster counts their traffic (cluster/volume.py) and
the ranks check every call a program directory holds against its schema (check_call).
NOTE [one table of call ops]: the handlers and charges live with the code they run
(rt, sim, cluster sit above the program format and may not be imported by it), so each
of those modules registers its dispatch table against CallOp through `registered`,
which refuses at import a table that misses an op or names one the grammar lacks; the
facts that are data (asynchrony, calibration, traffic, schema) live here only, and
tests/test_call_ops.py checks that every op has them all and that they agree with the
simulator's steps.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Callable

from ratrain.ir.tasks import parse_task
from ratrain.program_format.checks import FieldError, at, integer


class CallOp(StrEnum):
    LOAD_IDS = "load_ids"               # a micro-batch's input ids from the data rows
    LOAD_TARGETS = "load_targets"       # its next-token targets
    RECORD_LOSS = "record_loss"         # the head's loss of one micro-batch, kept
    FILL = "fill"                       # a constant: the loss cotangent 1/M (x loss scale)
    COPY = "copy"                       # one slot into another (a received activation)
    ACCUMULATE_GRAD = "accumulate_grad" # a B's parameter gradient into grad.L
    SEND = "send"                       # a pipeline message to the next / previous stage
    POST_RECV = "post_recv"             # post the receive of a pipeline message
    WAIT_RECV = "wait_recv"             # wait for a posted receive
    GRAD_SYNC = "grad_sync"             # SYNC: all-reduce / reduce-scatter a gradient
    GRAD_SCATTER = "grad_scatter"       # reduce-scatter one micro-batch's gradient
    GLOBAL_NORM = "global_norm"         # NORM: the world's gradient norm (commit or roll back)
    TIE_SUM = "tie_sum"                 # TIE: a tied weight's gradient summed over its copies
    ADAMW = "adamw"                     # UPD: AdamW on a layer's master (shard)
    REDO_UPDATE = "redo_update"         # a rolled-back step's update from undo.L
    PREFETCH_VIEW = "prefetch_view"     # PREF: the view cast (and gathered) from the master
    GATHER_VIEW = "gather_view"         # GATH: ZeRO-3's view gathered for one use
    VOCAB_HIDDEN = "vocab_hidden"       # S: hn broadcast from the last stage (NOTE
                                        # [vocabulary-parallel head], ir/vocab.py)
    VOCAB_STATS = "vocab_stats"         # S: a shard's log-sum-exp and target logits
    VOCAB_LOSS = "vocab_loss"           # T: the loss, from the gathered statistics
    VOCAB_GRAD = "vocab_grad"           # T: a shard's gradient, hn's gradient reduced
    EMBED_ROWS = "embed_rows"           # E: a shard's lookup, reduced into stage 0's input
                                        # (NOTE [vocabulary-parallel embedding])
    EMBED_OUTPUT_GRAD = "embed_output_grad"  # G: the lookup's gradient from stage 0
    EMBED_GRAD = "embed_grad"           # G: the shard's rows' gradient


class Traffic(StrEnum):
    """What a call puts on its rank's link (cluster/volume.py counts it per step)."""
    NONE = "none"                       # local: arena to arena
    MESSAGE = "message"                 # its input, to the pipeline peer
    DP = "dp"                           # a collective over the stage's DP group
    WORLD = "world"                     # one float64 summed over every rank
    TIE = "tie"                         # a blocking all-reduce over the tie stages; not
                                        # in planned_volume (the traffic test runs untied)
    PIPE = "pipe"                       # a collective over the replica's pipeline group
                                        # (a vocabulary-parallel head's or embedding's);
                                        # not in planned_volume


@dataclass(frozen=True)
class CallContext:
    """What a call's params are checked against: the program and the stage running it."""
    options: object                     # CompileOptions
    stage: int                          # the stage whose rows hold the call
    stage_layers: tuple[int, ...]       # that stage's layers
    num_layers: int                     # layers of the model
    tie_stages: tuple[int, ...]         # stages summing a tied weight's gradient


@dataclass(frozen=True)
class Domain:
    """A param's type and range: `what` says it in words, `check(value, context, path)`
    returns the value or raises FieldError."""
    what: str
    check: Callable


@dataclass(frozen=True)
class Param:
    name: str                           # its key in Call.params
    domain: Domain                      # its type and range
    required: bool = True               # absent only when not required


@dataclass(frozen=True)
class Arity:
    """How many operands a call reads or writes: [low, high], high None for any."""
    low: int
    high: int | None

    def __str__(self) -> str:
        return str(self.low) if self.high == self.low else \
            f"{self.low} or more" if self.high is None else f"{self.low} to {self.high}"


@dataclass(frozen=True)
class Calibration:
    """The calibration case (calibrate/cases.py, by its Case.op) whose fit prices the
    call's compute, or None and why none does."""
    case: str | None
    why: str = ""


@dataclass(frozen=True)
class CallSpec:
    does: str                           # what it does to the rank's arena
    asynchronous: bool                  # starts a non-blocking collective the hazard
                                        # rule completes before a step touches its bytes
    traced: bool                        # its run time is what a traced row holds (NOTE
                                        # [traced rows]); not a posted receive or a redo
    calibration: Calibration            # how its compute is priced
    traffic: Traffic                    # what it puts on the link
    params: tuple[Param, ...]           # every param it takes
    inputs: Arity                       # operands read
    outputs: Arity                      # operands written
    relation: Callable | None = None    # cross-field rule: (call, context) -> problem or None
    per_layer: bool = False             # works on one layer (call.layer names it)


# ---- domains ---------------------------------------------------------------------------

def _fail(path: str, what: str, value):
    raise FieldError(path, f"must be {what}, got {value!r}")


def _domain(what: str, ok: Callable) -> Domain:
    """A domain whose values `ok(value, context)` accepts."""
    def check(value, context, path):
        if not ok(value, context):
            _fail(path, what, value)
        return value
    return Domain(what, check)


def _is_int(value) -> bool:
    return type(value) is int


FLAG = _domain("true or false", lambda v, c: type(v) is bool)
ON = _domain("true (or absent)", lambda v, c: v is True)
MICRO_BATCH = _domain("a micro-batch of the step (0 <= m < micro_batches)",
                      lambda v, c: _is_int(v) and 0 <= v < c.options.micro_batches)
TAG = _domain("a message tag of the step (0 <= tag < 2 x micro_batches)",
              lambda v, c: _is_int(v) and 0 <= v < 2 * c.options.micro_batches)
PEER = _domain("-1 or 1, a neighbouring stage of the pipeline",
               lambda v, c: v in (-1, 1) and _is_int(v) and 0 <= c.stage + v < c.options.pp)
ZERO = _domain("the program's ZeRO stage (options.zero)",
               lambda v, c: _is_int(v) and v == c.options.zero)
GATHER = _domain("whether the program shards its master (options.zero >= 1)",
                 lambda v, c: type(v) is bool and v == (c.options.zero >= 1))
CLIP = _domain("the program's clip (options.clip)",
               lambda v, c: v == c.options.clip and (v is None or type(v) in (int, float)))
LOSS_COTANGENT = _domain("1 / micro_batches (the loss cotangent)",
                         lambda v, c: type(v) in (int, float)
                         and v == 1.0 / c.options.micro_batches)
COLLECTIVE = _domain("wait, allreduce or reduce_scatter",
                     lambda v, c: v in ("wait", "allreduce", "reduce_scatter"))
STAGE_LAYERS = _domain("the stage's layers, in order",
                       lambda v, c: v == tuple(c.stage_layers))
TIE_STAGES = _domain("the program's tie stages (runtime.json tie_stages), or, where it has "
                     "none, the stage running the call (each tied weight's copies on one "
                     "stage: NOTE [vocabulary-parallel embedding])",
                     lambda v, c: (v == tuple(c.tie_stages) and len(v) > 0) or
                     (not c.tie_stages and v == (c.stage,)))
ROOT = _domain("the last stage (pp - 1), where hn comes from and its gradient goes",
               lambda v, c: _is_int(v) and v == c.options.pp - 1)
THIS_STAGE = _domain("the stage running the call", lambda v, c: _is_int(v) and v == c.stage)
FIRST_STAGE = _domain("stage 0, where the lookup is summed and its gradient comes from",
                      lambda v, c: _is_int(v) and v == 0)
VOCAB = _domain("a vocabulary size (a positive integer)", lambda v, c: _is_int(v) and v > 0)


def _rows_check(value, context, path):
    """[lo, hi) rows of a weight: two integers lo < hi."""
    if not isinstance(value, tuple) or len(value) != 2 or \
            not all(_is_int(x) for x in value) or not 0 <= value[0] < value[1]:
        _fail(path, "[lo, hi], rows lo < hi of a weight", value)
    return value


def _row_list_check(value, context, path):
    if not isinstance(value, tuple) or not value:
        _fail(path, "a non-empty list of [lo, hi] rows, one per copy", value)
    for i, rows in enumerate(value):
        _rows_check(rows, context, at(path, i))
    return value


ROWS = Domain("[lo, hi], the rows of the LM head or embedding a stage's shard holds",
              _rows_check)
ROW_LIST = Domain("[lo, hi] rows of the weight each copy holds", _row_list_check)


PARAM_NAME = re.compile(r"[A-Za-z0-9_.]{1,200}(\[\d+:\d+\])?")
WEIGHT = _domain("a parameter's name (letters, digits, _ and .), or a row shard's "
                 "(name[lo:hi], ir/vocab.shard_name)",
                 lambda v, c: isinstance(v, str) and PARAM_NAME.fullmatch(v) is not None)


def _use_check(value, context, path):
    """A task of this stage's step, in task text (ir/tasks.py): the use a gather serves."""
    try:
        task = parse_task(value) if isinstance(value, str) else None
    except ValueError:
        task = None
    if task is None or task.stage != context.stage or task.micro_batch is None or \
            not 0 <= task.micro_batch < context.options.micro_batches:
        _fail(path, "the text of a task of this stage (e.g. 0F1)", value)
    return value


USE = Domain("the text of the task of this stage the gather serves", _use_check)


def _ranges(value, path: str, width: int):
    """A list of `width`-tuples of integers whose last three are lo < hi <= n."""
    if not isinstance(value, tuple) or not value:
        _fail(path, f"a non-empty list of [{'index, ' if width == 4 else ''}lo, hi, n]", value)
    for i, entry in enumerate(value):
        where = at(path, i)
        if not isinstance(entry, tuple) or len(entry) != width:
            _fail(where, f"a list of {width} integers", entry)
        for k, x in enumerate(entry):
            integer(x, at(where, k))
        lo, hi, n = entry[-3:]
        if not lo < hi <= n:
            _fail(where, "a range lo < hi <= n of a layer's n parameters", list(entry))
    return value


SKIP = Domain("[lo, hi, n] ranges of a tied copy the norm leaves out",
              lambda v, c, p: _ranges(v, p, 3))
NORM_SKIP = Domain("[input index, lo, hi, n] ranges of tied copies the norm leaves out",
                   lambda v, c, p: _ranges(v, p, 4))


# ---- cross-field rules -------------------------------------------------------------------

def _scaled_exactly_in_fp16(call, context):
    """loss_scale is on exactly in fp16 programs (passes/lower_state._loss_scaled)."""
    scaled, fp16 = bool(dict(call.params).get("loss_scale")), context.options.precision == "fp16"
    if scaled != fp16:
        return f"params.loss_scale must be {'true' if fp16 else 'absent'} in a " \
               f"{context.options.precision} program"
    return None


def _sync_collective(call, context):
    """A SYNC reduce-scatters under ZeRO 2/3, all-reduces below; it waits only for a
    gradient the B's reduce-scattered already (gshard.L in, gshard.L out)."""
    op = dict(call.params)["op"]
    if op == "wait":
        return None if context.options.zero >= 2 else "params.op wait needs ZeRO 2 or 3"
    wanted = "reduce_scatter" if context.options.zero >= 2 else "allreduce"
    return None if op == wanted else f"params.op must be {wanted} under ZeRO " \
                                     f"{context.options.zero}"


def _norm_rule(call, context):
    """The NORM: fp16's loss_scale; under the commit rule (layers) it reads no operand;
    a skip's index names one of its inputs."""
    params = dict(call.params)
    if "layers" in params and (call.inputs or call.outputs or "skip" in params):
        return "a commit-rule NORM (params.layers) takes no operands and no skip"
    if any(entry[0] >= len(call.inputs) for entry in params.get("skip", ())):
        return "params.skip names an input the call does not have"
    return _scaled_exactly_in_fp16(call, context)


def _update_rule(call, context):
    """A speculative UPD (NOTE [commit rule]) writes master, m, v and their undo copies
    and is loss-scaled in fp16; an after-norm one writes master, m, v, nothing else."""
    params = dict(call.params)
    speculative = bool(params.get("speculative"))
    if len(call.outputs) != (6 if speculative else 3):
        return f"outputs must be {'6' if speculative else '3'} slots (master, m, v" \
               f"{' and their undo copies' if speculative else ''})"
    if not speculative and ("loss_scale" in params or "skip" in params):
        return "params.loss_scale and params.skip belong to a speculative update only"
    return _scaled_exactly_in_fp16(call, context) if speculative else None


def _tie_rule(call, context):
    """A TIE sums the copies in place: its outputs are its inputs."""
    return None if call.outputs == call.inputs else "outputs must be its inputs (in place)"


def _zero3_only(call, context):
    return None if context.options.zero == 3 else "a gather_view needs ZeRO 3"


# ---- the table ---------------------------------------------------------------------------

ONE, NONE, SOME = Arity(1, 1), Arity(0, 0), Arity(1, None)
DDR = Calibration("add")   # bytes over the DDR bandwidth the streaming-add cases fit
MICRO_BATCH_PARAM, FIRST = Param("micro_batch", MICRO_BATCH), Param("first", FLAG)
MESSAGE_PARAMS = (Param("peer", PEER), Param("tag", TAG))
LOSS_SCALE = Param("loss_scale", ON, required=False)
IN_PLACE = Param("in_place", ON, required=False)   # NOTE [views gathered in place]
NORM_HEAD = Param("norm_head", ON, required=False)  # Baichuan2: NOTE [NormHead shards]


def _local(does: str, params=(), inputs=ONE, outputs=ONE, relation=None) -> CallSpec:
    """A call that only moves bytes within the arena, priced at the DDR bandwidth."""
    return CallSpec(does, False, True, DDR, Traffic.NONE, tuple(params), inputs, outputs,
                    relation)


CALL_OPS: dict[CallOp, CallSpec] = {
    CallOp.LOAD_IDS: _local("the micro-batch's rows' ids, less the last token",
                            [MICRO_BATCH_PARAM], inputs=NONE),
    CallOp.LOAD_TARGETS: _local("the micro-batch's rows' ids, less the first token",
                                [MICRO_BATCH_PARAM], inputs=NONE),
    CallOp.RECORD_LOSS: _local("the micro-batch's loss, kept for the step's mean",
                               [MICRO_BATCH_PARAM], outputs=NONE),
    CallOp.FILL: _local("the loss cotangent: value, times the loss scale in fp16",
                        [Param("value", LOSS_COTANGENT), LOSS_SCALE], inputs=NONE,
                        relation=_scaled_exactly_in_fp16),
    CallOp.COPY: _local("its input into its output"),
    CallOp.ACCUMULATE_GRAD: replace(_local(
        "the gradient into its grad.L place, added unless first", [FIRST]), per_layer=True),
    CallOp.SEND: CallSpec("its input to the stage `peer` away, under `tag`", False, True, DDR,
                          Traffic.MESSAGE, MESSAGE_PARAMS, ONE, NONE),
    CallOp.POST_RECV: CallSpec(
        "posts the receive of `tag` from the stage `peer` away into its output", False,
        False, Calibration(None, "posts a receive: no compute; the transfer is its SEND's"),
        Traffic.NONE, MESSAGE_PARAMS, NONE, ONE),
    CallOp.WAIT_RECV: CallSpec(
        "waits for the posted receive of `tag`", False, True,
        Calibration(None, "waits on the link, priced by the profile's link latency and "
                    "bandwidth (the cluster and node probes), not by a kernel case"),
        Traffic.NONE, MESSAGE_PARAMS, NONE, ONE),
    CallOp.GRAD_SYNC: CallSpec(
        "SYNC: its gradient summed over the DP group (op), the mean into its output",
        True, True, Calibration("grad_sync"), Traffic.DP, (Param("op", COLLECTIVE),), ONE,
        ONE, _sync_collective, per_layer=True),
    CallOp.GRAD_SCATTER: CallSpec(
        "one micro-batch's gradients reduce-scattered, this rank's mean added to its shard "
        "(set if first)", True, True, DDR, Traffic.DP, (FIRST, MICRO_BATCH_PARAM), SOME, ONE,
        per_layer=True),
    CallOp.GLOBAL_NORM: CallSpec(
        "NORM: the world's gradient norm, the clip coefficient, fp16's overflow check and "
        "unscaling; with layers, the commit rule's decision", False, True, DDR,
        Traffic.WORLD, (Param("clip", CLIP), Param("layers", STAGE_LAYERS, required=False),
                        LOSS_SCALE, Param("skip", NORM_SKIP, required=False)),
        Arity(0, None), Arity(0, None), _norm_rule),
    CallOp.TIE_SUM: CallSpec(
        "TIE: every copy of a tied weight's gradient becomes the sum over the tie stages "
        "(copies of some rows: `rows` of the weight's `vocab` rows)",
        False, True, DDR, Traffic.TIE, (Param("stages", TIE_STAGES), Param("weight", WEIGHT),
                                        Param("rows", ROW_LIST, required=False),
                                        Param("vocab", VOCAB, required=False)),
        SOME, SOME, _tie_rule, per_layer=True),
    CallOp.ADAMW: CallSpec(
        "UPD: AdamW on the layer's master, m and v (speculative: after copying them to "
        "undo.L, and taking the layer's share of the norm)", False, True,
        Calibration("adamw"), Traffic.NONE,
        (Param("zero", ZERO), Param("speculative", ON, required=False), LOSS_SCALE,
         Param("skip", SKIP, required=False)), ONE, Arity(3, 6), _update_rule,
        per_layer=True),
    CallOp.REDO_UPDATE: CallSpec(
        "a rolled-back step's master, m and v back from undo.L, then the clipped update",
        False, False, Calibration(None, "runs only on a rolled-back step, which the "
                                  "simulator does not model (NOTE [commit rule])"),
        Traffic.NONE, (Param("zero", ZERO),), Arity(4, 4), Arity(3, 3), per_layer=True),
    CallOp.PREFETCH_VIEW: CallSpec(
        "PREF: the view cast from the master, all-gathered when `gather`; `redo`: on a "
        "rolled-back step only", True, True, Calibration("prefetch_view"), Traffic.DP,
        (Param("gather", GATHER), IN_PLACE, Param("redo", ON, required=False)), ONE, SOME,
        per_layer=True),
    CallOp.GATHER_VIEW: CallSpec(
        "GATH: ZeRO-3's view all-gathered from the cast master shards for one use", True,
        True, Calibration("gather_view"), Traffic.DP, (Param("use", USE), IN_PLACE), ONE,
        SOME, _zero3_only, per_layer=True),
    # NOTE [vocabulary-parallel head] (ir/vocab.py): S and T of a stage's shard; the
    # kernels are the fused cross-entropy's, priced as the shard layer's graph
    CallOp.VOCAB_HIDDEN: CallSpec(
        "S: the last stage copies hn from out.mb and broadcasts it over the pipeline "
        "group; the others receive it into their output", True, True,
        Calibration(None, "a broadcast on the link; the root's copy at DDR bandwidth"),
        Traffic.PIPE, (MICRO_BATCH_PARAM, Param("root", ROOT), NORM_HEAD), Arity(0, 1),
        ONE, per_layer=True),
    CallOp.VOCAB_STATS: CallSpec(
        "S: the shard's log-sum-exp and target logit per token, all-gathered over the "
        "pipeline group into its output", True, True,
        Calibration("cross_entropy"),   # the shard's fused cross-entropy forward
        Traffic.PIPE, (MICRO_BATCH_PARAM, Param("root", ROOT), Param("rows", ROWS),
                       Param("stage", THIS_STAGE), NORM_HEAD), Arity(3, 3), ONE,
        per_layer=True),
    CallOp.VOCAB_LOSS: _local("T: the last stage keeps the micro-batch's loss, from the "
                              "gathered statistics", [MICRO_BATCH_PARAM, Param("root", ROOT)],
                              outputs=NONE),
    CallOp.VOCAB_GRAD: CallSpec(
        "T: the shard's weight gradient (set if first), its part of hn's gradient reduced "
        "over the pipeline group into the last stage's gin.mb", True, True,
        Calibration("cross_entropy"),   # the shard's fused cross-entropy backward
        Traffic.PIPE, (FIRST, MICRO_BATCH_PARAM, Param("root", ROOT), Param("rows", ROWS),
                       Param("value", LOSS_COTANGENT), LOSS_SCALE, NORM_HEAD), Arity(4, 4),
        Arity(1, 2), _scaled_exactly_in_fp16, per_layer=True),
    # NOTE [vocabulary-parallel embedding] (ir/vocab.py): E and G of a stage's shard; the
    # kernels are the embedding's, priced as the shard layer's graph
    CallOp.EMBED_ROWS: CallSpec(
        "E: the shard's rows of the ids in `rows` (zero rows for the others), summed over "
        "the pipeline group into stage 0's output", True, True,
        Calibration("embedding"),       # the shard's embedding lookup
        Traffic.PIPE, (MICRO_BATCH_PARAM, Param("root", FIRST_STAGE), Param("rows", ROWS)),
        Arity(2, 2), Arity(0, 1), per_layer=True),
    CallOp.EMBED_OUTPUT_GRAD: CallSpec(
        "G: stage 0 broadcasts its output (its gout.mb, the lookup's gradient) over the "
        "pipeline group; the others receive it into their output", True, True,
        Calibration(None, "a broadcast on the link: no compute"), Traffic.PIPE,
        (MICRO_BATCH_PARAM, Param("root", FIRST_STAGE)), NONE, ONE, per_layer=True),
    CallOp.EMBED_GRAD: CallSpec(
        "G: the lookup's gradient of each token whose id is in `rows` added to that row "
        "of the shard's gradient, in token order (set if first)", False, True,
        Calibration("embedding"),       # the shard's embedding backward
        Traffic.NONE, (FIRST, MICRO_BATCH_PARAM, Param("rows", ROWS)), Arity(2, 2), ONE,
        per_layer=True),
}


def is_call_op(op) -> bool:
    """Is `op` a runtime call of the grammar (else an IR op, or nothing)?"""
    return isinstance(op, str) and op in CALL_OPS


def asynchronous_ops() -> frozenset[CallOp]:
    """The calls that start a non-blocking collective (the runtime's hazard rule)."""
    return frozenset(op for op, spec in CALL_OPS.items() if spec.asynchronous)


def untraced_ops() -> frozenset[CallOp]:
    """The calls whose run time no traced row holds (NOTE [traced rows])."""
    return frozenset(op for op, spec in CALL_OPS.items() if not spec.traced)


def timed_ops() -> tuple[CallOp, ...]:
    """The calls calibration times with a case of their own (calibrate/rt_cases.py)."""
    return tuple(op for op, spec in CALL_OPS.items() if spec.calibration.case == op)


def linked_ops() -> frozenset[CallOp]:
    """The calls planned_volume counts (cluster/volume.py): messages, DP collectives and
    the world's sum; a TIE's all-reduce is not counted (Traffic.TIE)."""
    return frozenset(op for op, spec in CALL_OPS.items()
                     if spec.traffic in (Traffic.MESSAGE, Traffic.DP, Traffic.WORLD))


def registered(table: dict, where: str, ops=None) -> dict:
    """`table` (op -> what a module does for it), checked to cover exactly `ops` (every
    CallOp by default): NOTE [one table of call ops]. Raises TypeError at import naming
    the module, what is missing and what the grammar lacks."""
    wanted = set(CALL_OPS if ops is None else ops)
    missing, extra = wanted - set(table), set(table) - wanted
    if missing or extra:
        raise TypeError(f"{where} must cover the call ops of program_format/call_ops.py: "
                        f"missing {sorted(map(str, missing))}, not in the grammar "
                        f"{sorted(map(str, extra))}")
    return {CallOp(op): handler for op, handler in table.items()}


# ---- checking a call against its schema --------------------------------------------------

def check_call(call, context: CallContext, path: str) -> None:
    """A runtime call's params and operand counts against CALL_OPS[call.op]: each param
    known, present when required and in its domain, the counts in range, the cross-field
    rule kept. Raises FieldError naming the field (`path.params.x`) and what it must be."""
    spec = CALL_OPS[call.op]
    params, known = dict(call.params), {p.name for p in spec.params}
    if call.layer is None and spec.per_layer or \
            call.layer is not None and call.layer not in context.stage_layers:
        raise FieldError(at(path, "layer"), f"must be a layer of stage {context.stage} "
                         f"({list(context.stage_layers)}), got {call.layer}")
    if len(params) != len(call.params):
        raise FieldError(at(path, "params"), "names a param twice")
    for key in params:
        if key not in known:
            raise FieldError(at(at(path, "params"), key), f"is not a param of {call.op} "
                             f"(it takes {', '.join(sorted(known)) or 'none'})")
    for p in spec.params:
        if p.name in params:
            p.domain.check(params[p.name], context, at(at(path, "params"), p.name))
        elif p.required:
            raise FieldError(at(at(path, "params"), p.name), f"is missing ({call.op} needs "
                             f"it: {p.domain.what})")
    for key, arity in (("inputs", spec.inputs), ("outputs", spec.outputs)):
        count = len(getattr(call, key))
        if count < arity.low or arity.high is not None and count > arity.high:
            raise FieldError(at(path, key), f"must be {arity} operands of {call.op}, "
                             f"got {count}")
    problem = spec.relation and spec.relation(call, context)
    if problem:
        raise FieldError(path, f"({call.op}): {problem}")


def describe(op: CallOp) -> str:
    """One line of an op's schema, for people: `grad_sync[op] 1 -> 1`."""
    spec = CALL_OPS[op]
    params = " ".join(p.name if p.required else f"{p.name}?" for p in spec.params)
    return f"{op}[{params}] {spec.inputs} -> {spec.outputs}"
