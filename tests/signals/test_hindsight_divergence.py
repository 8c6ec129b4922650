"""HDL score and branch-point selection (spec §2) against float64 NumPy references."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hindsight.signals as signals
from ._reference import (assert_close, assert_digits, assert_finite_tree, bf16_round, gather,
                         jitted, log_softmax, random_logits, random_mask)

LOGP_ORIG = [-0.1, -0.5, -2.0, -0.2, -0.3, -1.5, -0.1, -0.05, -0.4, -0.2]
LOGP_HIND = [-0.1, -0.6, -0.2, -0.3, -1.9, -3.5, -2.2, -0.05, -0.3, -0.2]
SPEC_MASK = [1.0] * 9 + [0.0]


def ref_scores(logits, hind_logits, tokens, mask):
    lo = gather(log_softmax(logits), np.asarray(tokens))
    lh = gather(log_softmax(hind_logits), np.asarray(tokens))
    return np.abs(lh - lo) * np.asarray(mask, np.float64)


def ref_select(scores, mask, num_points, min_gap, tail_guard):
    """The spec's host-side NMS: sort descending (stable, ties -> lower t), accept if far enough."""
    scores, mask = np.asarray(scores, np.float64), np.asarray(mask) > 0
    out = np.full(scores.shape[:-1] + (num_points,), -1, np.int32)
    for row in np.ndindex(scores.shape[:-1]):
        length = int(mask[row].sum())
        elig = [t for t in range(scores.shape[-1])
                if mask[row][t] and 1 <= t <= length - 1 - tail_guard]
        picked = []
        for t in np.argsort(-scores[row], kind="stable"):
            if t in elig and all(abs(t - u) >= min_gap for u in picked):
                picked.append(int(t))
            if len(picked) == num_points:
                break
        out[row][: len(picked)] = picked
    return out


def test_spec_scores_and_picks():
    s = signals.hindsight_divergence_from_logprobs(jnp.array([LOGP_ORIG]), jnp.array([LOGP_HIND]),
                                                   jnp.array([SPEC_MASK]))
    assert_digits(s[0], [0, 0.1, 1.8, 0.1, 1.6, 2.0, 2.1, 0, 0.1, 0], 1)
    picks = signals.select_branch_points(s, jnp.array([SPEC_MASK]), num_points=2, min_gap=1,
                                         tail_guard=2)
    assert picks.dtype == jnp.int32
    np.testing.assert_array_equal(picks, [[6, 5]])
    picks3 = signals.select_branch_points(s, jnp.array([SPEC_MASK]), num_points=2, min_gap=3,
                                          tail_guard=2)
    np.testing.assert_array_equal(picks3, [[6, 2]])
    np.testing.assert_array_equal(signals.branch_counts(picks3), [[4, 3]])
    # Eligible t in {1..6}: asking for more points than survive returns -1.
    many = signals.select_branch_points(s, jnp.array([SPEC_MASK]), num_points=8, tail_guard=2)
    np.testing.assert_array_equal(many, [[6, 5, 2, 4, 1, 3, -1, -1]])
    np.testing.assert_array_equal(signals.branch_counts(jnp.array([[6, -1]])), [[4, 0]])


@pytest.mark.parametrize("shape", [(1, 4, 3), (3, 7, 11), (4, 12, 5)])
def test_divergence_matches_reference(shape):
    rng = np.random.default_rng(sum(shape))
    b, t, v = shape
    a, h = random_logits(rng, shape), random_logits(rng, shape)
    tokens = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
    mask = random_mask(rng, b, t)
    out = jitted(signals.hindsight_divergence)(a, h, tokens, mask)
    assert out.dtype == jnp.float32 and out.shape == (b, t)
    assert_close(out, ref_scores(a, h, tokens, mask))
    # a float 0/1 mask is the same mask
    assert_close(jitted(signals.hindsight_divergence)(a, h, tokens, mask.astype(jnp.float32)), out,
                 0, 0)


@pytest.mark.parametrize("num_points,min_gap,tail_guard", [(1, 1, 0), (2, 1, 2), (2, 3, 2),
                                                           (3, 2, 1), (4, 5, 8)])
def test_select_matches_reference(num_points, min_gap, tail_guard):
    rng = np.random.default_rng(num_points * 100 + min_gap * 10 + tail_guard)
    for b, t in [(5, 6), (6, 20)]:
        scores = jnp.asarray(rng.integers(0, 4, (b, t)) / 2.0, jnp.float32)  # many ties
        for right_padded in (True, False):
            mask = random_mask(rng, b, t, right_padded=right_padded)
            out = jitted(signals.select_branch_points, num_points=num_points, min_gap=min_gap,
                         tail_guard=tail_guard)(scores, mask)
            np.testing.assert_array_equal(out, ref_select(scores, mask, num_points, min_gap,
                                                          tail_guard))


def test_select_eligible_mask_and_short_rows():
    scores = jnp.array([[0.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0, 0.0]] * 3)
    mask = jnp.array([[1] * 8, [1] * 8, [1] * 3 + [0] * 5])
    eligible = jnp.array([[1] * 8, [1, 0, 1, 1, 1, 1, 1, 1], [1] * 8], bool)
    out = signals.select_branch_points(scores, mask, 2, 1, 2, eligible_mask=eligible)
    # row 2 has 3 tokens: only t = 0 survives the tail guard, and t = 0 is never eligible.
    np.testing.assert_array_equal(out, [[1, 2], [2, 3], [-1, -1]])


def test_jit_vmap_grad():
    rng = np.random.default_rng(0)
    b, t, v = 4, 9, 6
    a, h = random_logits(rng, (2, b, t, v)), random_logits(rng, (2, b, t, v))
    tokens = jnp.asarray(rng.integers(0, v, (2, b, t)), jnp.int32)
    mask = jnp.stack([random_mask(rng, b, t), random_mask(rng, b, t, right_padded=False)])
    eager = [jitted(signals.hindsight_divergence)(a[i], h[i], tokens[i], mask[i]) for i in range(2)]
    batched = jax.vmap(jax.jit(signals.hindsight_divergence))(a, h, tokens, mask)
    assert_close(batched, np.stack(eager), 1e-6, 1e-7)
    select = functools.partial(signals.select_branch_points, num_points=3, min_gap=2, tail_guard=1)
    picks = jax.jit(jax.vmap(select))(batched, mask)
    np.testing.assert_array_equal(picks, np.stack([select(eager[i], mask[i]) for i in range(2)]))
    # the score is a stop-gradient'ed signal: zero, finite gradient, also at +-1e4 logits
    big = jnp.asarray(np.sign(rng.normal(size=(b, t, v))) * 1e4, jnp.float32)
    grad = jax.jit(jax.grad(lambda x, *a: jnp.sum(signals.hindsight_divergence(x, *a))))
    for logits in (a[0], big):
        g = grad(logits, h[0], tokens[0], mask[0])
        assert_finite_tree(g)
        assert not np.any(np.asarray(g))
    assert_finite_tree(jitted(signals.hindsight_divergence)(big, -big, tokens[0], mask[0]))


def test_bf16_and_padding_invariance():
    rng = np.random.default_rng(1)
    b, t, v, pad = 3, 8, 7, 5
    a, h = random_logits(rng, (b, t, v)), random_logits(rng, (b, t, v))
    tokens = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
    mask = random_mask(rng, b, t)
    score = jitted(signals.hindsight_divergence)
    out = score(a, h, tokens, mask)
    bf = score(a.astype(jnp.bfloat16), h.astype(jnp.bfloat16), tokens, mask)
    assert bf.dtype == jnp.float32
    assert_close(bf, score(bf16_round(a), bf16_round(h), tokens, mask), 1e-6, 1e-6)
    assert_close(bf, out, 0, 0.1)
    cat = lambda x, y: jnp.concatenate([x, y], axis=1)
    a2, h2 = cat(a, random_logits(rng, (b, pad, v))), cat(h, random_logits(rng, (b, pad, v)))
    tok2 = cat(tokens, jnp.asarray(rng.integers(0, v, (b, pad)), jnp.int32))
    mask2 = cat(mask, jnp.zeros((b, pad), bool))
    out2 = score(a2, h2, tok2, mask2)
    np.testing.assert_array_equal(out2[:, :t], out)
    np.testing.assert_array_equal(out2[:, t:], 0)
    select = jitted(signals.select_branch_points, num_points=2, min_gap=2, tail_guard=1)
    np.testing.assert_array_equal(select(out2, mask2), select(out, mask))


def test_bad_input():
    x = jnp.zeros((2, 3, 5))
    tokens, mask = jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 3))
    with pytest.raises(ValueError, match="vocab mismatch.*hindsight_logits"):
        signals.hindsight_divergence(x, jnp.zeros((2, 3, 6)), tokens, mask)
    with pytest.raises(ValueError, match="`logits` must have rank 3"):
        signals.hindsight_divergence(x[0], x[0], tokens[0], mask[0])
    with pytest.raises(ValueError, match="`tokens` holds ids"):
        signals.hindsight_divergence(x, x, tokens + 5, mask)
    with pytest.raises(ValueError, match=r"`tokens` \(2, 3\), `mask` \(2, 4\)"):
        signals.hindsight_divergence(x, x, tokens, jnp.ones((2, 4)))
    with pytest.raises(ValueError, match="`mask` has shape"):
        signals.select_branch_points(jnp.zeros((2, 3)), jnp.ones((3, 2)))
    with pytest.raises(ValueError, match="`num_points` must be a static Python int"):
        signals.select_branch_points(jnp.zeros((2, 3)), mask, num_points=0)
    with pytest.raises(ValueError, match="`min_gap`"):
        signals.select_branch_points(jnp.zeros((2, 3)), mask, min_gap=0)


def test_select_branch_points_nan_scores_rank_lowest():
    import jax.numpy as jnp
    from hindsight.signals import select_branch_points
    scores = jnp.array([[0.0, jnp.nan, 0.5, jnp.nan, 0.1, 0.0, 0.0, 0.0],
                        [jnp.nan] * 8])
    got = select_branch_points(scores, jnp.ones((2, 8)), num_points=2, min_gap=1, tail_guard=2)
    assert got.tolist() == [[2, 4], [1, 2]]
