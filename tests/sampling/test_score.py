"""Teacher-forced scoring under other contexts equals a full forward pass on the concatenation."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.sampling import SamplingParams, score_hidden, score_logits, score_logprobs

CONTEXTS = [[5, 6, 7, 8, 9, 10, 11], [2, 3]]
RESPONSES = [[20, 21, 22], [30, 31, 32, 33, 34], [40], [50, 51, 52, 53], [60, 61], [70, 71, 72, 73, 74, 75]]


def full_forward_logits(model, pairs):
    """Reference: one plain causal forward over each ``context + response`` (right-padded to one
    length, which causality makes harmless); returns the logits predicting each response token."""
    seqs = [c + r for c, r in pairs]
    width = max(len(s) for s in seqs)
    batch = jnp.asarray([s + [0] * (width - len(s)) for s in seqs])
    logits = np.asarray(model(batch, jnp.broadcast_to(jnp.arange(width), batch.shape))[0], np.float64)
    return [logits[i, len(c) - 1: len(c) + len(r) - 1] for i, (c, r) in enumerate(pairs)]


def test_score_equals_full_forward(tiny):
    """Responses 0..2 under context 0, 3..5 under context 1 (contiguous groups, context prefilled once)."""
    lp = np.asarray(score_logprobs(tiny, CONTEXTS, RESPONSES))
    logits = np.asarray(score_logits(tiny, CONTEXTS, RESPONSES))
    assert lp.shape == (6, 6) and logits.shape == (6, 6, 96)
    refs = full_forward_logits(tiny, [(CONTEXTS[b // 3], r) for b, r in enumerate(RESPONSES)])
    for b, resp in enumerate(RESPONSES):
        ref_logits = refs[b]
        ref_lp = ref_logits - np.logaddexp.reduce(ref_logits, axis=-1, keepdims=True)
        n = len(resp)
        np.testing.assert_allclose(lp[b, :n], ref_lp[np.arange(n), resp], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(logits[b, :n], ref_logits, rtol=1e-5, atol=1e-5 * np.abs(ref_logits).max())
        assert (lp[b, n:] == 0).all() and (logits[b, n:] == 0).all()


def test_score_with_context_index_and_hidden(tiny):
    idx = [1, 0, 1]
    lp = np.asarray(score_logprobs(tiny, CONTEXTS, RESPONSES[:3], context_index=idx))
    hidden, mask = score_hidden(tiny, CONTEXTS, RESPONSES[:3], context_index=idx)
    assert hidden.shape == (3, 5, 32) and np.asarray(mask).sum() == 9
    refs = full_forward_logits(tiny, [(CONTEXTS[i], r) for i, r in zip(idx, RESPONSES)])
    for b, resp in enumerate(RESPONSES[:3]):
        ref = refs[b]
        ref_lp = ref - np.logaddexp.reduce(ref, axis=-1, keepdims=True)
        np.testing.assert_allclose(lp[b, : len(resp)], ref_lp[np.arange(len(resp)), resp], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    (dict(contexts=[[]], responses=[[1]]), "empty"),
    (dict(contexts=[[1]], responses=[[1, 500]]), "outside"),
    (dict(contexts=[[1], [2]], responses=[[1], [2], [3]]), "contiguous groups"),
    (dict(contexts=[[1]], responses=[[1]], context_index=[1]), "context_index"),
])
def test_score_rejects_bad_input(tiny, kwargs, match):
    with pytest.raises(ValueError, match=match):
        score_logprobs(tiny, **kwargs)


def test_minimum_buckets_pin_the_compiled_shape(tiny):
    """Padding to minimum buckets changes neither values nor output shape, and calls whose lengths
    fall in different natural buckets then share one compiled forward."""
    from hindsight.sampling import score as score_module
    ref = np.asarray(score_logprobs(tiny, CONTEXTS, RESPONSES))
    pinned = np.asarray(score_logprobs(tiny, CONTEXTS, RESPONSES, min_response_len=40,
                                       min_context_len=20))
    assert pinned.shape == ref.shape
    np.testing.assert_allclose(pinned, ref, rtol=1e-5, atol=1e-6)
    before = score_module._forward_hidden._cache_size()
    for n in (3, 17, 33):  # natural response buckets 16, 32, 64
        score_logprobs(tiny, [[5] * 3], [[7] * n], min_response_len=64, min_context_len=20)
    assert score_module._forward_hidden._cache_size() - before <= 1
    with pytest.raises(ValueError, match="min_response_len"):
        score_logprobs(tiny, CONTEXTS, RESPONSES, min_response_len=0)


@pytest.mark.parametrize("per_context", ["one", "several"])
def test_scoring_from_a_cached_prefix_equals_a_full_rescore(tiny, monkeypatch, per_context):
    """Contexts that open like the sampled rows' prompts (HDL's ``h`` opens with the policy prompt)
    score from the rows' cached K/V: the same log-probs as prefilling every context from scratch.
    Covers a context sharing the whole prompt, one diverging inside it, one sharing nothing, the
    prompt itself (shared up to its last token), with one response per context (HDL's roots under
    their ``h``: context rest and response in one cached pass) and with several (each context's
    rest extended once, then copied to its responses)."""
    from hindsight.sampling import CachedPrefix
    from hindsight.sampling import score as score_module
    from hindsight.sampling.decode import extend
    from hindsight.sampling.engine import Engine

    prompt = [4, 5, 6, 7, 8]
    engine = Engine(tiny, SamplingParams(max_new_tokens=10, stop_tokens=(3,)), slots=4, max_len=64)
    engine.submit(prompt, num_samples=3, key=jax.random.key(2), keep_cache=True, tag="roots")
    roots = engine.run()["roots"]
    contexts = [prompt + [40, 41, 42, 43], [4, 5, 9, 9, 9, 9, 9, 9], [60, 61], prompt]
    responses = [list(roots.tokens[r, :roots.lengths[r]]) for r in (0, 1, 2)] + [[7, 8, 9]]
    index = [0, 1, 2, 3]
    if per_context == "several":
        responses, index = responses + [[7, 8, 9]], index + [0]
    prefix = CachedPrefix.of(roots, [0, 1, 2, 0])
    np.testing.assert_array_equal(prefix.shared([np.asarray(c) for c in contexts]), [5, 2, 0, 4])
    full = np.asarray(score_logprobs(tiny, contexts, responses, context_index=index))
    extends = []
    monkeypatch.setattr(score_module, "extend",
                        lambda *a, **k: extends.append(1) or extend(*a, **k))
    cached = np.asarray(score_logprobs(tiny, contexts, responses, context_index=index,
                                       prefix=prefix))
    assert bool(extends) == (per_context == "several")  # which of the two plans ran
    np.testing.assert_allclose(cached, full, rtol=1e-5, atol=1e-5)
    assert (full != 0).sum() == sum(len(r) for r in responses)
    # the shared K/V are read from the cache, not recomputed: a zeroed cache changes the scores of
    # the contexts that share a prefix and of no other
    blank = dataclasses.replace(prefix, cache=jax.tree.map(jnp.zeros_like, prefix.cache))
    wrong = np.asarray(score_logprobs(tiny, contexts, responses, context_index=index, prefix=blank))
    assert [not np.allclose(wrong[i], full[i], atol=1e-4) for i in range(len(index))] == \
        [True, True, False, True, True][:len(index)]
    # a context and response that do not fit the prefix cache are refused, naming the sizes
    with pytest.raises(ValueError, match="cache slots"):
        score_logprobs(tiny, [prompt + [9] * 60], [[1, 2, 3, 4, 5, 6]],
                       prefix=CachedPrefix.of(roots, [0]))
