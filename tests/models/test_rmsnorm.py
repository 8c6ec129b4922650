"""`models.layers.RMSNorm`: value and gradients against a float64 NumPy reference in float32 and
bf16 compute (float32 scale parameter); the scale's gradient is one float32 contraction over the
rows (not rounded to bf16, whatever the compute dtype), jit equals eager."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hindsight.models.layers import RMSNorm

EPS = 1e-5


def _bf16(a) -> np.ndarray:
    return np.asarray(jnp.asarray(a).astype(jnp.bfloat16), np.float64)


def _inputs(dtype, shape=(3, 5, 2, 16)):
    kx, ks, kg = jax.random.split(jax.random.key(0), 3)
    x = (jax.random.normal(kx, shape) * 3.0).astype(dtype)
    scale = 1.0 + 0.1 * jax.random.normal(ks, shape[-1:])
    return x, scale, jax.random.normal(kg, shape).astype(dtype)


def _reference(x, scale, g, *, low: bool):
    """Float64: statistics of x, the normed values and the scale rounded as the compute dtype
    rounds them (bf16: the forward product's operands), the cotangent as given."""
    x, scale, g = (np.asarray(a, np.float64) for a in (x, scale, g))
    r = 1.0 / np.sqrt(np.mean(x * x, -1, keepdims=True) + EPS)
    normed = x * r
    nd, sd = (_bf16(normed), _bf16(scale)) if low else (normed, scale)
    out = sd * nd
    d_scale = np.sum((g * nd).reshape(-1, x.shape[-1]), 0)
    d_normed = g * sd
    dx = r * (d_normed - normed * np.mean(d_normed * normed, -1, keepdims=True))
    return out, dx, d_scale


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_matches_float64_reference(dtype):
    x, scale, g = _inputs(dtype)
    norm = RMSNorm(x.shape[-1], eps=EPS, dtype=dtype, param_dtype=jnp.float32)
    norm.scale[...] = scale
    graph, state = nnx.split(norm)
    out, vjp = jax.vjp(lambda x, state: nnx.merge(graph, state)(x), x, state)
    dx, d_state = vjp(g)
    ds = d_state["scale"][...]
    low = dtype == jnp.bfloat16
    want_out, want_dx, want_ds = _reference(x, scale, g, low=low)
    assert out.dtype == dtype and dx.dtype == dtype and ds.dtype == jnp.float32
    tol = dict(rtol=1e-2, atol=1e-2) if low else dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out, np.float64), want_out, **tol)
    np.testing.assert_allclose(np.asarray(dx, np.float64), want_dx, **tol)
    # the scale's gradient in float32 arithmetic: not rounded to bf16 (2^-8 relative) in bf16
    np.testing.assert_allclose(np.asarray(ds, np.float64), want_ds, rtol=1e-5,
                               atol=1e-5 * np.abs(want_ds).max())


def test_jit_equals_eager():
    x, scale, g = _inputs(jnp.bfloat16)
    norm = RMSNorm(x.shape[-1], eps=EPS, dtype=jnp.bfloat16, param_dtype=jnp.float32)
    graph, state = nnx.split(norm)

    def grads(state, x, g):
        f = lambda state, x: nnx.merge(graph, state)(x)
        return jax.vjp(f, state, x)[1](g)
    eager, jitted = grads(state, x, g), jax.jit(grads)(state, x, g)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
