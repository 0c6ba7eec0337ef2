"""TrainGraph: the whole model as layers over a few traced layer kinds.

Each kind (embed, decoder, head) is traced once with abstract shapes and differentiated
once; layers of a kind share its forward/backward graphs and differ only in which HF
parameters they bind. This is the compiler's input: passes read layers, parameter
types, residuals and costs from here; models/trace.py makes it from a model.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ratrain.ir.graph import LayerGraph, Var
from ratrain.ir.split_backward import split_backward
from ratrain.ir.vocab import base_name


@dataclass(frozen=True, eq=False)  # identity: one object per traced kind
class LayerKind:
    kind: str                           # "embed", "decoder", "head"
    fwd: LayerGraph                     # params + inputs -> outputs
    bwd: LayerGraph                     # params + residuals + output cts -> cts + grads
    residuals: tuple[Var, ...]          # forward values the backward reads

    @cached_property
    def split(self):
        """The backward as zb1's B and W parts (ir/split_backward.py, NOTE [B/W split])."""
        return split_backward(self)


@dataclass(frozen=True)
class Layer:
    index: int                          # position in the model: 0 = embed .. L+1 = head
                                        # (row shards after them: ir/vocab.py)
    kind: str                           # key into TrainGraph.kinds
    param_names: tuple[str, ...]        # HF names, aligned with the kind's graph params


@dataclass(frozen=True, eq=False)  # identity: one object per trace, cheap to hash
class TrainGraph:
    name: str                           # preset or config name
    config: dict                        # HF config.json dictionary
    micro_batch_size: int               # sequences per micro-batch
    seq_len: int                        # tokens per sequence fed to the model
    dtype: str                          # compute dtype of activations and views
    kinds: dict[str, LayerKind]         # traced graphs per layer kind
    layers: tuple[Layer, ...]           # the model, in order

    def param_types(self) -> dict[str, Var]:
        """HF name -> typed Var of every parameter, in model order."""
        return {name: var for layer in self.layers
                for name, var in zip(layer.param_names, self.kinds[layer.kind].fwd.params)}

    @cached_property
    def kind_costs(self) -> dict:
        """LayerCost of each kind on one micro-batch (ratrain.ir.costs)."""
        from ratrain.ir.costs import layer_cost
        return {name: layer_cost(kind) for name, kind in self.kinds.items()}

    @cached_property
    def tied(self) -> dict[str, tuple[int, ...]]:
        """HF name -> the layers binding it, for each parameter more than one layer reads
        (tied input and output embeddings: the embed and head layers, or the head's row
        shards, NOTE [vocabulary-parallel head]), and for each row shard more than one
        layer binds (the embedding's and the head's shard of the same rows, NOTE
        [vocabulary-parallel embedding])."""
        binding: dict[str, list[int]] = {}
        exact: dict[str, list[int]] = {}  # shard name -> the layers binding those rows
        whole: set[str] = set()     # weights some layer binds whole
        for layer in self.layers:
            for name in layer.param_names:  # a row shard binds rows of its weight
                binding.setdefault(base_name(name), []).append(layer.index)
                whole |= {name} if name == base_name(name) else set()
                if name != base_name(name):
                    exact.setdefault(name, []).append(layer.index)
        # the row shards of one weight bind it once between them
        return {name: tuple(ls) for name, ls in binding.items()
                if len(ls) > 1 and name in whole} | \
            {name: tuple(ls) for name, ls in exact.items()
             if len(ls) > 1 and base_name(name) not in whole}

    def num_params(self) -> int:
        return sum(v.size for v in self.param_types().values())

    def micro_batch_flops(self) -> int:
        """Model FLOPs of one micro-batch's forward and backward: 3 x every layer's forward
        FLOPs by the rule tables (ratrain.ir.costs), no recompute counted (NOTE [model
        FLOPs and MFU] in rt/metrics.py)."""
        return 3 * sum(self.kind_costs[layer.kind].fwd_flops for layer in self.layers)
