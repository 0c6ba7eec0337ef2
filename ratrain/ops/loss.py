"""Cross-entropy fused with the LM head: mean over tokens of lse(h w^T) - logit[target].

h [B,T,H], w [V,H] (HF lm_head layout), targets int32 [B,T] (no cotangent). Forward
returns the scalar fp32 loss and the hidden per-token lse [B,T]; backward recomputes the
logits (the native kernel chunks them over the vocabulary; this reference holds them).
"""
from __future__ import annotations

from ratrain.ir.split_backward import head_logits, logits_gradient
from ratrain.ops._common import rows
from ratrain.ops.define import define_op


def _target_logit(xp, logits, targets):
    return xp.take_along_axis(logits, targets.reshape(-1, 1), axis=1)[:, 0]


def _cross_entropy_fwd(xp, h, w, targets):
    logits = head_logits(xp, h, w)
    m = xp.max(logits, axis=-1, keepdims=True)
    lse = m[:, 0] + xp.log(xp.sum(xp.exp(logits - m), axis=-1))
    loss = xp.mean(lse - _target_logit(xp, logits, targets))
    return loss, lse.reshape(targets.shape)


def _cross_entropy_bwd(xp, h, w, targets, lse, dloss):
    dlogits = logits_gradient(xp, h, w, targets, lse, dloss)
    dh = (dlogits @ w.astype(dlogits.dtype)).reshape(h.shape)
    dw = dlogits.T @ h.reshape(-1, h.shape[-1]).astype(dlogits.dtype)
    return dh.astype(h.dtype), dw.astype(w.dtype)


cross_entropy = define_op(
    "cross_entropy", fwd=_cross_entropy_fwd, bwd=_cross_entropy_bwd, n_visible=1,
    residuals=lambda i, o: (i[0], i[1], i[2], o[1]), nondiff=(2,),
    flops=lambda ins, outs, **p: 2 * rows(ins[0]) * ins[1][0] * ins[1][1],
    bwd_flops=lambda ins, outs, **p: 6 * rows(ins[0]) * ins[1][0] * ins[1][1],
    kernel="cross_entropy")
cross_entropy.__doc__ = "Mean next-token loss of hidden h[B,T,H] under head w[V,H]."
