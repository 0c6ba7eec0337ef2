"""What the vocabulary-parallel embedding's calls do to a rank's arena (NOTE
[vocabulary-parallel embedding], ir/vocab.py): embed_rows (a shard's lookup, reduced
into stage 0's in.mb), embed_output_grad (stage 0's gout.mb broadcast) and embed_grad (the
shard's rows' gradient). The kernels are the embedding's (ratrain.kernels) on the tokens
whose ids the shard holds, so E and G run the unsplit embedding's work on V/P rows; bf16
arrays go to them as their uint16 bits, as the head's do. Part of rt/calls.py's CALLS.
"""
from __future__ import annotations

import numpy as np

from ratrain import kernels
from ratrain.rt.threads import kernel_threads
from ratrain.rt.vocab_calls import native_rows


def shard_tokens(ids: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions of the tokens whose id is in [lo, hi), those ids as the shard's rows)."""
    flat = ids.reshape(-1)
    inside = np.flatnonzero((flat >= lo) & (flat < hi))
    return inside, (flat[inside] - lo).astype(np.int32)


def _embed_rows(t, st, call) -> None:
    """The shard's rows of the micro-batch's ids in [lo, hi), zero rows for the others
    (float32: the reduce sums in it), summed over the pipeline group into stage 0's
    output (non-blocking: its F waits for it by the hazard rule). Every id is in one
    shard, so the sum adds zeros to its row: exact."""
    w, ids = (st.view(s) for s in call.inputs)
    params = dict(call.params)
    inside, rows = shard_tokens(ids, *params["rows"])
    part = np.zeros((ids.size, w.shape[-1]), np.float32)
    if inside.size:  # bf16: the kernel takes and gives the uint16 bits
        looked_up = kernels.embedding_fwd(rows, native_rows(w), threads=kernel_threads())
        part[inside] = looked_up.view(w.dtype)
    into = st.view(call.outputs[0]) if call.outputs else None
    t.pipe_reduce(st, call, part.reshape(ids.shape + w.shape[-1:]), params["root"], into)


def _embed_output_grad(t, st, call) -> None:
    """Stage 0 broadcasts its output (gout.mb); the others receive into theirs
    (non-blocking: embed_grad waits for it by the hazard rule)."""
    t.pipe_broadcast(st, call, st.view(call.outputs[0]), dict(call.params)["root"])


def _embed_grad(t, st, call) -> None:
    """See NOTE [vocabulary-parallel embedding]: grad[id - lo] += dh[n] for each token n whose
    id is in [lo, hi), in token order (the embedding's backward kernel on those tokens:
    each row's additions are the unsplit backward's, in its order); set if first."""
    dh, ids = (st.view(s) for s in call.inputs)
    grad = st.view(call.outputs[0])
    params = dict(call.params)
    if params["first"]:
        grad[...] = 0
    inside, rows = shard_tokens(ids, *params["rows"])
    if inside.size:
        kernels.embedding_bwd(native_rows(dh)[inside], rows, grad.shape[0], dtable=grad,
                              threads=kernel_threads())


EMBED_CALLS = {"embed_rows": _embed_rows, "embed_output_grad": _embed_output_grad,
               "embed_grad": _embed_grad}
