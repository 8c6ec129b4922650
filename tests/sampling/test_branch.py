"""Branching continues from the cached prefix and equals decoding from scratch."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.sampling import SamplingParams, branch, generate
from hindsight.sampling.decode import graph_and_weights, prefill

PARAMS = SamplingParams(max_new_tokens=24, top_p=0.95)


@pytest.fixture(scope="module")
def roots(tiny):
    return generate(tiny, [[3, 1, 4, 1, 5], [9, 2, 6]], PARAMS, num_samples=2, key=jax.random.key(11), max_len=64)


def test_branch_equals_decoding_from_scratch(tiny, roots):
    rows, positions, counts = [0, 3, 3], [0, 7, 23], [2, 1, 1]
    keys = jax.random.split(jax.random.key(5), 4)
    out = branch(tiny, roots, rows, positions, counts, row_keys=keys)
    assert out.parents.tolist() == [0, 0, 3, 3] and out.branch_positions.tolist() == [0, 0, 7, 23]
    for i, (r, p) in enumerate(zip([0, 0, 3, 3], [0, 0, 7, 23])):
        prefix = roots.sequence(r)[: roots.prompt_lengths[r] + p]
        scratch = generate(tiny, [prefix], PARAMS, row_keys=keys[i: i + 1], max_new_tokens=24 - p, max_len=64)
        n = scratch.lengths[0]
        assert out.lengths[i] == p + n
        np.testing.assert_array_equal(out.tokens[i, :p], roots.tokens[r, :p])
        np.testing.assert_array_equal(out.tokens[i, p: p + n], scratch.tokens[0, :n])
        np.testing.assert_allclose(out.logprobs[i, p: p + n], scratch.logprobs[0, :n], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out.logprobs[i, :p], roots.logprobs[r, :p])  # prefix log-probs kept


def test_reused_cache_rows_equal_recomputed(tiny, roots):
    """The finished roots' cache rows (what a branch copies) equal a fresh prefill of the same
    prompt + response on every slot a continuation can read."""
    graphdef, weights = graph_and_weights(tiny)
    for r in (1, 2):
        seq = roots.sequence(r)
        fresh = prefill(graphdef, weights, jnp.asarray(seq[None]), max_len=64)
        n = seq.size - 1  # the last token is never fed, so never read by a branch
        for ours, ref in zip(jax.tree.leaves(roots.state.cache), jax.tree.leaves(fresh)):
            np.testing.assert_allclose(np.asarray(ours[:, r, :n]), np.asarray(ref[:, 0, :n]), rtol=1e-5, atol=1e-5)


def test_branch_of_a_branch(tiny, roots):
    first = branch(tiny, roots, [1], [4], key=jax.random.key(1))
    second = branch(tiny, first, [0], [10], key=jax.random.key(2))
    np.testing.assert_array_equal(second.tokens[0, :10], first.tokens[0, :10])
    np.testing.assert_array_equal(second.tokens[0, :4], roots.tokens[1, :4])


def test_branch_max_new_tokens_caps_the_total_response(tiny, roots):
    keys = jax.random.split(jax.random.key(6), 2)
    out = branch(tiny, roots, [1, 2], [3, 0], row_keys=keys, max_new_tokens=[10, 5])
    assert out.max_new_tokens.tolist() == [10, 5] and out.tokens.shape[1] == 10
    for i, (r, p, cap) in enumerate(zip([1, 2], [3, 0], [10, 5])):
        prefix = roots.sequence(r)[: roots.prompt_lengths[r] + p]
        scratch = generate(tiny, [prefix], PARAMS, row_keys=keys[i: i + 1], max_new_tokens=cap - p, max_len=64)
        n = scratch.lengths[0]
        assert out.lengths[i] == p + n <= cap
        np.testing.assert_array_equal(out.tokens[i, p: p + n], scratch.tokens[0, :n])
    with pytest.raises(ValueError, match="must exceed each branch position"):
        branch(tiny, roots, [1], [3], max_new_tokens=3)
    with pytest.raises(ValueError, match="exceeds the source cache length 64"):
        branch(tiny, roots, [1], [3], max_new_tokens=64)


def test_branch_keeps_the_cache_dtype(tiny):
    """A bf16-cache group branches in a bf16 cache: the continuation equals decoding from scratch
    with the same cache dtype."""
    roots = generate(tiny, [[3, 1, 4]], PARAMS, num_samples=2, key=jax.random.key(3), max_len=64,
                     cache_dtype=jnp.bfloat16)
    keys = jax.random.split(jax.random.key(4), 1)
    out = branch(tiny, roots, [1], [5], row_keys=keys)
    assert out.state.cache.dtype == jnp.bfloat16   # stored as its uint16 bits (models.cache)
    assert {x.dtype for x in jax.tree.leaves(out.state.cache)} == {jnp.dtype(jnp.uint16)}
    prefix = roots.sequence(1)[: roots.prompt_lengths[1] + 5]
    scratch = generate(tiny, [prefix], PARAMS, row_keys=keys, max_new_tokens=24 - 5, max_len=64,
                       cache_dtype=jnp.bfloat16)
    n = scratch.lengths[0]
    np.testing.assert_array_equal(out.tokens[0, 5: 5 + n], scratch.tokens[0, :n])


@pytest.mark.parametrize("rows, positions, match", [
    ([4], [0], "outside the 4 rollout rows"), ([0], [-1], "outside the response"),
    ([0], [24], "outside the response"), ([0, 1], [0], "equal length"),
])
def test_branch_rejects_bad_requests(tiny, roots, rows, positions, match):
    with pytest.raises(ValueError, match=match):
        branch(tiny, roots, rows, positions)
