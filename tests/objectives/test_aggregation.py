import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.objectives import MODES, aggregate, finalize, finalize_metrics

from .helpers import jitted, pad_rows_cols, random_mask, row_chunks

NORM = 16.0


def reference(x, mask, mode, norm=NORM):
    """verl ``agg_loss`` in float64, returned as (sum, count)."""
    x = np.where(mask > 0, np.asarray(x, np.float64), 0.0)
    m = (mask > 0).astype(np.float64)
    if mode == "token-mean":
        return x.sum(), m.sum()
    tokens = m.sum(-1)
    live = tokens > 0
    row = x.sum(-1)
    if mode == "seq-mean-token-mean":
        row = np.where(live, row / np.maximum(tokens, 1), 0.0)
    elif mode == "seq-mean-token-sum-norm":
        row = row / norm
    return row[live].sum(), float(live.sum())


def kwargs(mode):
    return {"norm": NORM} if mode == "seq-mean-token-sum-norm" else {}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape,contiguous", [((2, 1), True), ((8, 33), False)])
def test_matches_float64_reference(mode, shape, contiguous):
    rng = np.random.default_rng(sum(shape))
    x = rng.normal(size=shape).astype(np.float32)
    mask = random_mask(rng, *shape, contiguous=contiguous)
    x[mask == 0] = np.nan  # values at masked positions must be ignored, even NaN
    agg = jitted(aggregate, mode=mode, **kwargs(mode))
    s, c = agg(jnp.asarray(x), jnp.asarray(mask))
    rs, rc = reference(x, mask, mode)
    assert s.dtype == jnp.float32 and c.dtype == jnp.float32
    np.testing.assert_allclose(s, rs, rtol=1e-5, atol=1e-6)
    assert float(c) == rc
    np.testing.assert_allclose(finalize(s, c), rs / max(rc, 1), rtol=1e-5, atol=1e-6)
    s_bool, c_bool = agg(jnp.asarray(x), jnp.asarray(mask > 0))
    assert float(s_bool) == float(s) and float(c_bool) == float(c)


@pytest.mark.parametrize("mode", MODES)
def test_padding_and_micro_batching(mode):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(9, 12)).astype(np.float32)
    mask = random_mask(rng, 9, 12)
    agg = jitted(aggregate, mode=mode, **kwargs(mode))
    full = finalize(*agg(jnp.asarray(x), jnp.asarray(mask)))
    xp, mp = pad_rows_cols(x, 3, 5, 1e4), pad_rows_cols(mask, 3, 5, 0.0)
    np.testing.assert_allclose(finalize(*agg(jnp.asarray(xp), jnp.asarray(mp))), full, rtol=1e-6)
    pairs = [agg(jnp.asarray(x[sl]), jnp.asarray(mask[sl])) for sl in row_chunks(9, (2, 4, 1, 2))]
    combined = jax.tree.map(lambda *p: sum(p), *pairs)
    np.testing.assert_allclose(finalize(*combined), full, rtol=1e-6, atol=1e-7)


def test_jit_vmap_grad_bf16():
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.normal(size=(2, 4, 6)).astype(np.float32))
    mask = jnp.asarray(np.stack([random_mask(rng, 4, 6), random_mask(rng, 4, 6, contiguous=False)]))
    for mode in MODES:
        f = jax.vmap(lambda a, m, mode=mode: finalize(*aggregate(a, m, mode=mode, **kwargs(mode))))
        out = jax.jit(f)(x, mask)
        for i in range(2):
            rs, rc = reference(np.asarray(x[i]), np.asarray(mask[i]), mode)
            np.testing.assert_allclose(out[i], rs / max(rc, 1), rtol=1e-5, atol=1e-6)
        g = jax.jit(jax.grad(lambda a: jnp.sum(f(a, mask))))(x)
        assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[np.asarray(mask) == 0] == 0)
        xb = x.astype(jnp.bfloat16)
        np.testing.assert_allclose(jax.jit(f)(xb, mask), out, rtol=2e-2, atol=2e-2)


def test_empty_batch_and_finalize_metrics():
    s, c = aggregate(jnp.ones((3, 4)), jnp.zeros((3, 4)), mode="seq-mean-token-mean")
    assert float(s) == 0.0 and float(c) == 0.0 and float(finalize(s, c)) == 0.0
    out = finalize_metrics({"a": (jnp.float32(3.0), jnp.float32(4.0)), "b": (0.0, 0.0)})
    assert float(out["a"]) == 0.75 and float(out["b"]) == 0.0


def test_bad_input():
    x, m = jnp.zeros((2, 3)), jnp.ones((2, 3))
    with pytest.raises(ValueError, match="`mode` must be one of"):
        aggregate(x, m, mode="seq-mean")
    with pytest.raises(ValueError, match="needs `norm`"):
        aggregate(x, m, mode="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="`norm` only applies"):
        aggregate(x, m, mode="token-mean", norm=4.0)
    with pytest.raises(ValueError, match=r"`per_token` \(2, 3\), `mask` \(2, 4\)"):
        aggregate(x, jnp.ones((2, 4)))
    with pytest.raises(ValueError, match="`per_token` must have rank 2"):
        aggregate(jnp.zeros(3), jnp.ones(3))
