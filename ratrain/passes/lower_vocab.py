"""lower, part 3: the vocabulary-parallel head's S and T tasks as runtime calls (NOTE
[vocabulary-parallel head], ir/vocab.py).

S(m): hn into vocab.mb (the last stage copies it from out.mb and broadcasts it, the
others receive it), the targets, then the shard's statistics (vocab_stats, which starts
their all-gather). T(m): vocab_loss (the last stage records the loss; all that the
held-out pass runs of T: NOTE [held-out loss]), vocab_grad (the shard's gradient, hn's
gradient reduced into the last stage's gin.mb). The calls' semantics: rt/vocab_calls.py.
"""
from __future__ import annotations

from ratrain.ir.buffers import BufferKind, buffer_name
from ratrain.ir.vocab import parse_shard, stage_vocab_layer
from ratrain.models.config import model_dims
from ratrain.passes.lower_state import _loss_scaled, view_slots
from ratrain.passes.vocab_buffers import grad_slot, vocab_slots
from ratrain.program_format.call_ops import CallOp
from ratrain.program_format.lowered import Call, Slot


def _shard(program, stage: int) -> tuple[int, int, int]:
    """(layer, first row, end row) of the stage's shard of the LM head."""
    layer = stage_vocab_layer(program, stage)
    (name, _), = program.layer_params(layer)
    _, lo, hi = parse_shard(name)
    return layer, lo, hi


def _norm_head(program) -> tuple:
    """Baichuan2's NormHead normalises each row of the LM head before its GEMM: the
    shards' traced graphs cost it, the runtime calls do not run it yet (they refuse)."""
    return (("norm_head", True),) if model_dims(program.graph.config).norm_head else ()


def _root(program) -> int:
    return len(program.stages) - 1


def lower_shard_forward(program, task) -> list[Call]:
    """S(m) on its stage (NOTE [vocabulary-parallel head])."""
    s, m = task.stage, task.micro_batch
    layer, lo, hi = _shard(program, s)
    hn, targets, stats = vocab_slots(program, m)
    source = (Slot(buffer_name(BufferKind.OUT, micro_batch=m), 0, hn.dtype, hn.shape),) \
        if s == _root(program) else ()
    common = (("micro_batch", m), ("root", _root(program))) + _norm_head(program)
    view, = view_slots(program, layer)
    return [Call(CallOp.VOCAB_HIDDEN, (hn,), source, common, f"L{layer} hn", layer=layer),
            Call(CallOp.LOAD_TARGETS, (targets,), (), (("micro_batch", m),), f"L{layer} targets",
                 layer=layer),
            Call(CallOp.VOCAB_STATS, (stats,), (hn, view, targets),
                 common + (("rows", (lo, hi)), ("stage", s)), f"L{layer} stats",
                 layer=layer)]


def lower_shard_backward(program, task) -> list[Call]:
    """T(m) on its stage (NOTE [vocabulary-parallel head]): the loss cotangent is 1/M
    (times the loss scale in fp16), as the unsplit head's B fills it."""
    s, m = task.stage, task.micro_batch
    layer, lo, hi = _shard(program, s)
    hn, targets, stats = vocab_slots(program, m)
    gin = (Slot(buffer_name(BufferKind.GIN, micro_batch=m), 0, hn.dtype, hn.shape),) \
        if s == _root(program) else ()
    view, = view_slots(program, layer)
    params = _loss_scaled(program, (
        ("first", m == 0), ("micro_batch", m), ("root", _root(program)), ("rows", (lo, hi)),
        ("value", 1.0 / program.options.micro_batches)) + _norm_head(program))
    loss = (("micro_batch", m), ("root", _root(program)))
    return [Call(CallOp.VOCAB_LOSS, (), (stats,), loss, f"L{layer} loss", layer=layer),
            Call(CallOp.VOCAB_GRAD, (grad_slot(program, layer),) + gin, (hn, view, targets, stats),
                 params, f"L{layer} grad", layer=layer)]
