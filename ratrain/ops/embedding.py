"""Token embedding lookup: embedding(w, ids) = w[ids]; backward scatter-adds into dw.

ids int32 [B, T] get no cotangent. The vocabulary size is a param (`vocab`), so backward
saves only the ids and still knows the shape of dw.
"""
from __future__ import annotations

import math

import numpy as np

from ratrain.ops.define import define_op


def _scatter_add_rows(xp, ids, rows, n_rows):
    """out[n_rows, H] with out[ids[k]] += rows[k]; the one numpy/jax difference in ops."""
    out = xp.zeros((n_rows, rows.shape[-1]), dtype=rows.dtype)
    if xp is np:
        np.add.at(out, ids, rows)
        return out
    return out.at[ids].add(rows)


def _embedding_fwd(xp, w, ids, *, vocab):
    return xp.take(w, ids, axis=0)


def _embedding_bwd(xp, ids, dy, *, vocab):
    flat_ids = ids.reshape(-1)
    return (_scatter_add_rows(xp, flat_ids, dy.reshape(flat_ids.shape[0], -1), vocab),)


_embedding = define_op("embedding", fwd=_embedding_fwd, bwd=_embedding_bwd,
                       residuals=lambda i, o: (i[1],), nondiff=(1,),
                       flops=lambda ins, outs, **p: 0,
                       bwd_flops=lambda ins, outs, **p: math.prod(outs[0]),
                       kernel="embedding")


def embedding(w, ids):
    """w[V, H] gathered at int32 ids[B, T] -> [B, T, H]."""
    return _embedding(w, ids, vocab=int(w.shape[0]))
