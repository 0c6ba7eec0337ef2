"""What every lowered call does to one rank's arena: the single definition of the call
semantics, shared by the reference executor (rt/reference.py, all ranks in one process)
and the MPI runtime (rt/executor.py). A `Transport` supplies what crosses ranks (data rows,
pipeline messages, DP and world collectives); everything else here is local numpy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from ratrain import kernels
import ratrain.ir.lax_rules  # noqa: F401  (registers the lax primitives' rules: slice, ...)
from ratrain.ir.buffers import is_grad_shard
from ratrain.ir.rules import lookup_rule
from ratrain.ir.vocab import param_value
from ratrain.optim import AdamW, LossScaler
from ratrain.program_format.call_ops import CallOp, registered
from ratrain.program_format.lowered import rollback_only
from ratrain.program_format.shards import shard_bounds
from ratrain.rt.embed_calls import EMBED_CALLS
from ratrain.rt.vocab_calls import VOCAB_CALLS, tie_sum_rows


@dataclass
class RankState:
    rank: int
    stage: int
    replica: int
    arena: np.ndarray                   # uint8, exactly the planned arena
    offsets: dict                       # buffer name -> (arena offset, nbytes)
    decay: dict = field(default_factory=dict)   # layer -> [lo, hi, decays] runs of its shard
    losses: list = field(default_factory=list)  # per micro-batch loss of this step
    clip_coef: float = 1.0              # from the step's global norm
    scaler: LossScaler = field(default_factory=LossScaler)  # the same on every rank
    grad_norm: float | None = None      # the step's global norm (unscaled), if computed
    overflow: bool = False              # the step found a non-finite gradient: no update
    skipped_steps: int = 0              # steps skipped so far (AdamW does not count them)
    norm_shares: dict = field(default_factory=dict)  # layer -> its UPD's sums of squares
                                        # (None: non-finite), NOTE [commit rule]
    rolled_back: bool = False           # the step's NORM redoes the speculative updates

    def view(self, slot) -> np.ndarray:
        base, nbytes = self.offsets[slot.buffer]
        if slot.offset + slot.nbytes > nbytes:
            raise IndexError(f"rank {self.rank}: {slot} runs past its buffer ({nbytes} bytes)")
        return np.ndarray(slot.shape, slot.dtype, buffer=self.arena, offset=base + slot.offset)

    def byte_range(self, slot) -> tuple[int, int]:
        """[lo, hi) of the arena bytes a slot covers."""
        lo = self.offsets[slot.buffer][0] + slot.offset
        return lo, lo + slot.nbytes


Finish = Callable[[np.ndarray], None]


class Transport(Protocol):
    """Everything a call needs from outside its rank. A collective calls `finish` with this
    rank's part of the result, at once or (non-blocking) before anything reads its target;
    dp_sum may sum in place into `value` (an all-reduce of a gradient buffer)."""
    options: object                     # the program's CompileOptions
    step: int                           # 1-based step being run
    optimizer: AdamW                    # hyper-parameters of this step

    def rows(self, st: RankState, micro_batch: int) -> np.ndarray: ...
    def send(self, st: RankState, call, message: np.ndarray) -> None: ...
    def post_receive(self, st: RankState, call, target: np.ndarray) -> None: ...
    def receive(self, st: RankState, call, target: np.ndarray) -> None: ...
    def dp_sum(self, st: RankState, call, value, scatter: bool, finish: Finish) -> None: ...
    def dp_gather(self, st: RankState, call, shard, finish: Finish,
                  into: np.ndarray | None = None) -> None: ...
    def world_sum(self, st: RankState, call, value: float) -> float: ...
    def tie_sum(self, st: RankState, call, value: np.ndarray) -> None: ...
    # over the replica's pipeline group (NOTE [vocabulary-parallel head]), non-blocking;
    # a reduce's target (`into`, on the root) is the call's last output:
    def pipe_broadcast(self, st: RankState, call, value, root: int) -> None: ...
    def pipe_allgather(self, st: RankState, call, part, out: np.ndarray) -> None: ...
    def pipe_reduce(self, st: RankState, call, value, root: int, into) -> None: ...


# --- set-up: master params, optimizer state and views into the arena --------------------

def layer_arrays(program, layer: int, params: dict):
    """A layer's parameters flattened in order, and the weight-decay mask (ndim >= 2)."""
    names = [name for name, _ in program.layer_params(layer)]
    values = [param_value(params, n) for n in names]  # a shard's name: its rows
    flat = np.concatenate([np.asarray(v, np.float32).ravel() for v in values])
    decay = np.concatenate([np.full(np.size(v), float(np.ndim(v) >= 2), np.float32)
                            for v in values])
    return flat, decay


def owned_shard(options, n: int, replica: int) -> tuple[int, int]:
    return (0, n) if options.zero == 0 else shard_bounds(n, options.dp, replica)


def init_layer(program, st: RankState, layer: int, params: dict, moments=None) -> None:
    """Master (shard), Adam moments (zero, or this rank's shard of `moments`: name ->
    (exp_avg, exp_avg_sq)), decay mask and the full view of one layer."""
    flat, decay = layer_arrays(program, layer, params)
    master, m, v, _, shard = program.state_slots(layer)
    lo, hi = owned_shard(program.options, flat.size, st.replica)
    for slot, values in ((master, flat), (m, _layer_moment(program, layer, moments, 0)),
                         (v, _layer_moment(program, layer, moments, 1))):
        st.view(slot)[:] = 0
        if values is not None:
            st.view(slot)[:hi - lo] = values[lo:hi]
    mask = np.zeros(shard, np.float32)
    mask[:hi - lo] = decay[lo:hi]
    st.decay[layer] = decay_runs(mask)  # once: AdamW runs every step
    if program.options.zero != 3:  # ZeRO-3 gathers a view before each use instead
        write_view(st, program.view_slots(layer), flat)


def _layer_moment(program, layer: int, moments, which: int):
    if moments is None:
        return None
    return layer_arrays(program, layer, {n: pair[which] for n, pair in moments.items()})[0]


def unflatten_layer(program, layer: int, flat) -> dict:
    """HF name -> array of one layer's parameters from their flat concatenation."""
    out, at = {}, 0
    for name, shape in program.layer_params(layer):
        size = math.prod(shape)
        out[name] = np.asarray(flat[at:at + size]).reshape(shape).copy()
        at += size
    return out


def write_view(st: RankState, slots, flat) -> None:
    """The flat parameters into the view slots, in order; nothing to do for a gather that
    received in place (NOTE [views gathered in place], passes/layer_buffers.py)."""
    at = 0
    for slot in slots:
        n, view = math.prod(slot.shape), st.view(slot)
        if not (at == 0 and np.shares_memory(view, flat)):
            view[...] = flat[at:at + n].reshape(slot.shape)
        at += n


# --- local calls -------------------------------------------------------------------------

def _params(call) -> dict:
    return dict(call.params)


def _load_ids(t: Transport, st: RankState, call) -> None:
    st.view(call.outputs[0])[...] = t.rows(st, _params(call)["micro_batch"])[:, :-1]


def _load_targets(t: Transport, st: RankState, call) -> None:
    st.view(call.outputs[0])[...] = t.rows(st, _params(call)["micro_batch"])[:, 1:]


def _record_loss(t: Transport, st: RankState, call) -> None:
    st.losses.append(float(st.view(call.inputs[0])))


def _fill(t: Transport, st: RankState, call) -> None:
    """A constant; the loss cotangent of fp16 programs (loss_scale) times the loss scale."""
    params = _params(call)
    scale = st.scaler.scale if params.get("loss_scale") else 1.0
    st.view(call.outputs[0])[...] = params["value"] * scale


def _copy(t: Transport, st: RankState, call) -> None:
    st.view(call.outputs[0])[...] = st.view(call.inputs[0])


def _accumulate_grad(t: Transport, st: RankState, call) -> None:
    target, value = st.view(call.outputs[0]), st.view(call.inputs[0])
    if _params(call)["first"]:
        target[...] = value
    else:
        target += value


def _rule(op: str):
    """The op's rule: the lax primitives' numpy rules are registered when this module
    loads (ratrain.ir.lax_rules); the coarse ops register theirs when ratrain.ops is
    imported (JAX), which only coarse calls without a native template need."""
    rule = lookup_rule(op)
    if rule is None:
        import ratrain.ops  # noqa: F401
        rule = lookup_rule(op)
    if rule is None:
        raise NotImplementedError(f"no rule for op '{op}'")
    return rule


def _compute(t: Transport, st: RankState, call) -> None:
    """Any IR op: its rule's numpy reference, outputs written into their slots."""
    args = [st.view(x) if hasattr(x, "buffer") else np.asarray(x.value, x.dtype)
            for x in call.inputs]
    params = _params(call)
    into, mode = params.pop("grad_into", (None, None))  # NOTE [fused gradient accumulation]
    out = _rule(call.op).fwd(np, *args, **params)
    for k, (slot, value) in enumerate(zip(call.outputs, out if isinstance(out, (tuple, list))
                                          else (out,))):
        if k == into and mode == "add":
            st.view(slot)[...] += value
        else:
            st.view(slot)[...] = value


# --- pipeline messages ---------------------------------------------------------------------

def _send(t: Transport, st: RankState, call) -> None:
    t.send(st, call, st.view(call.inputs[0]))


def _post_recv(t: Transport, st: RankState, call) -> None:
    t.post_receive(st, call, st.view(call.outputs[0]))


def _wait_recv(t: Transport, st: RankState, call) -> None:
    t.receive(st, call, st.view(call.outputs[0]))


# --- gradients, norm, update, prefetch ------------------------------------------------------

def _dp_mean_into(dp: int, out: np.ndarray) -> Finish:
    """finish(): out = this rank's part of the DP sum / dp, zero past its end (padding)."""
    def finish(part: np.ndarray) -> None:
        mean = part / np.float32(dp)
        out[...] = 0
        out[:mean.size] = mean
    return finish


def _grad_sync(t: Transport, st: RankState, call) -> None:
    op = _params(call)["op"]
    if op == "wait":  # reduce-scattered inside every B already
        return
    t.dp_sum(st, call, st.view(call.inputs[0]), op == "reduce_scatter",
             _dp_mean_into(t.options.dp, st.view(call.outputs[0])))


def _grad_scatter(t: Transport, st: RankState, call) -> None:
    """Reduce-scatter one micro-batch's gradient and add this rank's shard (NOTE
    [gradient accumulation] in lower.py)."""
    flat = np.concatenate([st.view(s).astype(np.float32).ravel() for s in call.inputs])
    shard, first = st.view(call.outputs[0]), _params(call)["first"]

    def finish(part: np.ndarray) -> None:
        if first:
            shard[...] = 0
        shard[:part.size] += part / np.float32(t.options.dp)
    t.dp_sum(st, call, flat, True, finish)


def _owned(options, st: RankState, slot, skip=()) -> list[np.ndarray]:
    """The parts of a gradient this rank counts in the global norm: its DP share of the
    layer's flat gradient (no DP double count), less the flat element ranges `skip`
    [(lo, hi, n)] of the layer's n parameters (a tied weight's second copy, NOTE [tied
    weights])."""
    grad = st.view(slot)
    if is_grad_shard(slot.buffer):  # ZeRO-2: the shard is this rank's share
        if not skip:
            return [grad]
        lo, hi = shard_bounds(skip[0][2], options.dp, st.replica)
        base = lo                         # grad[k] is flat element lo + k
    else:
        (lo, hi), base = shard_bounds(grad.size, options.dp, st.replica), 0
    parts, at = [], lo
    for a, b, _ in sorted(skip):
        a, b = max(a, lo), min(b, hi)
        if a < b:
            parts.append(grad[at - base:a - base])
            at = b
    parts.append(grad[at - base:hi - base])
    return parts


def _global_norm(t: Transport, st: RankState, call) -> None:
    """The world's gradient norm, hence the clip coefficient; with loss_scale (fp16) the
    norm is that of the unscaled gradients, which are then unscaled in place, and a
    non-finite gradient anywhere skips the step on every rank (NOTE [overflow flag]).
    With `layers` the shares come from the speculative UPDs (NOTE [commit rule])."""
    params = _params(call)
    if "layers" in params:
        _commit_or_roll_back(t, st, call, params)
        return
    scaled = bool(params.get("loss_scale"))
    inverse = st.scaler.inverse() if scaled else np.float32(1)
    skips = {}
    for index, lo, hi, n in params.get("skip", ()):
        skips.setdefault(index, []).append((lo, hi, n))
    owned = [part for i, s in enumerate(call.inputs)
             for part in _owned(t.options, st, s, skips.get(i, ()))]
    finite = all(bool(np.isfinite(g).all()) for g in owned) if scaled else True
    squares = _sum_of_squares(owned, inverse) if finite else math.inf
    # nothing is written before the world sum: the reference executor reruns the call
    # until every rank has contributed
    total = math.sqrt(t.world_sum(st, call, squares))
    st.grad_norm, clip = total, params["clip"]
    st.clip_coef = 1.0 if clip is None else min(1.0, clip / (total + 1e-6))
    if scaled:
        _unscale_or_skip(st, call.inputs, inverse, overflow=not math.isfinite(total))


# NOTE [overflow flag]: each rank checks the (scaled) gradients it owns for inf/nan, as
# GradScaler does before unscaling, and sends +inf instead of its sum of squares if it
# found one. The world sum is then non-finite exactly when some rank found one: squares
# of float32 values summed in float64 cannot overflow, and +inf or nan absorb every sum.
# So one scalar all-reduce gives both the norm and the flag, identical on every rank.
# (Below scale 1 a gradient that only unscaling makes infinite counts as an overflow too,
# where GradScaler would step with it.)


def _sum_of_squares(grads, inverse: np.float32) -> float:
    """Of the unscaled gradients, in float64 (the float32 products unscale_ would store)."""
    return sum(_squares(grads, inverse))


def _squares(grads, inverse: np.float32) -> list[float]:
    """Each gradient part's sum of squares, unscaled, in the order _sum_of_squares adds."""
    return [float(np.sum(np.square(g if inverse == 1 else g * inverse, dtype=np.float64)))
            for g in grads]


def _commit_or_roll_back(t: Transport, st: RankState, call, params: dict) -> None:
    """See NOTE [commit rule]: _global_norm's scalars from the UPDs' shares, summed in the
    same order (stage layers, then parts); the step rolls back if clipped or overflowing.
    The gradients are unscaled already (by the speculative UPDs)."""
    shares = [st.norm_shares.get(layer) for layer in params["layers"]]
    scaled = bool(params.get("loss_scale"))
    finite = all(share is not None for share in shares)
    squares = sum(x for share in shares for x in share) if finite else math.inf
    # nothing is written before the world sum (the reference executor reruns the call)
    total = math.sqrt(t.world_sum(st, call, squares))
    st.grad_norm, clip = total, params["clip"]
    st.clip_coef = 1.0 if clip is None else min(1.0, clip / (total + 1e-6))
    if scaled:
        st.overflow = not math.isfinite(total)
        if st.overflow:
            st.skipped_steps += 1
        st.scaler.update(st.overflow)
    st.rolled_back = st.overflow or st.clip_coef != 1.0


def _unscale_or_skip(st: RankState, grads, inverse: np.float32, overflow: bool) -> None:
    """Unscale the gradients once (GradScaler.unscale_), or mark the step skipped; then
    the scale backs off or grows."""
    st.overflow = overflow
    if overflow:
        st.skipped_steps += 1
    elif inverse != 1:
        for s in grads:
            st.view(s)[...] *= inverse
    st.scaler.update(overflow)


def _tie_sum(t: Transport, st: RankState, call) -> None:
    """See NOTE [tied weights]: every copy of a tied weight's gradient on this rank becomes the
    sum of all copies: those here, and (blocking) those of the other tie stages."""
    copies = [st.view(s) for s in call.inputs]  # the outputs are the same slots
    if "rows" in _params(call):
        return tie_sum_rows(t, st, call, copies, _params(call)["rows"])
    # one copy here is summed in place (no second vocabulary-sized array); nothing is
    # written before the cross-stage sum, which the reference executor may rerun
    total = copies[0] if len(copies) == 1 else np.sum(copies, axis=0, dtype=np.float32)
    if len(_params(call)["stages"]) > 1:
        t.tie_sum(st, call, total)
    for copy in copies:
        if copy is not total:
            copy[...] = total


def _adamw(t: Transport, st: RankState, call) -> None:
    """AdamW on the layer's (shard of) master params, unless the step overflowed: then
    nothing changes and AdamW's own step count (bias correction) does not advance, as
    when GradScaler skips optimizer.step(). A speculative one runs before the NORM
    (NOTE [commit rule])."""
    params = _params(call)
    if params.get("speculative"):
        _speculative_adamw(t, st, call, params)
    elif not st.overflow:
        _apply_adamw(t, st, call.layer, call.outputs, call.inputs[0], params["zero"],
                     st.clip_coef)


def _speculative_adamw(t: Transport, st: RankState, call, params: dict) -> None:
    """NOTE [commit rule] (passes/insert_update.py): the layer's share of the global norm
    (and, fp16, its finite check and in-place unscaling, as _global_norm would do them),
    a copy of master, m and v into undo.L, then AdamW with clip coefficient 1."""
    grad_slot, layer = call.inputs[0], call.layer
    scaled = bool(params.get("loss_scale"))
    inverse = st.scaler.inverse() if scaled else np.float32(1)
    owned = _owned(t.options, st, grad_slot, params.get("skip", ()))
    finite = all(bool(np.isfinite(g).all()) for g in owned) if scaled else True
    st.norm_shares[layer] = _squares(owned, inverse) if finite else None
    if scaled and inverse != 1:
        st.view(grad_slot)[...] *= inverse
    for state, undo in zip(call.outputs[:3], call.outputs[3:]):
        st.view(undo)[...] = st.view(state)
    _apply_adamw(t, st, layer, call.outputs[:3], grad_slot, params["zero"], 1.0)


def _redo_update(t: Transport, st: RankState, call) -> None:
    """See NOTE [commit rule]: on a rolled-back step, master, m and v back from undo.L, then
    after-norm's update (none if the step overflowed); nothing on a committed step."""
    if not st.rolled_back:
        return
    grad_slot, *undo = call.inputs
    for state, copy in zip(call.outputs, undo):
        st.view(state)[...] = st.view(copy)
    if not st.overflow:
        _apply_adamw(t, st, call.layer, call.outputs, grad_slot, _params(call)["zero"],
                     st.clip_coef)


def _apply_adamw(t: Transport, st: RankState, layer: int, outputs, grad_slot, zero: int,
                 clip_coef: float) -> None:
    """The native AdamW step on master, m, v (`outputs`) from the gradient times clip_coef."""
    master, m, v = (st.view(s) for s in outputs)
    grad = st.view(grad_slot)
    if zero == 1:
        lo, hi = shard_bounds(grad.size, t.options.dp, st.replica)
        grad = np.concatenate([grad[lo:hi], np.zeros(master.size - (hi - lo), np.float32)])
    step, opt = t.step - st.skipped_steps, t.optimizer
    if clip_coef != 1.0:
        grad = grad * np.float32(clip_coef)
    for lo, hi, decays in st.decay[layer]:  # the native kernel's weight decay is a scalar
        kernels.adamw_step(master[lo:hi], m[lo:hi], v[lo:hi], grad[lo:hi], lr=opt.lr,
                           beta1=opt.beta1, beta2=opt.beta2, eps=opt.eps,
                           weight_decay=opt.weight_decay if decays else 0.0, step=step)


def decay_runs(mask: np.ndarray) -> list[tuple[int, int, bool]]:
    """[lo, hi) runs of equal weight-decay mask values (parameters are contiguous)."""
    edges = [0, *(np.flatnonzero(np.diff(mask)) + 1).tolist(), mask.size]
    return [(lo, hi, bool(mask[lo])) for lo, hi in zip(edges, edges[1:]) if hi > lo]


def _prefetch_view(t: Transport, st: RankState, call) -> None:
    """The view from the master (cast; gathered under ZeRO); `redo`: only on a rolled
    back step (NOTE [commit rule])."""
    if _params(call).get("redo") and not st.rolled_back:
        return
    if _params(call)["gather"]:
        _start_gather(t, st, call)
    else:
        write_view(st, call.outputs, st.view(call.inputs[0]))


def _gather_view(t: Transport, st: RankState, call) -> None:
    """See NOTE [ZeRO-3 lifecycle]: all-gather the cast master shards into a view slot; the
    view is written when the gather completes (the hazard rule: before its first use)."""
    _start_gather(t, st, call)


def _start_gather(t: Transport, st: RankState, call) -> None:
    """All-gather the master shard cast to the view's dtype into the view slots, or
    straight into the one flat slot when `in_place` (NOTE [views gathered in place])."""
    # cast the shard first: the gather then moves view-dtype bytes (half of fp32 in
    # fp16 programs), and rounding per element commutes with concatenation
    shard = st.view(call.inputs[0]).astype(call.outputs[0].dtype)
    into = st.view(call.outputs[0]) if _params(call).get("in_place") else None
    t.dp_gather(st, call, shard, lambda flat: write_view(st, call.outputs, flat), into)


# NOTE [one table of call ops] (program_format/call_ops.py): what each op does, checked at
# import to cover the grammar exactly
CALLS = registered({
    CallOp.LOAD_IDS: _load_ids, CallOp.LOAD_TARGETS: _load_targets,
    CallOp.RECORD_LOSS: _record_loss, CallOp.FILL: _fill, CallOp.COPY: _copy,
    CallOp.ACCUMULATE_GRAD: _accumulate_grad, CallOp.SEND: _send,
    CallOp.POST_RECV: _post_recv, CallOp.WAIT_RECV: _wait_recv,
    CallOp.GRAD_SYNC: _grad_sync, CallOp.GRAD_SCATTER: _grad_scatter,
    CallOp.GLOBAL_NORM: _global_norm, CallOp.TIE_SUM: _tie_sum, CallOp.ADAMW: _adamw,
    CallOp.REDO_UPDATE: _redo_update, CallOp.PREFETCH_VIEW: _prefetch_view,
    CallOp.GATHER_VIEW: _gather_view,
    **VOCAB_CALLS,  # NOTE [vocabulary-parallel head]
    **EMBED_CALLS,  # NOTE [vocabulary-parallel embedding]
}, "rt/calls.py CALLS")


def skips(st: RankState, call) -> bool:
    """A rollback-only call on a committed step: a no-op that must not even wait for the
    collectives in flight on its buffers (the views' all-gathers)."""
    return not st.rolled_back and rollback_only(call)


def run_call(transport: Transport, st: RankState, call) -> None:
    """Run one lowered call on rank `st` (runtime actions by table, IR ops by rule)."""
    CALLS.get(call.op, _compute)(transport, st, call)
