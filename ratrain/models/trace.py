"""A model into the compiler's input: every layer kind of a config traced once on abstract
shapes (ir/trace.py) and differentiated (ir/autodiff.py) into a TrainGraph
(ir/train_graph.py).
"""
from __future__ import annotations

from dataclasses import replace

import jax
import numpy as np

from ratrain import models
from ratrain.ir.autodiff import differentiate
from ratrain.ir.graph import LayerGraph
from ratrain.ir.trace import trace_layer
from ratrain.ir.train_graph import Layer, LayerKind, TrainGraph
from ratrain.ir.vocab import EMBED_KIND, FINAL_NORM_KIND, VOCAB_KIND, shard_name, shard_rows
from ratrain.models.config import default_seq_len


# The inputs each layer kind takes besides its weights.
def _kind_inputs(kind: str, batch: int, seq: int, hidden: int, dtype: str):
    ids = jax.ShapeDtypeStruct((batch, seq), np.int32)
    h = jax.ShapeDtypeStruct((batch, seq, hidden), np.dtype(dtype))
    return {"embed": (("ids",), (ids,)), "decoder": (("h",), (h,)),
            "head": (("h", "targets"), (h, ids)), "final_norm": (("h",), (h,)),
            "vocab": (("h", "targets"), (h, ids)), "embed_rows": (("ids",), (ids,))}[kind]


def trace_model(config: dict, *, micro_batch_size: int = 1, seq_len: int | None = None,
                dtype: str = "float32", name: str | None = None,
                vocab_shards: int = 0, split_embed: bool = False) -> TrainGraph:
    """Trace every layer kind of `config` on abstract shapes and differentiate it; with
    `vocab_shards`, the head split into its final norm and that many row shards of the
    LM head (split_head, NOTE [vocabulary-parallel head]), and with `split_embed` the
    input embedding too (split_embedding, NOTE [vocabulary-parallel embedding])."""
    seq_len = seq_len or default_seq_len(config)
    specs = models.layer_specs(config)
    shapes = models.param_shapes(config)
    kinds: dict[str, LayerKind] = {}
    for spec in specs:
        if spec.kind in kinds:
            continue
        kinds[spec.kind] = _trace_kind(config, spec.kind, spec.local_names,
                                       [shapes[n] for n in spec.param_names],
                                       micro_batch_size, seq_len, dtype)
    layers = tuple(Layer(s.index, s.kind, tuple(s.param_names)) for s in specs)
    graph = TrainGraph(name or config.get("_name_or_path", config.get("model_type", "model")),
                       config, micro_batch_size, seq_len, dtype, kinds, layers)
    return split_vocabulary(graph, vocab_shards, split_embed) if vocab_shards else graph


def split_vocabulary(graph: TrainGraph, shards: int, split_embed: bool) -> TrainGraph:
    """`graph` with its head split into `shards` row shards (split_head), and its input
    embedding too where `split_embed` (split_embedding): what --vocab-parallel head and
    --vocab-parallel both trace."""
    graph = split_head(graph, shards)
    return split_embedding(graph, shards) if split_embed else graph


def _name_outputs(graph: LayerGraph, role: str) -> LayerGraph:
    return replace(graph, output_names=(role,))


def _trace_kind(config: dict, kind: str, local_names, shapes, micro_batch_size: int,
                seq_len: int, dtype: str) -> LayerKind:
    """One layer kind traced on abstract shapes and differentiated."""
    avals = [jax.ShapeDtypeStruct(tuple(s), np.dtype(dtype)) for s in shapes]
    roles, inputs = _kind_inputs(kind, micro_batch_size, seq_len, int(config["hidden_size"]),
                                 dtype)
    fwd = trace_layer(models.layer_fn(config, kind), f"{kind} fwd", local_names, avals,
                      roles, inputs)
    fwd = _name_outputs(fwd, "loss" if kind in ("head", VOCAB_KIND) else "h")
    bwd, residuals = differentiate(fwd)
    return LayerKind(kind, fwd, bwd, residuals)


def split_head(graph: TrainGraph, shards: int) -> TrainGraph:
    """NOTE [vocabulary-parallel head] (ir/vocab.py): `graph` with its head
    layer as the final norm (same index) and `shards` layers after it, each one row shard
    of the LM head with its cross-entropy, shard order.

    Requires: a whole head as the last layer; the vocabulary divisible by `shards`.
    """
    config, head = graph.config, graph.layers[-1]
    vocab, hidden = int(config["vocab_size"]), int(config["hidden_size"])
    if head.kind != "head" or vocab % shards:
        raise ValueError(f"cannot split the head of {graph.name} into {shards} row shards "
                         f"(vocabulary {vocab})")
    norm_name, weight_name = head.param_names
    args = (graph.micro_batch_size, graph.seq_len, graph.dtype)
    rows = vocab // shards
    kinds = {**{k: v for k, v in graph.kinds.items() if k != "head"},
             FINAL_NORM_KIND: _trace_kind(config, FINAL_NORM_KIND, ("norm.weight",),
                                          [(hidden,)], *args),
             VOCAB_KIND: _trace_kind(config, VOCAB_KIND, ("lm_head.weight",),
                                     [(rows, hidden)], *args)}
    shard_layers = tuple(Layer(head.index + 1 + s, VOCAB_KIND,
                               (shard_name(weight_name, *shard_rows(vocab, shards, s)),))
                         for s in range(shards))
    layers = graph.layers[:-1] + (Layer(head.index, FINAL_NORM_KIND, (norm_name,)),) + \
        shard_layers
    return replace(graph, kinds=kinds, layers=layers)


def split_embedding(graph: TrainGraph, shards: int) -> TrainGraph:
    """NOTE [vocabulary-parallel embedding] (ir/vocab.py): `graph` without its embed layer,
    the other layers numbered from 0, and `shards` layers after them, each one row shard
    of the input embedding with its lookup, shard order.

    Requires: the embed layer first, the head already split (split_head); the vocabulary
    divisible by `shards`.
    """
    config, embed = graph.config, graph.layers[0]
    vocab, hidden = int(config["vocab_size"]), int(config["hidden_size"])
    if embed.kind != "embed" or not any(l.kind == VOCAB_KIND for l in graph.layers) or \
            vocab % shards:
        raise ValueError(f"cannot split the embedding of {graph.name} into {shards} row "
                         f"shards (vocabulary {vocab}; the head must be split first)")
    weight_name, = embed.param_names
    args = (graph.micro_batch_size, graph.seq_len, graph.dtype)
    kinds = {**{k: v for k, v in graph.kinds.items() if k != "embed"},
             EMBED_KIND: _trace_kind(config, EMBED_KIND, ("embed_tokens.weight",),
                                     [(vocab // shards, hidden)], *args)}
    rest = tuple(replace(layer, index=layer.index - 1) for layer in graph.layers[1:])
    shard_layers = tuple(Layer(len(rest) + s, EMBED_KIND,
                               (shard_name(weight_name, *shard_rows(vocab, shards, s)),))
                         for s in range(shards))
    return replace(graph, kinds=kinds, layers=rest + shard_layers)
