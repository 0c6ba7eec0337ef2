"""What the vocabulary-parallel head's calls do to a rank's arena (NOTE [vocabulary-parallel
head], ir/vocab.py): vocab_hidden (hn broadcast from the last stage), vocab_stats (a
shard's log-sum-exp and target logits, all-gathered), vocab_loss (the loss) and
vocab_grad (the shard's gradient, its part of hn's gradient reduced into the last stage).
The shard's kernels are the fused LM-head cross-entropy's (ratrain.kernels), so S and
T run the unsplit head's work on V/P rows. Part of rt/calls.py's CALLS.
"""
from __future__ import annotations

import numpy as np

from ratrain import kernels
from ratrain.ir.split_backward import CE_CHUNK
from ratrain.rt.threads import kernel_threads


def _params(call) -> dict:
    return dict(call.params)


def shard_targets(targets: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Targets as rows of the shard [lo, hi): t - lo inside it, hi - lo (a row the kernel
    never matches, so no one-hot there) outside; ignored (< 0) targets stay ignored."""
    local = targets.reshape(-1).astype(np.int32) - np.int32(lo)
    outside = (targets.reshape(-1) >= hi) | (local < 0)
    local[outside] = hi - lo
    local[targets.reshape(-1) < 0] = -1
    return local


def _rows(x: np.ndarray) -> np.ndarray:
    return x.reshape(-1, x.shape[-1])


def native_rows(x: np.ndarray) -> np.ndarray:
    """`x` 2-D as the native kernels take it: bf16 as the uint16 of its bits (numpy has
    no bfloat16; the arena's bf16 slots are ml_dtypes arrays)."""
    x = _rows(x)
    return x.view(np.uint16) if x.dtype.name == "bfloat16" else x


def _vocab_hidden(t, st, call) -> None:
    """The last stage copies hn from out.mb and broadcasts it; the others receive it
    (non-blocking: vocab_stats waits for it by the hazard rule)."""
    hn = st.view(call.outputs[0])
    if call.inputs:
        hn[...] = st.view(call.inputs[0])
    t.pipe_broadcast(st, call, hn, _params(call)["root"])


def target_logits(hn: np.ndarray, w: np.ndarray, local: np.ndarray) -> np.ndarray:
    """Per token the logit of its target where the shard holds it, else 0 (float32)."""
    out = np.zeros(local.size, np.float32)
    inside = np.flatnonzero((local >= 0) & (local < w.shape[0]))
    out[inside] = np.einsum("nc,nc->n", _rows(hn)[inside].astype(np.float32),
                            w[local[inside]].astype(np.float32))
    return out


# NOTE [NormHead shards]: Baichuan2's NormHead divides each LM-head row by its L2 norm
# (models/layers.normalize_rows), a function of the row alone, so a shard normalises its
# own rows: its calls run the fused kernels on wn = w r (r = (|w|^2 + 1e-24)^-1/2 per row,
# in float32, rounded to the view's format as the traced graph's normalised weight is),
# and the shard's weight gradient is the normalisation's backward of the kernel's dwn:
# dw = r (dwn - wn (dwn . wn)) per row.
def _head_rows(w: np.ndarray, norm_head: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """(the rows the head multiplies by, 1/|row| per row or None): NormHead's wn."""
    if not norm_head:
        return w, None
    w32 = w.astype(np.float32)
    r = 1.0 / np.sqrt(np.einsum("vc,vc->v", w32, w32) + np.float32(1e-24))
    return (w32 * r[:, None]).astype(w.dtype), r.astype(np.float32)


def _vocab_stats(t, st, call) -> None:
    """The shard's log-sum-exp and target logit per token, into this stage's row of the
    statistics, all-gathered over the pipeline group (non-blocking)."""
    hn, w, targets = (st.view(s) for s in call.inputs)
    params = _params(call)
    w, _ = _head_rows(w, bool(params.get("norm_head")))
    local = shard_targets(targets, *params["rows"])
    _, lse = kernels.cross_entropy_fwd(native_rows(hn), native_rows(w), local,
                                       chunk=CE_CHUNK, threads=kernel_threads())
    mine = np.stack([lse, target_logits(hn, w, local)]).astype(np.float32)
    t.pipe_allgather(st, call, mine, st.view(call.outputs[0]))


def combined_lse(stats: np.ndarray) -> np.ndarray:
    """log sum_s exp(lse_s) per token, in float64 in stage order (the same bits on every
    stage), rounded to float32 as the fused kernel's lse."""
    lse = stats[:, 0, :].astype(np.float64)
    top = lse.max(axis=0)
    return (top + np.log(np.exp(lse - top).sum(axis=0))).astype(np.float32)


def _vocab_loss(t, st, call) -> None:
    """The last stage records the micro-batch's loss: mean(lse - target logit)."""
    if st.stage != _params(call)["root"]:
        return
    stats = st.view(call.inputs[0])
    target = stats[:, 1, :].astype(np.float64).sum(axis=0)
    st.losses.append(float(np.mean(combined_lse(stats).astype(np.float64) - target)))


def _vocab_grad(t, st, call) -> None:
    """See NOTE [vocabulary-parallel head]: the shard's weight gradient (set by micro-batch
    0's, then added) and its part of hn's gradient, summed over the pipeline group into the
    last stage's gin.mb."""
    hn, w, targets, stats = (st.view(s) for s in call.inputs)
    grad, *gin = (st.view(s) for s in call.outputs)
    params = _params(call)
    root = st.stage == params["root"]
    lse = combined_lse(stats)
    scale = st.scaler.scale if params.get("loss_scale") else 1.0
    per_token = np.float32(params["value"] * scale / lse.size)
    if params["first"]:
        grad[...] = 0
    w, r = _head_rows(w, bool(params.get("norm_head")))  # NOTE [NormHead shards]
    dw = grad if r is None else np.zeros(grad.shape, np.float32)
    dh, _ = kernels.cross_entropy_bwd(native_rows(hn), native_rows(w),
                                      shard_targets(targets, *params["rows"]), lse,
                                      per_token, dw=dw, chunk=CE_CHUNK, threads=kernel_threads())
    if r is not None:
        wn = w.astype(np.float32)
        grad += r[:, None] * (dw - wn * np.einsum("vc,vc->v", dw, wn)[:, None])
    dh = dh.view(hn.dtype).reshape(hn.shape)  # bf16: the kernel's uint16 bits back
    t.pipe_reduce(st, call, dh.astype(np.float32), params["root"], gin[0] if root else None)


def tie_sum_rows(t, st, call, copies, rows) -> None:
    """NOTE [tied weights] with a vocabulary-parallel head: the copies hold rows [lo, hi)
    of the weight (the embedding all of them, a shard its own); each rank adds its
    copies into the whole weight's rows (zero elsewhere), the tie stages sum that, and
    each copy takes its rows back. Adding zeros is exact, so every row is the sum of its
    two copies, as the unsplit program's TIE makes it."""
    total = np.zeros((_params(call)["vocab"], copies[0].shape[-1]), np.float32)
    for copy, (lo, hi) in zip(copies, rows):
        total[lo:hi] += copy
    if len(_params(call)["stages"]) > 1:
        t.tie_sum(st, call, total)
    for copy, (lo, hi) in zip(copies, rows):
        copy[...] = total[lo:hi]


VOCAB_CALLS = {"vocab_hidden": _vocab_hidden, "vocab_stats": _vocab_stats,
               "vocab_loss": _vocab_loss, "vocab_grad": _vocab_grad}
