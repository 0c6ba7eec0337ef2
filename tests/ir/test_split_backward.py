"""See NOTE [B/W split]: a layer's backward as B (input gradient) then W (weight gradients)
computes bit for bit what the whole backward computes, B alone makes every input
cotangent, and W holds the weight GEMMs."""
import numpy as np
import pytest

from ratrain import models
from ratrain.ir.interp import run_graph
from ratrain.ir.verify import verify_graph
from ratrain.models.trace import trace_model


def _random(var, rng):
    if var.dtype == "int32":
        return rng.integers(0, 8, var.shape, dtype=np.int32)
    return rng.standard_normal(var.shape).astype(var.dtype)


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen"])
def test_input_then_weight_part_equal_the_whole_backward(name):
    config = {**models.get_config(name), "num_hidden_layers": 1}
    graph = trace_model(config, micro_batch_size=2, seq_len=8)
    rng = np.random.default_rng(0)
    for kind in graph.kinds.values():
        split = kind.split
        verify_graph(split.input_part), verify_graph(split.weight_part)
        params = [_random(p, rng) for p in kind.bwd.params]
        inputs = [_random(v, rng) for v in kind.bwd.inputs]
        whole = dict(zip(kind.bwd.output_names, run_graph(kind.bwd, params, inputs)))
        env: dict = {}
        b_out = dict(zip(split.input_part.output_names,
                         run_graph(split.input_part, params, inputs, env=env)))
        residuals = {v.id: a for v, a in zip(kind.bwd.inputs, inputs)}
        w_in = [residuals[r.id] for r in split.weight_part.inputs[:len(split.weight_part.inputs)
                                                                   - len(split.carried)]]
        w_in += [env[v.id] for v in split.carried]
        w_out = dict(zip(split.weight_part.output_names,
                         run_graph(split.weight_part, params, w_in)))
        assert set(b_out) | set(w_out) == set(whole) and not set(b_out) & set(w_out)
        assert {n for n in b_out if n.startswith("ct:")} == \
            {n for n in whole if n.startswith("ct:")}
        for n, value in {**b_out, **w_out}.items():
            np.testing.assert_array_equal(value, whole[n], err_msg=f"{kind.kind} {n}")


def test_decoder_weight_part_is_the_weight_gemms():
    graph = trace_model({**models.get_config("tiny"), "num_hidden_layers": 1}, seq_len=8)
    ops = lambda g: sorted(n.op for n in g.nodes)
    decoder, head, embed = (graph.kinds[k].split for k in ("decoder", "head", "embed"))
    assert ops(decoder.weight_part) == ["matmul_bwd_weight"] * 7
    assert "matmul_bwd" not in ops(decoder.input_part)
    assert ops(decoder.input_part).count("matmul_bwd_input") == 7
    # the LM head: B runs the logits and dh GEMMs and keeps G (NOTE [split logits gradient])
    assert ops(head.weight_part) == ["cross_entropy_bwd_weight"]
    assert "cross_entropy_bwd_input" in ops(head.input_part)
    (g,) = head.carried
    n, vocab = 8, graph.kinds["head"].bwd.params[1].shape[0]    # lm_head.weight [V, C]
    assert g.shape == (n * vocab,) and g.dtype == "float32"
    assert ops(embed.weight_part) == ["embedding_bwd"] and ops(embed.input_part) == []
    # W reads one output cotangent per weight GEMM, kept from B in wop.L.mb
    gemm_dys = {n.inputs[1].id for n in decoder.weight_part.nodes}
    assert {v.id for v in decoder.carried} == gemm_dys and len(gemm_dys) == 7
