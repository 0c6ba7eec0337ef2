"""lower, part 4: the vocabulary-parallel embedding's E and G tasks as runtime calls (NOTE
[vocabulary-parallel embedding], ir/vocab.py).

E(m): the micro-batch's ids into E's workspace, then embed_rows (the shard's rows looked
up, zero rows for the other ids, reduced over the pipeline group into stage 0's in.mb;
the held-out pass runs E whole: NOTE [held-out loss]). G(m): the ids, then on stage 0
embed_grad (its rows' gradient from gout.mb) and embed_output_grad (gout.mb broadcast),
elsewhere embed_output_grad (received into G's workspace) and embed_grad. The calls'
semantics: rt/embed_calls.py.
"""
from __future__ import annotations

from ratrain.ir.buffers import BufferKind, buffer_name
from ratrain.ir.vocab import parse_shard, stage_embed_layer
from ratrain.passes.lower_state import view_slots
from ratrain.passes.vocab_buffers import embed_slots, grad_slot, hidden_var
from ratrain.program_format.call_ops import CallOp
from ratrain.program_format.lowered import Call, var_slot

ROOT = 0  # the stage whose F reads the summed lookup and whose B makes its gradient


def _shard(program, stage: int) -> tuple[int, tuple[int, int]]:
    """(layer, (first row, end row)) of the stage's shard of the embedding."""
    layer = stage_embed_layer(program, stage)
    (name, _), = program.layer_params(layer)
    _, lo, hi = parse_shard(name)
    return layer, (lo, hi)


def _message(program, kind: BufferKind, micro_batch: int):
    """Stage 0's in.mb or gout.mb: the hidden state [B, T, h], or its gradient."""
    return var_slot(buffer_name(kind, micro_batch=micro_batch), 0, hidden_var(program))


def lower_embed_forward(program, task) -> list[Call]:
    """E(m) on its stage (NOTE [vocabulary-parallel embedding])."""
    s, m = task.stage, task.micro_batch
    layer, rows = _shard(program, s)
    ids, _ = embed_slots(program, task)
    view, = view_slots(program, layer)
    summed = (_message(program, BufferKind.IN, m),) if s == ROOT else ()
    return [Call(CallOp.LOAD_IDS, (ids,), (), (("micro_batch", m),), f"L{layer} ids",
                 layer=layer),
            Call(CallOp.EMBED_ROWS, summed, (view, ids),
                 (("micro_batch", m), ("root", ROOT), ("rows", rows)), f"L{layer} rows",
                 layer=layer)]


def lower_embed_backward(program, task) -> list[Call]:
    """G(m) on its stage (NOTE [vocabulary-parallel embedding]): stage 0 adds its rows'
    gradient before it broadcasts gout.mb, the others after they receive it."""
    s, m = task.stage, task.micro_batch
    layer, rows = _shard(program, s)
    ids, received = embed_slots(program, task)
    output_grad = received or _message(program, BufferKind.GOUT, m)
    load = Call(CallOp.LOAD_IDS, (ids,), (), (("micro_batch", m),), f"L{layer} ids",
                layer=layer)
    broadcast = Call(CallOp.EMBED_OUTPUT_GRAD, (output_grad,), (),
                     (("micro_batch", m), ("root", ROOT)), f"L{layer} output grad",
                     layer=layer)
    grad = Call(CallOp.EMBED_GRAD, (grad_slot(program, layer),), (output_grad, ids),
                (("first", m == 0), ("micro_batch", m), ("rows", rows)), f"L{layer} grad",
                layer=layer)
    return [load, grad, broadcast] if s == ROOT else [load, broadcast, grad]
