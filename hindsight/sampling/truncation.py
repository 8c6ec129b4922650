"""Temperature / top-k / top-p / min-p truncation and the per-row draw (pure functions).

The sampler returns two log-probs per token: the one of the distribution it actually sampled from
(after temperature and truncation, renormalised; what an off-policy correction for the sampler needs)
and the untruncated policy log-prob at the sampling temperature (``log_softmax(logits / T)[token]``,
temperature 1 for greedy decoding). The second is what the trainer's ``logp`` at loss temperature
``T`` gives for the same weights, so ``exp(new - old)`` is an importance ratio that is exactly 1
before the first update: truncation (top-k/p, min-p) raises the sampled token's probability, and a
ratio against the truncated log-prob would start below 1 and clip tokens of an on-policy batch.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight.sampling.params import SamplingParams

_NEG = -jnp.inf


def _scaled(logits: jax.Array, temperature: float) -> jax.Array:
    """``(logits - max) / T`` in float32: the distribution of ``logits / T`` (softmax is shift
    invariant), written so that it cannot overflow at any ``T > 0``. Every entry is ``<= 0`` and
    the largest is exactly 0, so the most likely token keeps weight ``exp(0) = 1`` however small
    ``T`` is (as ``T -> 0`` the others go to ``-inf``: sampling becomes greedy smoothly), where
    ``logits / T`` overflows to ``inf`` (NaN weights, impossible tokens) once ``|logit / T|``
    passes float32's range."""
    x = logits.astype(jnp.float32)
    x = x - jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
    return x if temperature == 1.0 else x / temperature


def _order_keys(x: jax.Array) -> jax.Array:
    """Map float32 ``x`` to uint32 keys with the same order (so thresholds can be bisected exactly)."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))


def _bisect(pred, shape) -> jax.Array:
    """Per-row smallest uint32 ``t`` with ``pred(t)`` true, for ``pred`` monotone (false ... true)
    and true at ``0xFFFFFFFF``; 32 halvings of the key range, exact."""
    def body(_, lh):
        lo, hi = lh
        mid = lo + (hi - lo) // 2
        ok = pred(mid)
        return jnp.where(ok, lo, mid + 1), jnp.where(ok, mid, hi)

    lo = jnp.zeros(shape, jnp.uint32)
    hi = jnp.full(shape, 0xFFFFFFFF, jnp.uint32)
    return jax.lax.fori_loop(0, 32, body, (lo, hi))[1]


def _top_k_mask(keys: jax.Array, k: int) -> jax.Array:
    """Keep entries ``>=`` the k-th largest (ties at the boundary kept): the threshold is the
    smallest t with fewer than k entries above it."""
    t = _bisect(lambda t: jnp.sum(keys > t[:, None], axis=-1) < k, keys.shape[:1])
    return keys >= t[:, None]


def _top_p_mask(x: jax.Array, keys: jax.Array, top_p: float) -> jax.Array:
    """Keep token i iff the probability mass strictly above it is ``< top_p`` (so the most likely
    token is always kept and ties at the boundary stay together)."""
    probs = jax.nn.softmax(x, axis=-1)
    t = _bisect(lambda t: jnp.sum(jnp.where(keys > t[:, None], probs, 0.0), axis=-1) < top_p, keys.shape[:1])
    return keys >= t[:, None]


def truncated_logits(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """Scaled and truncated logits: ``[B,V]`` float -> ``[B,V]`` float32 with ``-inf`` off-support.

    ``log_softmax`` of the result is the log-distribution the sampler draws from. Not defined for
    greedy params (``temperature == 0``); see :func:`sample_tokens`.

    Top-k and top-p thresholds are found by bisection over the float order (32 passes of a
    compare-and-reduce over the vocabulary) instead of a sort: on CPU ``lax.top_k`` and a full sort of
    a 49k vocabulary cost seconds per step at batch 64, the bisection milliseconds.
    """
    if params.greedy:
        raise ValueError("truncated_logits needs temperature > 0 (greedy decoding has no distribution)")
    x = _scaled(logits, params.temperature)
    if params.top_k or params.top_p < 1.0:
        keys = _order_keys(x)
        if params.top_k:
            x = jnp.where(_top_k_mask(keys, params.top_k), x, _NEG)
        if params.top_p < 1.0:
            x = jnp.where(_top_p_mask(x, keys, params.top_p), x, _NEG)
    if params.min_p > 0.0:
        logp = jax.nn.log_softmax(x, axis=-1)
        floor = jnp.max(logp, axis=-1, keepdims=True) + jnp.log(params.min_p)
        x = jnp.where(logp >= floor, x, _NEG)
    return x


def sampling_logprobs(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """Log-probabilities ``[B,V]`` float32 of the distribution sampled from (``-inf`` off-support)."""
    return jax.nn.log_softmax(truncated_logits(logits, params), axis=-1)


_BLOCK = 256


def _first_above(cum: jax.Array, target: jax.Array) -> jax.Array:
    """Index of the first entry of the non-decreasing ``cum [B,N]`` that exceeds ``target [B]``."""
    return jnp.minimum(jnp.sum(cum <= target[:, None], axis=-1), cum.shape[-1] - 1)


def draw(weights: jax.Array, uniforms: jax.Array) -> jax.Array:
    """Exact categorical draw by a two-level inverse CDF.

    Args:
      weights: ``[B,V]`` non-negative unnormalised probabilities (at least one positive per row).
      uniforms: ``[B,2]`` independent U[0,1): the first picks a block of ``_BLOCK`` tokens with
        probability equal to its mass, the second a token inside it with its conditional probability.
    Returns:
      ``[B]`` int32 token ids (never one with zero weight).

    Why not ``jax.random.categorical``: it draws V Gumbel variates per row, and generating
    ``B * V`` threefry numbers costs far more than the model step on CPU; this needs two per row and
    two short cumulative sums.
    """
    b, v = weights.shape
    nb = -(-v // _BLOCK)
    blocks = jnp.pad(weights, ((0, 0), (0, nb * _BLOCK - v))).reshape(b, nb, _BLOCK)
    block_cum = jnp.cumsum(jnp.sum(blocks, axis=-1), axis=-1)
    bi = _first_above(block_cum, uniforms[:, 0] * block_cum[:, -1])
    inner_cum = jnp.cumsum(jnp.take_along_axis(blocks, bi[:, None, None], axis=1)[:, 0], axis=-1)
    ti = _first_above(inner_cum, uniforms[:, 1] * inner_cum[:, -1])
    return (bi * _BLOCK + ti).astype(jnp.int32)


def _gather(x: jax.Array, tokens: jax.Array) -> jax.Array:
    return jnp.take_along_axis(x, tokens[:, None], axis=-1)[:, 0]


def sample_tokens(logits: jax.Array, keys: jax.Array, params: SamplingParams):
    """Draw one token per row.

    Args:
      logits: ``[B,V]`` model logits for the next position.
      keys: ``[B]`` typed PRNG keys, one per row (a row's draw never depends on another row's key).
      params: static sampling parameters.
    Returns:
      ``(tokens [B] int32, logprobs [B] f32, policy_logprobs [B] f32)``: the sampled ids, their
      log-prob under the sampled (truncated) distribution (0 for greedy) and under the untruncated
      policy at temperature ``params.temperature`` (1 for greedy).
    """
    logits = logits.astype(jnp.float32)
    scaled = _scaled(logits, params.policy_temperature)
    policy_lse = jax.nn.logsumexp(scaled, axis=-1)
    if params.greedy:
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        lp = jnp.zeros(tokens.shape, jnp.float32)
    else:
        x = truncated_logits(logits, params)
        top = jnp.max(x, axis=-1, keepdims=True)
        weights = jnp.exp(x - top)
        uniforms = jax.vmap(lambda k: jax.random.uniform(k, (2,)))(keys)
        tokens = draw(weights, uniforms)
        lp = _gather(x, tokens) - (top[:, 0] + jnp.log(jnp.sum(weights, axis=-1)))
    return tokens, lp, _gather(scaled, tokens) - policy_lse
