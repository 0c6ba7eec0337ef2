"""Tracing failures name the primitive and the user's source line."""
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ratrain import ops
from ratrain.ir.trace import UnsupportedPrimitive, trace_layer

H = jax.ShapeDtypeStruct((2, 3, 8), np.float32)
W = jax.ShapeDtypeStruct((8,), np.float32)


def test_unsupported_primitive_names_primitive_and_line():
    def layer(w, h):
        x = ops.rms_norm(h, w["norm.weight"], eps=1e-5)
        return jnp.tanh(x)  # the offending line
    line = inspect.getsourcelines(layer)[1] + 2
    with pytest.raises(UnsupportedPrimitive) as err:
        trace_layer(layer, "bad fwd", ("norm.weight",), (W,), ("h",), (H,))
    message = str(err.value)
    assert "'tanh'" in message
    assert f"test_trace_errors.py:{line}" in message


def test_captured_array_constant_is_rejected():
    table = jnp.arange(8.0)

    def layer(w, h):
        return h * table
    with pytest.raises(TypeError, match="captures array constants"):
        trace_layer(layer, "const fwd", (), (), ("h",), (H,))
