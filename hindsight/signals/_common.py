"""Shared plumbing for the credit signals: mask handling, masked ``(sum, count)`` reductions, and the
realised-token log-probs every ``[B, T]`` signal starts from.

Kept private: the public functions validate their own arguments by name and call these helpers.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight._validation import (check_leading, check_rank, check_same_shape, check_vocab_match,
                                   shape_of)
from hindsight.ops import token_logprobs

LOGP_TARGET_FLOOR = -50.0
"""Log-probs entering a constructed target (PMI residual, geometric mixture) are floored here so that
near-zero probabilities stay finite (spec §5 step 1, §6 edge cases)."""


def as_valid(mask, like, *, name: str = "mask", like_name: str = "scores") -> jax.Array:
    """Bool validity mask from ``mask`` (bool or 0/1 float), checked to have the shape of ``like``
    (an array, or a shape tuple)."""
    expected = like if isinstance(like, tuple) else shape_of(like)
    if shape_of(mask) != expected:
        raise ValueError(f"`{name}` has shape {shape_of(mask)}, expected {expected} to match "
                         f"`{like_name}`")
    return jnp.asarray(mask) > 0


def as_f32(x) -> jax.Array:
    """Float32 view of a log-prob / gap array (bf16 inputs are upcast before any arithmetic)."""
    return jnp.asarray(x).astype(jnp.float32)


def valid_logits(logits, valid: jax.Array) -> jax.Array:
    """Float32 ``logits [B, T, V]`` with masked positions (``valid [B, T]`` False) replaced by 0
    before any exp/log: padding may hold anything (NaN included), and a masked position's NaN
    would reach the gradient through ``0 * NaN`` in the softmax's backward pass."""
    return jnp.where(valid[..., None], as_f32(logits), 0.0)


def masked_sum_count(per_token: jax.Array, valid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(sum over valid positions, number of valid positions)``, both float32 scalars.

    The divide (``token_mean = sum / max(count, 1)``) is left to the caller so that means are exact
    across micro-batches and devices (design.md, objectives contract).
    """
    total = jnp.sum(jnp.where(valid, per_token, 0.0))
    return total, jnp.sum(valid.astype(jnp.float32))


def sdar_per_token(gate, teacher_logp, student_logp, valid: jax.Array) -> jax.Array:
    """Per-token SDAR loss ``sg(g) (sg(logp_T) - logp_S)`` (``compute_sdar_loss``), ``[B, T]``
    float32: its value is ``g (logp_T - logp_S)``, its gradient ``-g grad logp_S``; masked
    positions are selected away before anything else (0 there)."""
    sg = jax.lax.stop_gradient
    g = sg(jnp.where(valid, as_f32(gate), 0.0))
    ls = jnp.where(valid, as_f32(student_logp), 0.0)
    return g * (sg(jnp.where(valid, as_f32(teacher_logp), 0.0)) - ls)


def check_pair(name_a: str, logits_a, name_b: str, logits_b, tokens, mask) -> None:
    """Validate ``[B, T, V]`` logits pairs with ``tokens [B, T]`` and ``mask [B, T]``."""
    check_rank(name_a, logits_a, rank=3)
    check_vocab_match(name_a, logits_a, name_b, logits_b)
    check_rank("tokens", tokens, rank=2)
    check_leading("tokens", tokens, shape_of(logits_a)[:-1], f"{name_a}[..., :-1]")
    check_same_shape(("tokens", "mask"), tokens, mask)


def realised_logprobs(name_a: str, logits_a, name_b: str, logits_b, tokens, mask, vocab_mask
                      ) -> tuple[jax.Array, jax.Array]:
    """Validated, stop-gradient'ed realised-token log-probs ``[B, T]`` under two logits tensors."""
    check_pair(name_a, logits_a, name_b, logits_b, tokens, mask)
    la = token_logprobs(jax.lax.stop_gradient(logits_a), tokens, vocab_mask=vocab_mask)
    lb = token_logprobs(jax.lax.stop_gradient(logits_b), tokens, vocab_mask=vocab_mask)
    return la, lb
