"""KV-cached decoding equals a full forward: right-padded prefill, then one token at a time with rows
at different positions; forking rows with `cache_take`; the slot mask in cache mode."""
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from hindsight.models import cache_take, load_hf_folder
from .helpers import COMMON, forward_cached, ours, padded_batch

PROMPT_LENS = (7, 3, 5)
PREFILL = 7
STEPS = 5
MAX_LEN = 16


def _decode(model, prompt, tokens, lens):
    """Prefill `prompt [B, PREFILL]` (right-padded: junk at positions >= len), then feed each row's
    next token `tokens[b, len_b + t]` at its own position. Returns prefill logits and per-step
    logits `[B, STEPS, V]`."""
    b = tokens.shape[0]
    cache = model.init_cache(b, MAX_LEN)
    positions = np.broadcast_to(np.arange(PREFILL, dtype=np.int32), (b, PREFILL))
    prefill, cache = forward_cached(model, jnp.asarray(prompt), jnp.asarray(positions), cache)
    steps = []
    for t in range(STEPS):
        pos = np.asarray(lens, np.int32)[:, None] + t
        tok = np.take_along_axis(tokens, pos, axis=1)
        logits, cache = forward_cached(model, jnp.asarray(tok), jnp.asarray(pos), cache)
        steps.append(np.asarray(logits[:, 0]))
    return np.asarray(prefill), np.stack(steps, axis=1)


# Both layouts (the scan writes the cache at a traced layer index, the unrolled loop at a static one).
@pytest.mark.parametrize("name,scan_layers", [("llama3_rope", True), ("qwen3", False)],
                         ids=["llama3_rope-scan", "qwen3-unrolled"])
def test_cached_decode_matches_full_forward(hf_models, name, scan_layers):
    folder, _ = hf_models[name]
    model = load_hf_folder(folder, scan_layers=scan_layers)
    full_lens = [n + STEPS for n in PROMPT_LENS]
    tokens, positions, mask = padded_batch(full_lens, max(full_lens), COMMON["vocab_size"], seed=3)
    full = ours(model, tokens, positions, mask)
    # Junk after each prompt: the prefill writes it into slots that the decode steps overwrite
    # before any query can see them.
    prompt = tokens[:, :PREFILL].copy()
    for b, n in enumerate(PROMPT_LENS):
        prompt[b, n:] = (prompt[b, n:] + 1) % COMMON["vocab_size"]
    prefill, steps = _decode(model, prompt, tokens, PROMPT_LENS)
    scale = np.abs(full).max()
    for b, n in enumerate(PROMPT_LENS):
        assert np.abs(prefill[b, :n] - full[b, :n]).max() / scale < 1e-5
        assert np.abs(steps[b] - full[b, n:n + STEPS]).max() / scale < 1e-5


def test_cache_take_forks_a_prefilled_row(hf_models):
    """Prefill one prompt once, fan it out to 3 rows, continue each differently."""
    folder, _ = hf_models["qwen2"]
    model = load_hf_folder(folder)
    n, g, steps = 6, 3, 4
    rng = np.random.RandomState(5)
    prompt = rng.randint(0, COMMON["vocab_size"], (1, n)).astype(np.int32)
    conts = rng.randint(0, COMMON["vocab_size"], (g, steps)).astype(np.int32)
    cache = model.init_cache(1, MAX_LEN)
    _, cache = forward_cached(model, jnp.asarray(prompt), jnp.arange(n, dtype=jnp.int32)[None], cache)
    cache = cache_take(cache, jnp.zeros(g, jnp.int32))
    assert cache.k.shape[1] == g
    got = []
    for t in range(steps):
        pos = jnp.full((g, 1), n + t, jnp.int32)
        logits, cache = forward_cached(model, jnp.asarray(conts[:, t:t + 1]), pos, cache)
        got.append(np.asarray(logits[:, 0]))
    got = np.stack(got, axis=1)
    full_tokens = np.concatenate([np.repeat(prompt, g, axis=0), conts], axis=1)
    full_pos = np.broadcast_to(np.arange(n + steps, dtype=np.int32), full_tokens.shape).copy()
    full = ours(model, full_tokens, full_pos, np.ones_like(full_tokens))
    np.testing.assert_allclose(got, full[:, n:], rtol=0, atol=1e-5 * np.abs(full).max())


def test_cache_attention_mask_over_slots(hf_models):
    """A `[B,M]` slot mask in cache mode equals the same key mask in a plain forward."""
    from flax import nnx

    folder, _ = hf_models["llama"]
    model = load_hf_folder(folder)
    tokens, positions, _ = padded_batch((8, 8), 8, COMMON["vocab_size"], seed=7)
    key_mask = np.ones((2, 8), np.int32)
    key_mask[0, 2] = key_mask[1, 5] = 0
    plain = ours(model, tokens, positions, key_mask)
    slot_mask = np.zeros((2, MAX_LEN), np.int32)
    slot_mask[:, :8] = key_mask

    @nnx.jit
    def cached(m, t, p, c, a):
        return m(t, p, cache=c, attention_mask=a)[0]

    got = cached(model, jnp.asarray(tokens), jnp.asarray(positions), model.init_cache(2, MAX_LEN),
                 jnp.asarray(slot_mask))
    np.testing.assert_allclose(np.asarray(got), plain, rtol=0, atol=1e-5 * np.abs(plain).max())


def test_bad_call_arguments_are_named(hf_models):
    model = load_hf_folder(hf_models["llama"][0])
    t = jnp.zeros((2, 4), jnp.int32)
    with pytest.raises(ValueError, match="positions"):
        model(t, jnp.zeros((2, 3), jnp.int32))
    with pytest.raises(ValueError, match="attention_mask"):
        model(t, t, cache=model.init_cache(2, 8), attention_mask=jnp.ones((2, 4)))
    with pytest.raises(ValueError, match="cache has 3 rows"):
        model(t, t, cache=model.init_cache(3, 8))
    with pytest.raises(TypeError, match="tokens"):
        model(t.astype(jnp.float32), t)
    with pytest.raises(ValueError, match="kv_window"):
        model(t, t, cache=model.init_cache(2, 8), kv_window=9)
    with pytest.raises(ValueError, match="kv_window"):
        model(t, t, kv_window=4)


def test_a_kv_window_attends_over_the_cache_front_as_the_whole_cache(hf_models):
    """Rows whose positions stay below the window get the logits (and cache) of attending over
    every slot, a slot mask included: the slots past the window are never visible to them."""
    from flax import nnx

    model = load_hf_folder(hf_models["llama"][0])
    tokens, positions, _ = padded_batch((8, 8), 8, COMMON["vocab_size"], seed=11)
    slot_mask = np.ones((2, MAX_LEN), np.int32)
    slot_mask[0, 3] = 0

    @nnx.jit(static_argnames="window")
    def cached(m, t, p, c, a, window):
        return m(t, p, cache=c, attention_mask=a, kv_window=window)

    args = (model, jnp.asarray(tokens), jnp.asarray(positions), model.init_cache(2, MAX_LEN),
            jnp.asarray(slot_mask))
    full, full_cache = cached(*args, window=None)
    part, part_cache = cached(*args, window=8)
    np.testing.assert_allclose(np.asarray(part), np.asarray(full), rtol=0,
                               atol=1e-6 * float(np.abs(full).max()))
    np.testing.assert_array_equal(np.asarray(part_cache.k), np.asarray(full_cache.k))


def test_bf16_cache_writes_in_place_and_reads_back_exactly():
    """A bf16 cache keeps its bits as uint16: values read back are the bf16 values written, and the
    compiled write is a scatter on the buffer with no float32 copy of it (XLA:CPU's bf16 scatter
    converted the whole buffer both ways on every write: 7x slower decoding)."""
    from hindsight.models.cache import cache_layer, cache_write, init_cache

    shape = dict(num_layers=3, batch=2, max_len=8, num_kv_heads=2, head_dim=4)
    cache = init_cache(**shape, dtype=jnp.bfloat16)
    assert cache.dtype == jnp.bfloat16 and cache.k.dtype == jnp.uint16
    k = jax.random.normal(jax.random.key(0), (2, 3, 2, 4), jnp.float32)
    positions = jnp.array([[0, 1, 2], [4, 5, 6]], jnp.int32)
    out = cache_write(cache, 1, k, -k, positions)
    got_k, got_v = cache_layer(out, 1)
    assert got_k.dtype == jnp.bfloat16
    want = k.astype(jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(got_k[0, :3], np.float32), np.asarray(want[0], np.float32))
    np.testing.assert_array_equal(np.asarray(got_v[1, 4:7], np.float32), -np.asarray(want[1], np.float32))
    assert not np.asarray(cache_layer(out, 0)[0], np.float32).any()   # other layers untouched
    hlo = jax.jit(cache_write, donate_argnums=0).lower(cache, 1, k, k, positions).compile().as_text()
    full = "[3,2,8,2,4]"
    assert not [line for line in hlo.splitlines() if "convert(" in line and f"f32{full}" in line]
