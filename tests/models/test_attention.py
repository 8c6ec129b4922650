"""The attention implementations (``model.attention``) against a float64 NumPy reference: masks
built from positions and a key-validity mask (left padding, holes, a fully masked row), grouped
KV heads, float32 and bf16 inputs; the chunked path's values and gradients equal the XLA path's,
and a decoder built with either gives the same logits, cached or not."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.models import attention as att
from hindsight.testing.models import tiny_model


def _reference(q, k, v, mask):
    """float64 softmax attention; a fully masked row attends uniformly (as the implementations)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, s, h, hd = q.shape
    g = h // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    scores = np.einsum("bshd,bthd->bhst", q, k) / np.sqrt(hd)
    m = np.asarray(mask)[:, None]
    scores = np.where(m, scores, -np.inf)
    full = ~m.any(-1, keepdims=True)
    scores = np.where(full, 0.0, scores)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhst,bthd->bshd", p, v)


def _inputs(s, t=None, *, seed=0, b=2, h=4, kv=2, hd=8):
    t = s if t is None else t
    r = np.random.default_rng(seed)
    q = r.standard_normal((b, s, h, hd)).astype(np.float32)
    k = r.standard_normal((b, t, kv, hd)).astype(np.float32)
    v = r.standard_normal((b, t, kv, hd)).astype(np.float32)
    positions = np.tile(np.arange(s), (b, 1))
    positions[1] = np.maximum(np.arange(s) - 3, 0)          # row 1: three left-padded slots
    valid = np.ones((b, t), bool)
    valid[1, :3] = False
    valid[0, 5:7] = False                                     # holes
    mask = np.array(att.causal_mask(jnp.asarray(positions), jnp.asarray(valid)))
    mask[0, 4] = False                                        # a fully masked query row
    return q, k, v, mask


@pytest.mark.parametrize("impl", ["xla", "chunked"])
@pytest.mark.parametrize("s", [9, 37])
def test_matches_float64_reference(impl, s, monkeypatch):
    monkeypatch.setattr(att, "QUERY_BLOCK", 16)              # 37: two blocks and a padded third
    q, k, v, mask = _inputs(s)
    out = att.ATTENTION[impl](jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(mask),
                              dtype=jnp.float32)
    np.testing.assert_allclose(np.asarray(out), _reference(q, k, v, mask), atol=2e-6, rtol=2e-5)
    assert out.dtype == jnp.float32 and np.isfinite(np.asarray(out)).all()


@pytest.mark.parametrize("impl", ["xla", "chunked"])
def test_one_query_per_row_matches_float64_reference(impl):
    """A decode step's shape (one query per row over a cache of 11 slots; its own path): a row
    seeing a prefix with a hole, a left-padded row and a row that sees no slot."""
    r = np.random.default_rng(1)
    q = r.standard_normal((3, 1, 4, 8)).astype(np.float32)
    k, v = (r.standard_normal((3, 11, 2, 8)).astype(np.float32) for _ in range(2))
    mask = np.zeros((3, 1, 11), bool)
    mask[0, 0, :7], mask[0, 0, 2] = True, False
    mask[1, 0, 3:10] = True
    out = att.ATTENTION[impl](jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(mask),
                              dtype=jnp.float32)
    assert out.shape == q.shape
    np.testing.assert_allclose(np.asarray(out), _reference(q, k, v, mask), atol=2e-6, rtol=2e-5)


def test_bf16_inputs_keep_float32_softmax():
    q, k, v, mask = _inputs(12)
    out = att.ATTENTION["chunked"](*(jnp.asarray(x) for x in (q, k, v, mask)), dtype=jnp.bfloat16)
    assert out.dtype == jnp.bfloat16
    rounded = [np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32)) for x in (q, k, v)]
    # bf16 inputs and output; a bf16 softmax would be off by ~1e-2 relative on these rows
    np.testing.assert_allclose(np.asarray(out, np.float32), _reference(*rounded, mask), atol=2e-2)


def test_chunked_gradient_equals_xla(monkeypatch):
    monkeypatch.setattr(att, "QUERY_BLOCK", 8)
    q, k, v, mask = (jnp.asarray(x) for x in _inputs(29))
    w = jax.random.normal(jax.random.key(1), q.shape)

    def loss(impl):
        return lambda q, k, v: jnp.sum(w * att.ATTENTION[impl](q, k, v, mask, dtype=jnp.float32))

    want = jax.grad(loss("xla"), argnums=(0, 1, 2))(q, k, v)
    got = jax.grad(loss("chunked"), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
        assert np.isfinite(np.asarray(a)).all()


def test_chunked_keeps_one_block_of_scores(monkeypatch):
    """Compiled temporaries: the chunked path's scores are one block's, the XLA path's all of them."""
    q, k, v, mask = (jax.ShapeDtypeStruct(x.shape, x.dtype) for x in _inputs(1024, b=2, h=4, kv=2))

    def temp(impl):
        f = jax.jit(jax.grad(lambda q, k, v, m: jnp.sum(att.ATTENTION[impl](q, k, v, m,
                                                                        dtype=jnp.float32)),
                             argnums=(0, 1, 2)))
        return f.lower(q, k, v, mask).compile().memory_analysis().temp_size_in_bytes

    monkeypatch.setattr(att, "QUERY_BLOCK", 128)
    scores = 2 * 4 * 1024 * 1024 * 4                        # float32 [2 rows, 4 heads, 1024, 1024]
    xla, chunked = temp("xla"), temp("chunked")
    assert xla >= scores and chunked * 4 < xla, (xla, chunked)     # measured: 134.6 vs 19.6 MB


def test_auto_picks_per_backend_and_unknown_names_are_refused():
    assert att.attention_impl("auto", dtype=jnp.float32) == "chunked"      # this CPU machine
    assert att.attention_impl("xla", dtype=jnp.bfloat16) == "xla"
    with pytest.raises(ValueError, match="'flash'.*available"):
        att.attention_impl("flash", dtype=jnp.float32)


@pytest.mark.parametrize("impl", ["xla", "chunked"])
def test_decoder_logits_do_not_depend_on_the_implementation(impl, monkeypatch):
    monkeypatch.setattr(att, "QUERY_BLOCK", 4)
    base, model = tiny_model(0, attention="xla"), tiny_model(0, attention=impl)
    tokens = jax.random.randint(jax.random.key(2), (2, 11), 0, 64)
    positions = jnp.tile(jnp.arange(11), (2, 1))
    want, _ = base(tokens, positions)
    got, _ = model(tokens, positions)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
    cache = model.init_cache(2, 16)                          # a prompt prefilled into a cache
    cached, _ = model(tokens, positions, cache=cache)
    np.testing.assert_allclose(np.asarray(cached), np.asarray(want), atol=1e-5)


def test_config_key_names_itself():
    from hindsight.train.experiment import ModelSection
    assert ModelSection().attention == "auto"
    with pytest.raises(ValueError, match="model.attention"):
        ModelSection(attention="flash")
