"""The buffers of the vocabulary-parallel head's S and T tasks (NOTE [vocabulary-parallel
head], ir/vocab.py): whether a stage's B starts from the loss, and the slots of
vocab.mb, which S fills and T reads; and of the embedding's E and G (NOTE
[vocabulary-parallel embedding]): whether a stage's F starts from the ids, and the slots
of their workspaces. passes/buffers.py's task_effects and lowering ask here.
"""
from __future__ import annotations

import numpy as np

from ratrain.ir.buffers import BufferKind, buffer_name, grad_accumulator
from ratrain.ir.vocab import stage_embed_layer, stage_vocab_layer
from ratrain.passes.layout import align_up, pack
from ratrain.ir.tasks import Kind
from ratrain.program_format.lowered import Slot, var_slot


def holds_loss(program, stage: int) -> bool:
    """Does the stage's B start from the loss (its own cross-entropy)? The last stage's,
    unless the head is vocabulary-parallel: then its B starts from gin.mb, the sum of the
    shards' parts of hn's gradient."""
    return stage == len(program.stages) - 1 and stage_vocab_layer(program, stage) is None


def holds_ids(program, stage: int) -> bool:
    """Does the stage's F start from the token ids (its own embedding)? Stage 0's, unless
    the embedding is vocabulary-parallel: then its F starts from in.mb, the sum of the
    shards' lookups (NOTE [vocabulary-parallel embedding])."""
    return stage == 0 and stage_embed_layer(program, stage) is None


def _tokens(program) -> int:
    g = program.graph
    return g.micro_batch_size * g.seq_len


def vocab_slots(program, micro_batch: int) -> tuple[Slot, Slot, Slot]:
    """(hn [N, h] compute dtype, targets [B, T] int32, stats [P, 2, N] f32: each stage's
    log-sum-exp and target logit per token) in vocab.mb."""
    g, n, pp = program.graph, _tokens(program), program.options.pp
    hidden = int(g.config["hidden_size"])
    shapes = (((n, hidden), g.dtype), ((g.micro_batch_size, g.seq_len), "int32"),
              ((pp, 2, n), "float32"))
    offsets, _ = pack(align_up(int(np.prod(s)) * np.dtype(d).itemsize) for s, d in shapes)
    name = buffer_name(BufferKind.VOCAB, micro_batch=micro_batch)
    return tuple(Slot(name, o, np.dtype(d).name, s) for o, (s, d) in zip(offsets, shapes))


def vocab_bytes(program) -> int:
    hn, targets, stats = vocab_slots(program, 0)
    return stats.offset + stats.nbytes


def grad_slot(program, layer: int) -> Slot:
    """The shard's gradient [rows, h] f32 in grad.L (a shard layer always accumulates
    locally: choose_grad_accumulation sees only the pipeline's layers)."""
    (name, shape), = program.layer_params(layer)
    return Slot(grad_accumulator(layer, False), 0, "float32", tuple(shape))


def hidden_bytes(program) -> int:
    """Bytes of a micro-batch's hidden state [B, T, h] in the compute dtype: what E sums
    into stage 0's in.mb and G broadcasts from its gout.mb."""
    g = program.graph
    return _tokens(program) * int(g.config["hidden_size"]) * np.dtype(g.dtype).itemsize


def hidden_var(program):
    """The hidden state's type [B, T, h], as the embedding's shard layer outputs it."""
    layer = stage_embed_layer(program, 0)
    return program.graph.kinds[program.graph.layers[layer].kind].fwd.outputs[0]


def embed_slots(program, task) -> tuple[Slot, Slot | None]:
    """(ids [B, T] int32, the lookup's gradient [B, T, h] received from stage 0, None on
    stage 0, which reads its gout.mb) in the workspace of E or G."""
    g = program.graph
    hidden = hidden_var(program)
    grad = task.kind == Kind.G and task.stage != 0
    sizes = (align_up(hidden_bytes(program)),) if grad else ()
    offsets, _ = pack(sizes + (align_up(4 * _tokens(program)),))
    name = buffer_name(BufferKind.WS, task=task)
    ids = Slot(name, offsets[-1], "int32", (g.micro_batch_size, g.seq_len))
    return ids, var_slot(name, 0, hidden) if grad else None


def embed_workspace_bytes(program, task) -> int:
    ids, grad = embed_slots(program, task)
    return ids.offset + ids.nbytes
