"""Each lax VJP rule, via the IR autodiff, passes the dot-product test in float64:
<J u, v> = <u, J^T v>, J u from jax.jvp of the function, J^T v from the backward IR."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from ratrain.ir.autodiff import differentiate
from ratrain.ir.interp import run_graph
from ratrain.ir.trace import trace_layer
from ratrain.ir.verify import verify_graph

X_SHAPE = (3, 4, 6)

CASES = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "div": lambda x, y: x / (y * y + 1.0),
    "neg": lambda x, y: -x + y,
    "integer_pow": lambda x, y: x ** 3 + y ** 2,
    "sqrt": lambda x, y: jnp.sqrt(x * x + 1.0) * y,
    "rsqrt": lambda x, y: lax.rsqrt(x * x + 1.0) * y,
    "exp": lambda x, y: jnp.exp(x) * y,
    "reshape": lambda x, y: jnp.reshape(x * y, (12, 6)),
    "transpose": lambda x, y: jnp.transpose(x, (2, 0, 1)) * jnp.transpose(y, (2, 0, 1)),
    "convert_element_type": lambda x, y: (x.astype(jnp.float32).astype(jnp.float64) * y),
    "broadcast_in_dim": lambda x, y: x * jnp.broadcast_to(jnp.sum(y, axis=1)[:, None], X_SHAPE),
    "implicit_broadcast": lambda x, y: x * jnp.sum(y, axis=-1, keepdims=True) + y.sum(),
    "reduce_sum": lambda x, y: jnp.sum(x * y, axis=(0, 2)),
    "slice": lambda x, y: x[:, 1:3, :] * y[:, :2, 2:4].sum(),
    "concatenate": lambda x, y: jnp.concatenate([x, 2.0 * y], axis=1),
    "split": lambda x, y: jnp.split(x * y, [2, 5], axis=2)[1],
    "squeeze": lambda x, y: lax.squeeze((x * y)[:, :1, :], (1,)),
}


def _trace(fn, dtype=np.float64):
    aval = jax.ShapeDtypeStruct(X_SHAPE, dtype)
    return trace_layer(lambda w, x, y: fn(x, y), "case fwd", (), (), ("x", "y"), (aval, aval))


@pytest.mark.parametrize("name", sorted(CASES))
def test_dot_product(name):
    fn = CASES[name]
    with jax.enable_x64(True):
        fwd = _trace(fn)
        bwd, residuals = differentiate(fwd)
        verify_graph(fwd), verify_graph(bwd)
        assert name in {n.op for n in fwd.nodes} | {"implicit_broadcast"}, f"{name} did not appear in the traced graph"
        rng = np.random.default_rng(0)
        # Values exactly representable in float32, so a cast round-trip is exact.
        x, y, ux, uy = (rng.standard_normal(X_SHAPE).astype(np.float32).astype(np.float64)
                        for _ in range(4))
        out, jvp = jax.jvp(fn, (x, y), (ux, uy))
        v = rng.standard_normal(np.shape(out)).astype(np.float32).astype(np.float64)
        env: dict = {}
        run_graph(fwd, [], [x, y], env=env)
        ct_x, ct_y = run_graph(bwd, [], [env[r.id] for r in residuals] + [v])
    lhs = float(np.sum(np.asarray(jvp) * v))
    rhs = float(np.sum(ux * ct_x) + np.sum(uy * ct_y))
    # float64 end to end: agreement to rounding of a few hundred terms. The cast case
    # rounds its cotangent to float32 on the way back (that is the rule), so 1e-6 there.
    rel = 1e-6 if name == "convert_element_type" else 1e-10
    assert lhs == pytest.approx(rhs, rel=rel, abs=rel)
