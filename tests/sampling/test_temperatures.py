"""Sampling is exact at every temperature: under jit, from 1e-30 to 1e3, every drawn id lies in the
vocabulary and has a finite log-prob, and below 1e-8 the draw is the argmax (the sampler works on
``(logits - max) / T``, which cannot overflow)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.testing import CharTokenizer, char_model
from hindsight.sampling import SamplingParams, generate, sample_tokens

TEMPERATURES = [1e-30, 1e-20, 1e-12, 1e-10, 1e-8, 1e-5, 1e-2, 0.5, 1.0, 10.0, 1e3]
TRUNCATIONS = [{}, {"top_p": 0.9}, {"top_k": 5}, {"min_p": 0.1}]


def _logits():
    """The tiny model's own next-token logits, and SmolLM2-sized random ones (V = 49,152)."""
    model = char_model(0)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 128, (16, 12)), jnp.int32)
    tiny, _ = model(tokens, jnp.broadcast_to(jnp.arange(12), (16, 12)))
    big = jnp.asarray(np.random.default_rng(1).normal(size=(16, 49152)) * 8.0, jnp.float32)
    return [tiny[:, -1], big]


@pytest.mark.parametrize("which", [0, 1])
def test_every_temperature_draws_real_tokens(which):
    logits = _logits()[which]
    v = logits.shape[-1]
    keys = jax.random.split(jax.random.key(0), logits.shape[0])
    cases = ([(t, {}) for t in TEMPERATURES]
             + [(t, kw) for t in (1e-12, 0.5) for kw in TRUNCATIONS[1:]])
    for t, kw in cases:
        p = SamplingParams(temperature=t, **kw)
        tok, lp, plp = jax.jit(lambda l, k: sample_tokens(l, k, p))(logits, keys)
        tok = np.asarray(tok)
        assert np.all((tok >= 0) & (tok < v)), (t, kw)
        assert np.all(np.isfinite(lp)) and np.all(np.isfinite(plp)), (t, kw)
        assert np.all(np.asarray(lp) <= 1e-6), (t, kw)
        if t <= 1e-8:
            np.testing.assert_array_equal(tok, np.argmax(np.asarray(logits), -1))


def test_generate_at_a_tiny_temperature_is_greedy():
    model, tok = char_model(0), CharTokenizer()
    prompt = [tok.encode("hello there")]
    cold = generate(model, prompt, SamplingParams(temperature=1e-12, max_new_tokens=8),
                    key=jax.random.key(3), num_samples=4)
    greedy = generate(model, prompt, SamplingParams(temperature=0.0, max_new_tokens=8),
                      key=jax.random.key(3), num_samples=4)
    np.testing.assert_array_equal(cold.tokens, greedy.tokens)
    assert np.all(cold.tokens < 128) and np.all(np.isfinite(cold.logprobs))
    assert np.all(np.isfinite(cold.policy_logprobs))
