"""SamplingParams validation and the truncation math against a float64 NumPy reference."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from hindsight.sampling import SamplingParams, sample_tokens, sampling_logprobs


@pytest.mark.parametrize("kw, match", [
    (dict(temperature=-1.0), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=-1), "top_k"), (dict(top_k=1.5), "top_k"), (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"), (dict(min_p=1.0), "min_p"), (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(stop_tokens=(-3,)), "stop_tokens"),
])
def test_params_reject_bad_values(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)


def test_params_check_vocab():
    with pytest.raises(ValueError, match="unknown stop token"):
        SamplingParams(stop_tokens=(5, 100)).check_vocab(100)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=200).check_vocab(100)


def reference_logprobs(logits, *, temperature, top_k, top_p, min_p):
    """Float64 NumPy: HF order (temperature, top-k, top-p, min-p), -inf off the support."""
    x = np.asarray(logits, np.float64) / temperature
    if top_k:
        kth = np.sort(x)[::-1][top_k - 1]
        x = np.where(x >= kth, x, -np.inf)
    if top_p < 1.0:
        order = np.argsort(-x, kind="stable")
        p = np.exp(x[order] - np.logaddexp.reduce(x))
        before = np.cumsum(p) - p
        keep = np.zeros(x.shape, bool)
        keep[order[before < top_p]] = True
        keep[order[0]] = True
        x = np.where(keep | (x >= x[order][keep[order]].min()), x, -np.inf)
    if min_p > 0.0:
        lp = x - np.logaddexp.reduce(x)
        x = np.where(lp >= lp.max() + np.log(min_p), x, -np.inf)
    return x - np.logaddexp.reduce(x)


CASES = [
    dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
    dict(temperature=0.7, top_k=5, top_p=1.0, min_p=0.0),
    dict(temperature=1.3, top_k=0, top_p=0.8, min_p=0.0),
    dict(temperature=1.0, top_k=8, top_p=0.9, min_p=0.0),
    dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.1),
    dict(temperature=0.9, top_k=12, top_p=0.95, min_p=0.05),
]


@pytest.mark.parametrize("case", CASES)
def test_truncated_logprobs_match_reference(case):
    logits = np.random.default_rng(1).normal(size=(3, 40)) * 2.0
    ours = np.asarray(sampling_logprobs(jnp.asarray(logits, jnp.float32), SamplingParams(**case)))
    for row in range(3):
        ref = reference_logprobs(logits[row], **case)
        np.testing.assert_array_equal(np.isfinite(ours[row]), np.isfinite(ref))
        fin = np.isfinite(ref)
        np.testing.assert_allclose(ours[row][fin], ref[fin], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", CASES)
def test_empirical_frequencies_match_truncated_distribution(case):
    """20k draws of one row: chi-square goodness of fit on the support, nothing off the support, and
    the returned log-probs are those of the truncated distribution."""
    n = 20000
    logits = np.random.default_rng(2).normal(size=(40,)) * 1.5
    params = SamplingParams(**case)
    keys = jax.random.split(jax.random.key(3), n)
    tok, lp, plp = jax.jit(sample_tokens, static_argnums=2)(
        jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (n, 40)), keys, params)
    tok, lp, plp = map(np.asarray, (tok, lp, plp))
    ref = reference_logprobs(logits, **case)
    support = np.isfinite(ref)
    counts = np.bincount(tok, minlength=40)
    assert counts[~support].sum() == 0
    expected = np.exp(ref[support]) * n
    assert stats.chisquare(counts[support], expected).pvalue > 1e-3
    np.testing.assert_allclose(lp, ref[tok], rtol=1e-5, atol=1e-5)
    scaled = logits / case["temperature"]  # untruncated policy at the sampling temperature
    policy = scaled - np.logaddexp.reduce(scaled)
    np.testing.assert_allclose(plp, policy[tok], rtol=1e-5, atol=1e-5)


def test_greedy_is_argmax_with_zero_sampling_logprob():
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(4, 30)), jnp.float32)
    tok, lp, plp = sample_tokens(logits, jax.random.split(jax.random.key(0), 4), SamplingParams(temperature=0.0))
    np.testing.assert_array_equal(np.asarray(tok), np.argmax(np.asarray(logits), -1))
    np.testing.assert_array_equal(np.asarray(lp), 0.0)
    np.testing.assert_allclose(np.asarray(plp), np.asarray(jax.nn.log_softmax(logits))[np.arange(4), np.asarray(tok)],
                               rtol=1e-6)
