"""The LM head's products take the hidden states' 16-bit dtype (``hindsight.ops._precision``): with
bf16 hidden states and a float32 unembedding (bf16 compute, float32 parameters: the train step's
mixed precision) every backend computes the value from the unembedding rounded to bf16 with
float32 accumulation, as the model's own head does; the fused backend's gradients follow
``models.layers.matmul``'s bf16 rule (the logit cotangent rounded to bf16, float32 accumulation,
the unembedding's gradient float32); every product takes bf16 operands. Float32 hidden states
are computed as before, bit for bit."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hindsight.ops as ops
from hindsight.ops import lm_head as lm_head_mod
from hindsight.ops.lm_head import BACKENDS

N, D, V = 24, 16, 300


def _inputs(rng):
    h = jnp.asarray(rng.normal(size=(N, D)), jnp.bfloat16)
    w = jnp.asarray(rng.normal(size=(D, V)) * 3.0 / np.sqrt(D), jnp.float32)
    tok = jnp.asarray(rng.integers(0, V, size=N), jnp.int32)
    mask = jnp.asarray(rng.random(N) > 0.2, jnp.float32)
    return h, w, tok, mask


def _row(logits, extras):
    (z,), (tok, mask) = logits, extras
    lp = jnp.take_along_axis(jax.nn.log_softmax(z), tok[:, None], axis=-1)[:, 0]
    return mask * lp, {}


def _head_sum(backend, chunk=8):
    return lambda h, w, tok, mask: ops.lm_head_sum(_row, [h], [w], [tok, mask], backend=backend,
                                                   chunk_size=chunk)[0]


def _bf16(a) -> np.ndarray:
    return np.asarray(jnp.asarray(a).astype(jnp.bfloat16), np.float64)


def _reference(h, w, tok, mask):
    """Float64 NumPy of the bf16 rule: value from bf16 operands; dlogits rounded to bf16 before
    the two gradient products."""
    hb, wb, tok, mask = _bf16(h), _bf16(w), np.asarray(tok), np.asarray(mask, np.float64)
    z = hb @ wb
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    value = np.sum(mask * logp[np.arange(N), tok])
    onehot = np.eye(V)[tok]
    dz = _bf16(mask[:, None] * (onehot - np.exp(logp)))
    return value, dz @ wb.T, hb.T @ dz


@pytest.mark.parametrize("backend", BACKENDS)
def test_value_from_the_unembedding_rounded_to_the_hidden_dtype(rng, backend):
    h, w, tok, mask = _inputs(rng)
    want, _, _ = _reference(h, w, tok, mask)
    got = jax.jit(_head_sum(backend))(h, w, tok, mask)
    np.testing.assert_allclose(float(got), want, rtol=2e-6)
    # the float32 unembedding would give another value: the rounding is what is tested
    f32 = np.asarray(h, np.float64) @ np.asarray(w, np.float64)
    f32 = f32 - np.log(np.exp(f32 - f32.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - f32.max(-1, keepdims=True)
    assert abs(np.sum(np.asarray(mask) * f32[np.arange(N), np.asarray(tok)]) - want) > 5 * 2e-6 * abs(want)


@pytest.mark.parametrize("rows", [False, True])
def test_fused_gradients_follow_the_bf16_rule(rng, rows, monkeypatch):
    """Both orientations of the unembedding (``[D, V]``, and a tied ``[V, D]`` table entering as
    its transpose), several vocabulary tiles: the gradients are the float64 products of the
    bf16-rounded operands and cotangent; the unembedding's gradient stays float32."""
    monkeypatch.setattr(lm_head_mod, "VOCAB_TILE", 64)
    h, w, tok, mask = _inputs(rng)
    _, want_h, want_w = _reference(h, w, tok, mask)
    if rows:
        table = w.T
        f = lambda h, table, tok, mask: _head_sum("fused")(h, table.T, tok, mask)
        got_h, got_t = jax.jit(jax.grad(f, (0, 1)))(h, table, tok, mask)
        got_w = got_t.T
        assert got_t.dtype == jnp.float32
    else:
        got_h, got_w = jax.jit(jax.grad(_head_sum("fused"), (0, 1)))(h, w, tok, mask)
        assert got_w.dtype == jnp.float32
    assert got_h.dtype == jnp.bfloat16
    # float32 accumulation; a rounding of dlogits may land on the other bf16 neighbour of the
    # float64 one (float32 logits): a few 2^-8 relative entries; the hidden gradient is bf16
    np.testing.assert_allclose(np.asarray(got_w, np.float64), want_w, rtol=1e-2,
                               atol=2e-3 * np.abs(want_w).max())
    np.testing.assert_allclose(np.asarray(got_h, np.float64), want_h, rtol=2e-2,
                               atol=5e-3 * np.abs(want_h).max())


def test_every_product_takes_bf16_operands(rng):
    """The fused backend's value and gradient program: no dot on a float32 operand (the
    unembedding used to enter the products in float32, so they ran at the float32 rate)."""
    h, w, tok, mask = _inputs(rng)
    text = jax.jit(jax.value_and_grad(_head_sum("fused"), (0, 1))).lower(h, w, tok, mask).as_text()
    dots = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
    assert len(dots) >= 3   # the projection, dlogits @ W^T, h^T @ dlogits
    for line in dots:
        operands = line.rsplit(":", 1)[1].split("->")[0]
        assert "xf32>" not in operands and "xbf16>" in operands, line


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_hidden_states_unchanged_bit_for_bit(rng, backend):
    h, w, tok, mask = _inputs(rng)
    h = h.astype(jnp.float32)
    got = jax.jit(jax.value_and_grad(_head_sum(backend), (0, 1)))(h, w, tok, mask)

    def plain(h, w, tok, mask):   # the float32 products written out
        z = jnp.matmul(h, w, preferred_element_type=jnp.float32)
        return jnp.sum(_row((z,), (tok, mask))[0])
    want = jax.jit(jax.value_and_grad(plain, (0, 1)))(h, w, tok, mask)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    for a, b in zip(got[1], want[1]):
        assert a.dtype == jnp.float32
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
