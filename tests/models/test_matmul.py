"""`models.layers.matmul`: float32 accumulation; in bf16 the backward pass runs in bf16 too (the
cotangent rounded to bf16, as a bf16-valued matmul's would be), with both gradient matmuls on
bf16 operands; float32 is a plain matmul."""
import jax
import jax.numpy as jnp
import numpy as np

from hindsight.models.layers import matmul


def _inputs(batch=(3, 5), i=24, o=40):
    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    return (jax.random.normal(kx, (*batch, i)), jax.random.normal(kw, (i, o)) / np.sqrt(i),
            jax.random.normal(kg, (*batch, o)))


def _reference(x, w, g):
    """float64 NumPy of the bf16 rule: operands and cotangent rounded to bf16, exact products."""
    r = lambda a: np.asarray(jnp.asarray(a).astype(jnp.bfloat16), np.float64)
    xb, wb, gb = r(x), r(w), r(g)
    return xb @ wb, gb @ wb.T, xb.reshape(-1, xb.shape[-1]).T @ gb.reshape(-1, gb.shape[-1])


def test_bf16_forward_and_gradients_match_a_float64_reference():
    x, w, g = _inputs()
    out, vjp = jax.vjp(lambda x, w: matmul(x, w, dtype=jnp.bfloat16), x, w)
    dx, dw = vjp(g)
    want_out, want_dx, want_dw = _reference(x, w, g)
    assert out.dtype == jnp.float32 and dx.dtype == x.dtype and dw.dtype == w.dtype
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, want_dw, rtol=1e-5, atol=1e-5)
    # against float32 calculus: within bf16 rounding of the operands (2^-8 relative)
    dx32, dw32 = jax.vjp(lambda x, w: x @ w, x, w)[1](g)
    np.testing.assert_allclose(dx, dx32, rtol=0.05, atol=0.05)
    np.testing.assert_allclose(dw, dw32, rtol=0.05, atol=0.05)


def test_bf16_gradient_of_bf16_inputs_and_jit_equal_eager():
    x, w, g = _inputs(batch=(4,))
    xb, wb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    f = lambda x, w, g: jax.vjp(lambda x, w: matmul(x, w, dtype=jnp.bfloat16), x, w)[1](g)
    dx, dw = f(xb, wb, g)
    assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.bfloat16
    jdx, jdw = jax.jit(f)(xb, wb, g)
    np.testing.assert_array_equal(np.asarray(dx, np.float32), np.asarray(jdx, np.float32))
    np.testing.assert_array_equal(np.asarray(dw, np.float32), np.asarray(jdw, np.float32))


def test_float32_is_the_plain_matmul_bit_for_bit():
    x, w, g = _inputs()
    got = jax.jit(lambda x, w, g: jax.vjp(lambda x, w: matmul(x, w, dtype=jnp.float32), x, w)[1](g))
    want = jax.jit(lambda x, w, g: jax.vjp(lambda x, w: jnp.matmul(x, w), x, w)[1](g))
    for a, b in zip(got(x, w, g), want(x, w, g)):
        np.testing.assert_array_equal(a, b)


def test_bf16_backward_dots_take_bf16_operands():
    """The compiled backward has no dot on float32 operands (XLA:CPU upcast the weight gradient
    `x^T g` to float32 when the transpose was folded into the dot: 4x slower on AMX)."""
    x, w, g = _inputs(batch=(64,), i=32, o=48)
    f = jax.jit(lambda x, w, g: jax.vjp(lambda x, w: matmul(x, w, dtype=jnp.bfloat16), x, w)[1](g))
    hlo = f.lower(x, w, g).compile().as_text()
    dots = [line for line in hlo.splitlines() if " dot(" in line]
    assert len(dots) == 2
    for line in dots:
        operands = line.split(" dot(")[1].split(")")[0]
        assert "f32" not in operands or "bf16" in operands, line
    params = {line.split("=")[0].strip().lstrip("%").split()[0]: line
              for line in hlo.splitlines() if "parameter(" in line}
    # every dot operand is a bf16 value (a parameter of the dot's fusion)
    assert all("bf16[" in p for name, p in params.items() if name.startswith("param")
               and any(name in d for d in dots)), dots
