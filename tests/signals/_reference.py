"""Float64 NumPy helpers and shared fixtures-as-functions for the signal tests.

Written independently of ``hindsight``: plain loops and textbook formulas, float64 throughout.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

RTOL = 1e-5
ATOL = 1e-6


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def kl(lp, lq):
    """KL(p || q) over the last axis from log-probs."""
    return (np.exp(lp) * (lp - lq)).sum(-1)


def jsd(lt, ls, beta):
    """TRL convention: beta KL(T || M) + (1 - beta) KL(S || M), M = beta T + (1 - beta) S."""
    lm = np.logaddexp(lt + np.log(beta), ls + np.log(1 - beta))
    return beta * kl(lt, lm) + (1 - beta) * kl(ls, lm)


def gather(lp, tokens):
    return np.take_along_axis(lp, tokens[..., None], -1)[..., 0]


def f64(x):
    return np.asarray(x, np.float64)


def assert_close(actual, expected, rtol=RTOL, atol=ATOL):
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol)


def assert_digits(actual, expected, decimals):
    """``actual`` equals the spec's printed ``expected`` to ``decimals`` places."""
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=0,
                               atol=0.5 * 10.0 ** -decimals + 1e-7)


def random_logits(rng, shape, scale=2.0):
    return jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)


def random_mask(rng, b, t, *, right_padded=True):
    """Mask with an all-masked row 0, a one-token row 1 (when b > 2) and random lengths elsewhere."""
    if right_padded:
        lengths = rng.integers(1, t + 1, size=b)
        mask = np.arange(t)[None] < lengths[:, None]
    else:
        mask = rng.random((b, t)) < 0.7
    mask[0] = False
    if b > 2:
        mask[1] = False
        mask[1, 0] = True
    return jnp.asarray(mask)


def assert_finite_tree(tree):
    for leaf in jax.tree_util.tree_leaves(tree):
        assert np.all(np.isfinite(np.asarray(leaf, np.float64))), leaf


def bf16_round(x):
    """The float32 values a bf16 copy of ``x`` holds (so bf16 and f32 runs see the same numbers)."""
    return jnp.asarray(x, jnp.bfloat16).astype(jnp.float32)


@functools.lru_cache(maxsize=None)
def _jitted(fn, options):
    return jax.jit(functools.partial(fn, **dict(options)))


def jitted(fn, **options):
    """``jax.jit`` of ``fn`` with static keyword ``options`` (cached, so each shape compiles once;
    eager op-by-op dispatch is what makes JAX tests slow on CPU)."""
    return _jitted(fn, tuple(sorted(options.items())))
