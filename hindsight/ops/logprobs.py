"""Log-softmax, gathered token log-probs and entropy over the vocabulary axis.

Every function upcasts its input to float32 *before* any reduction, so bf16 logits are accumulated in
float32. Padded vocabulary entries (``vocab_mask[v] == False``) are set to ``PAD_LOGIT`` (a large
finite negative number, not ``-inf``, so that ``0 * logit`` never produces NaN in the backward pass).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight._validation import check_leading, check_rank, check_tokens_in_vocab, shape_of

PAD_LOGIT = -1e9
"""Logit given to padded vocabulary entries."""

LOGP_FLOOR = -1e4
"""Log-probabilities below this are treated as exact zeros of probability in KL-type sums."""


def carries_mass(logp: jax.Array) -> jax.Array:
    """Entries of float32 log-probs that carry probability in KL / entropy sums: not
    ``<= LOGP_FLOOR``, so an entry at ``-inf`` drops out while a NaN one stays (and makes the sum
    NaN instead of vanishing from it)."""
    return jnp.logical_not(logp <= LOGP_FLOOR)


def carry_nonfinite(value: jax.Array, x: jax.Array) -> jax.Array:
    """``value`` where ``x`` is finite, NaN where it is not (``value + 0 * x``, gradient 0 for x).

    For estimators that clip a log-ratio: a clip turns an infinite log-prob into a finite loss
    whose gradient is NaN (the log-softmax of an infinite logit), which would hide a non-finite
    model output behind a finite value. ``value`` and ``x`` broadcast together.
    """
    return value + 0.0 * jnp.asarray(x).astype(jnp.float32)


def masked_logits(logits: jax.Array, vocab_mask: jax.Array | None = None) -> jax.Array:
    """Float32 copy of `logits [..., V]` with padded vocabulary entries set to ``PAD_LOGIT``.

    Args:
      logits: ``[..., V]`` any float dtype.
      vocab_mask: optional ``[V]`` bool, True for real vocabulary entries.
    Returns:
      ``[..., V]`` float32.
    """
    check_rank("logits", logits, min_rank=1)
    x = jnp.asarray(logits).astype(jnp.float32)
    if vocab_mask is None:
        return x
    if shape_of(vocab_mask) != shape_of(logits)[-1:]:
        raise ValueError(f"`vocab_mask` must have shape {shape_of(logits)[-1:]} to match `logits` "
                         f"{shape_of(logits)}, got {shape_of(vocab_mask)}")
    return jnp.where(jnp.asarray(vocab_mask, bool), x, PAD_LOGIT)


def log_softmax(logits: jax.Array, *, vocab_mask: jax.Array | None = None) -> jax.Array:
    """Float32 log-softmax over the last axis. ``[..., V] -> [..., V]``."""
    return jax.nn.log_softmax(masked_logits(logits, vocab_mask), axis=-1)


def token_logprobs(logits: jax.Array, tokens: jax.Array, *,
                   vocab_mask: jax.Array | None = None) -> jax.Array:
    """Log-probability of `tokens` under `logits`, without materialising the full log-softmax.

    Args:
      logits: ``[..., V]``.
      tokens: ``[...]`` int, ids in ``[0, V)`` (checked when concrete; masked positions must still hold
        a valid id, e.g. the pad id).
      vocab_mask: optional ``[V]`` bool.
    Returns:
      ``[...]`` float32, ``log softmax(logits)[..., tokens]``.
    """
    check_rank("tokens", tokens, rank=len(shape_of(logits)) - 1)
    check_leading("tokens", tokens, shape_of(logits)[:-1], "logits[..., :-1]")
    check_tokens_in_vocab("tokens", tokens, shape_of(logits)[-1])
    x = masked_logits(logits, vocab_mask)
    picked = jnp.take_along_axis(x, tokens[..., None].astype(jnp.int32), axis=-1, mode="fill",
                                 fill_value=jnp.nan)[..., 0]
    return picked - jax.nn.logsumexp(x, axis=-1)


def entropy(logits: jax.Array, *, vocab_mask: jax.Array | None = None) -> jax.Array:
    """Shannon entropy (nats) of ``softmax(logits)``. ``[..., V] -> [...]`` float32."""
    return entropy_from_logprobs(log_softmax(logits, vocab_mask=vocab_mask))


def entropy_from_logprobs(logp: jax.Array) -> jax.Array:
    """Entropy from float32 log-probs ``[..., V] -> [...]``; entries at or below ``LOGP_FLOOR`` count
    as 0 (NaN ones do not: they make the entropy NaN)."""
    live = carries_mass(logp)
    safe = jnp.where(live, logp, 0.0)
    return -jnp.sum(jnp.where(live, jnp.exp(safe) * safe, 0.0), axis=-1)
