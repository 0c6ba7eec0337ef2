"""Reference interpreter: evaluates LayerGraphs (and whole TrainGraphs) with numpy.

Every op runs its rule's array-API reference with xp=numpy, so the interpreter is the
semantic oracle for passes: a pass is correct if interpreting its output gives the same
numbers as interpreting its input.
"""
from __future__ import annotations

import numpy as np

from ratrain.ir.graph import (HIDDEN_COTANGENT, LayerGraph, Literal, Node, grad_role,
                              is_cotangent_role)
from ratrain.ir.rules import lookup_rule


def _value(env: dict, x):
    if isinstance(x, Literal):
        return np.asarray(x.value, dtype=x.dtype)
    return env[x.id]


def eval_node(node: Node, args: list) -> tuple:
    rule = lookup_rule(node.op)
    if rule is None:
        raise KeyError(f"no rule for op '{node.op}'")
    out = rule.fwd(np, *args, **node.param_dict)
    out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return tuple(np.asarray(o, dtype=v.dtype) for o, v in zip(out, node.outputs))


def run_graph(graph: LayerGraph, params, inputs, *, env: dict | None = None) -> tuple:
    """Evaluate `graph` on parameter arrays and input arrays; returns its outputs.

    Pass `env={}` to keep every intermediate value (keyed by Var id), e.g. to read the
    residuals a backward graph needs.
    """
    env = {} if env is None else env
    for var, array in zip(graph.params + graph.inputs, list(params) + list(inputs)):
        _check_input(graph, var, array)
        env[var.id] = np.asarray(array)
    for node in graph.nodes:
        results = eval_node(node, [_value(env, x) for x in node.inputs])
        for var, array in zip(node.outputs, results):
            env[var.id] = array
    return tuple(_value(env, x) for x in graph.outputs)


def _check_input(graph: LayerGraph, var, array) -> None:
    if tuple(np.shape(array)) != var.shape:
        raise ValueError(f"{graph.name}: input of shape {np.shape(array)} where the graph "
                         f"expects {var.type_str()}")


def _layer_inputs(kind: str, x, ids, targets) -> list:
    return {"embed": [ids], "decoder": [x], "head": [x, targets]}[kind]


def run_train_graph(train_graph, params: dict, tokens, loss_cotangent: float = 1.0
                    ) -> tuple[float, dict]:
    """Loss and every parameter gradient (times `loss_cotangent`) of one micro-batch.

    tokens: int32 [B, T+1]; the model reads tokens[:, :-1] and predicts tokens[:, 1:].
    """
    tokens = np.asarray(tokens, dtype=np.int32)
    ids, targets = tokens[:, :-1], tokens[:, 1:]
    x, saved = None, []
    for layer in train_graph.layers:
        kind = train_graph.kinds[layer.kind]
        env: dict = {}
        x, = run_graph(kind.fwd, [params[n] for n in layer.param_names],
                       _layer_inputs(layer.kind, x, ids, targets), env=env)
        saved.append([env[r.id] for r in kind.residuals])
    loss, ct, grads = float(x), np.asarray(loss_cotangent, dtype=np.float32), {}
    for layer, residuals in zip(reversed(train_graph.layers), reversed(saved)):
        kind = train_graph.kinds[layer.kind]
        cts_in = [ct] if is_cotangent_role(kind.bwd.input_names[-1]) else []
        outs = dict(zip(kind.bwd.output_names,
                        run_graph(kind.bwd, [params[n] for n in layer.param_names],
                                  residuals + cts_in)))
        ct = outs.get(HIDDEN_COTANGENT)
        for hf, local in zip(layer.param_names, kind.fwd.param_names):
            g = outs[grad_role(local)]  # a tied weight's uses add up (head first, then embed)
            grads[hf] = grads[hf] + g if hf in grads else g
    return loss, grads
