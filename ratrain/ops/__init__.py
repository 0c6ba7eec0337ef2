"""ratrain.ops: the coarse ops models are written with (each a JAX primitive with a
custom VJP and a rule-table entry, made by `define_op`).

IR op names: matmul, matmul_bias, attention, rms_norm, rope, swiglu, embedding,
cross_entropy (each with a `<name>_bwd` backward op).
"""
from ratrain.ops.attention import alibi_slopes, attention
from ratrain.ops.define import define_op
from ratrain.ops.embedding import embedding
from ratrain.ops.linear import matmul
from ratrain.ops.loss import cross_entropy
from ratrain.ops.mlp import swiglu
from ratrain.ops.norm import rms_norm
from ratrain.ops.rope import rope

__all__ = ["alibi_slopes", "attention", "cross_entropy", "define_op", "embedding",
           "matmul", "rms_norm", "rope", "swiglu"]
