"""Neuron-OPSD's signals (other-methods §8) against float64 NumPy references and the spec's
hand-checked numbers: neuron scores, the per-chunk candidates and running top-K, ``N(x)``,
consensus, Jaccard distances, the bottom-fraction selection and the K-nearest retrieval."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.signals import (bottom_fraction, chunk_candidates, consensus, init_top,
                               jaccard_distances, merge_top, nearest, neuron_scores, union_mask)

SPEC_SETS = {"a": {1, 2, 3}, "b": {1, 2, 3, 4, 5, 6}, "c": {2, 3, 7}, "q": {1, 2, 3, 9}}


def masks(sets, size=10):
    out = np.zeros((len(sets), size), bool)
    for r, s in enumerate(sets):
        out[r, sorted(s)] = True
    return out


# ----------------------------------------------------------------------------- references

def ref_scores(k, w_down, e):
    """float64: ``S_i = k_i * sum_d w_down[i, d] e[d]``."""
    return np.asarray(k, np.float64) * np.einsum("...d,id->...i", np.asarray(e, np.float64),
                                                 np.asarray(w_down, np.float64))


def ref_neuron_set(scores, mask, *, per_layer, num_neurons, chunk):
    """``N(x)`` of one row from its per-layer scores ``[L, T, F]``: per chunk, per layer, the top
    ``per_layer`` (token, neuron) pairs, each neuron's max over its kept pairs, the chunk's top
    ``num_neurons`` over the layers; the union over the chunks. Returns a set of ``l * F + i``."""
    layers, t, f = scores.shape
    out = set()
    for lo in range(0, t, chunk):
        live = [p for p in range(lo, min(lo + chunk, t)) if mask[p]]
        best = {}
        for layer in range(layers):
            pairs = sorted(((scores[layer, p, i], i) for p in live for i in range(f)), reverse=True)
            for value, i in pairs[:per_layer]:
                key = layer * f + i
                best[key] = max(best.get(key, -np.inf), value)
        ranked = sorted(((v, k) for k, v in best.items()), reverse=True)
        out |= {key for _, key in ranked[:num_neurons]}
    return out


@functools.partial(jax.jit, static_argnames=("per_layer", "num_neurons", "chunk"))
def _fold(scores, mask, *, per_layer, num_neurons, chunk):
    layers, b, t, f = scores.shape
    values, ids = init_top(b, math.ceil(t / chunk), num_neurons=num_neurons)
    for layer in range(layers):
        cand = chunk_candidates(scores[layer], mask, neurons_per_layer=per_layer,
                                chunk_tokens=chunk)
        values, ids = merge_top(values, ids, cand, layer * f)
    return union_mask(values, ids, size=layers * f)


def run_fold(scores, mask, **kwargs):
    """The fold the decoder runs (chunk_candidates + merge_top per layer), then the union."""
    return np.asarray(_fold(jnp.asarray(scores), jnp.asarray(mask), **kwargs))


# ----------------------------------------------------------------------------- tests

def test_neuron_scores_match_float64():
    rng = np.random.default_rng(0)
    k = rng.normal(size=(2, 5, 12)).astype(np.float32)
    w = rng.normal(size=(12, 8)).astype(np.float32)
    e = rng.normal(size=(2, 5, 8)).astype(np.float32)
    got = neuron_scores(jnp.asarray(k), jnp.asarray(w), jnp.asarray(e))
    assert got.dtype == jnp.float32 and got.shape == (2, 5, 12)
    np.testing.assert_allclose(np.asarray(got), ref_scores(k, w, e), rtol=1e-5, atol=1e-5)
    # bf16 activations / kernel are read in float32
    got16 = neuron_scores(jnp.asarray(k, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16),
                          jnp.asarray(e))
    assert got16.dtype == jnp.float32
    ref16 = ref_scores(np.asarray(jnp.asarray(k, jnp.bfloat16), np.float32),
                       np.asarray(jnp.asarray(w, jnp.bfloat16), np.float32), e)
    np.testing.assert_allclose(np.asarray(got16), ref16, rtol=1e-5, atol=1e-5)


def test_chunk_candidates_dedup_by_max():
    """Chunk 0 keeps the top 3 pairs (neuron 1 twice: its max, 5.0; neuron 2: 4.0); chunk 1 has
    one live position; a fully masked chunk keeps nothing."""
    scores = np.full((1, 5, 3), -1.0, np.float32)
    scores[0, 0] = [0.0, 5.0, 4.0]
    scores[0, 1] = [1.0, 4.5, -2.0]
    scores[0, 2] = [9.0, 9.0, 9.0]  # masked: never counts
    scores[0, 3] = [0.5, 0.2, 0.1]
    mask = np.array([[1, 1, 0, 1, 0]], bool)
    got = np.asarray(chunk_candidates(jnp.asarray(scores), jnp.asarray(mask), neurons_per_layer=3,
                                      chunk_tokens=3))
    np.testing.assert_array_equal(got[0, 0], [-np.inf, 5.0, 4.0])
    np.testing.assert_array_equal(got[0, 1], np.float32([0.5, 0.2, 0.1]))
    none = np.asarray(chunk_candidates(jnp.asarray(scores), jnp.zeros((1, 5), bool),
                                       neurons_per_layer=3, chunk_tokens=3))
    assert np.all(np.isneginf(none))


@pytest.mark.parametrize("per_layer, num_neurons, chunk", [(5, 7, 4), (3, 50, 3), (100, 4, 16)])
def test_neuron_sets_match_float64(per_layer, num_neurons, chunk):
    """The in-loop fold equals the reference on random scores: an all-masked row, a one-token
    row, holes, a length that is no multiple of the chunk; more neurons than exist included."""
    rng = np.random.default_rng(per_layer)
    layers, b, t, f = 3, 4, 10, 6
    scores = rng.normal(size=(layers, b, t, f)).astype(np.float32)
    mask = np.ones((b, t), bool)
    mask[0] = False
    mask[1, 1:] = False
    mask[2, [2, 5, 6]] = False
    got = run_fold(scores, mask, per_layer=per_layer, num_neurons=num_neurons, chunk=chunk)
    assert got.shape == (b, layers * f) and got.dtype == bool
    for r in range(b):
        want = ref_neuron_set(scores[:, r].astype(np.float64), mask[r], per_layer=per_layer,
                              num_neurons=num_neurons, chunk=chunk)
        assert set(np.nonzero(got[r])[0]) == want, r
    assert not got[0].any()
    # N(x) does not depend on what masked positions hold
    noisy = np.where(mask[None, :, :, None], scores, 1e6).astype(np.float32)
    np.testing.assert_array_equal(run_fold(noisy, mask, per_layer=per_layer,
                                           num_neurons=num_neurons, chunk=chunk), got)


def test_merge_top_keeps_the_k_best_with_their_ids():
    values, ids = init_top(1, 1, num_neurons=3)
    values, ids = merge_top(values, ids, jnp.asarray([[[0.5, -np.inf, 2.0]]]), 0)
    values, ids = merge_top(values, ids, jnp.asarray([[[1.0, 3.0, 0.1]]]), 3)
    np.testing.assert_array_equal(np.asarray(values)[0, 0], [3.0, 2.0, 1.0])
    np.testing.assert_array_equal(np.asarray(ids)[0, 0], [4, 2, 3])
    assert set(np.nonzero(np.asarray(union_mask(values, ids, size=6))[0])[0]) == {2, 3, 4}


def test_spec_numbers():
    """Spec §8: s = 3/6/3/4; J(q,a)=0.25, J(q,b)=0.5714, J(q,c)=0.6; q's nearest is a."""
    sets = masks([SPEC_SETS[k] for k in "abcq"])
    np.testing.assert_array_equal(np.asarray(consensus(jnp.asarray(sets))), [3, 6, 3, 4])
    d = np.asarray(jaccard_distances(jnp.asarray(sets[3:]), jnp.asarray(sets)))
    np.testing.assert_allclose(d[0], [0.25, 4 / 7, 0.6, 0.0], rtol=1e-6, atol=1e-7)
    assert round(float(d[0, 1]), 4) == 0.5714
    itself = jnp.asarray([3])
    np.testing.assert_array_equal(np.asarray(nearest(jnp.asarray(d), k=1, exclude=itself)), [[0]])
    # capped at the 3 other items, nearest first
    np.testing.assert_array_equal(np.asarray(nearest(jnp.asarray(d), k=10, exclude=itself)),
                                  [[0, 1, 2]])
    # the bottom half of the pool by s: a and c (ties by index)
    np.testing.assert_array_equal(np.asarray(bottom_fraction(jnp.asarray([3, 6, 3, 4]),
                                                             fraction=0.5)), [0, 2])


def test_sets_match_float64_sets():
    rng = np.random.default_rng(3)
    a = rng.random((5, 40)) < 0.3
    b = rng.random((7, 40)) < 0.2
    a[0] = False
    b[0] = False  # two empty sets: distance 0
    b[1] = a[1]
    d = np.asarray(jaccard_distances(jnp.asarray(a), jnp.asarray(b)))
    for i in range(5):
        for j in range(7):
            sa, sb = set(np.nonzero(a[i])[0]), set(np.nonzero(b[j])[0])
            want = 1.0 - len(sa & sb) / len(sa | sb) if sa | sb else 0.0
            assert abs(d[i, j] - want) < 1e-6, (i, j)
    assert d[1, 1] == 0.0
    np.testing.assert_array_equal(np.asarray(consensus(jnp.asarray(a))), a.sum(-1))
    assert jax.jit(jaccard_distances)(a, b).shape == (5, 7)


def test_bottom_fraction_and_nearest_match_numpy():
    rng = np.random.default_rng(4)
    s = rng.integers(0, 6, 23)
    for fraction in (0.2, 0.5, 1.0):
        got = np.asarray(bottom_fraction(jnp.asarray(s), fraction=fraction))
        np.testing.assert_array_equal(got, np.argsort(s, kind="stable")[:math.ceil(fraction * 23)])
    assert len(np.asarray(bottom_fraction(jnp.asarray(s), fraction=0.2))) == 5
    d = rng.integers(0, 4, (3, 9)).astype(np.float32)
    got = np.asarray(nearest(jnp.asarray(d), k=4, exclude=jnp.asarray([2, -1, 8])))
    for r, self_index in enumerate([2, -1, 8]):
        order = [j for j in np.argsort(d[r], kind="stable") if j != self_index]
        np.testing.assert_array_equal(got[r], order[:4])


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="neurons_per_layer"):
        chunk_candidates(jnp.zeros((1, 2, 3)), jnp.ones((1, 2)), neurons_per_layer=0)
    with pytest.raises(ValueError, match="mask"):
        chunk_candidates(jnp.zeros((1, 2, 3)), jnp.ones((1, 3)))
    with pytest.raises(ValueError, match="down_kernel"):
        neuron_scores(jnp.zeros((2, 4)), jnp.zeros((5, 3)), jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match="same N"):
        jaccard_distances(jnp.zeros((1, 3), bool), jnp.zeros((1, 4), bool))
    with pytest.raises(ValueError, match="fraction"):
        bottom_fraction(jnp.zeros(4), fraction=0.0)
    with pytest.raises(ValueError, match="no neighbour"):
        nearest(jnp.zeros((1, 1)), exclude=jnp.asarray([0]))
