"""Segment reductions over the turns of multi-turn rows (spec ``other-methods.md`` §0:
``turn_id [B, T]`` is the turn index on policy tokens and -1 elsewhere): what the turn-level
methods (GRSD's turn gap, TurnOPD's per-turn KL and token mass, ATOD's turn weights) build on.

Every function is a pure ``[B, T]`` / ``[B, K]`` transform, jit / vmap / grad safe: positions
outside ``[0, K)`` (observations, padding) are excluded *before* any sum or divide, so NaN there
changes nothing, and an empty turn gives 0, never NaN, in values and gradients.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def _members(turn_id: jax.Array, num_turns: int) -> jax.Array:
    """``[B, T, K]`` bool: position t belongs to turn k."""
    if isinstance(num_turns, bool) or not isinstance(num_turns, int) or num_turns < 1:
        raise ValueError(f"`num_turns` must be a positive int, got {num_turns!r}")
    return turn_id[..., None] == jnp.arange(num_turns, dtype=turn_id.dtype)


def turn_sums(x: jax.Array, turn_id: jax.Array, *, num_turns: int) -> tuple[jax.Array, jax.Array]:
    """Per-turn sums and token counts.

    Args:
      x: ``[B, T]`` values (any float dtype; accumulated in float32).
      turn_id: ``[B, T]`` int, the turn of each position, -1 (or anything outside
        ``[0, num_turns)``) where it belongs to no turn.
      num_turns: ``K``.
    Returns:
      ``(sums [B, K], counts [B, K])`` float32.
    """
    members = _members(turn_id, num_turns)
    x = jnp.where(members, x.astype(jnp.float32)[..., None], 0.0)
    return x.sum(axis=-2), members.sum(axis=-2).astype(jnp.float32)


def turn_mean(x: jax.Array, turn_id: jax.Array, *, num_turns: int) -> jax.Array:
    """``[B, K]`` float32 mean of ``x`` over each turn's positions (0 for an empty turn): GRSD's
    ``mean_{t in turn}``, TurnOPD's ``K̄_t``."""
    sums, counts = turn_sums(x, turn_id, num_turns=num_turns)
    return jnp.where(counts > 0, sums / jnp.maximum(counts, 1.0), 0.0)


def to_tokens(values: jax.Array, turn_id: jax.Array) -> jax.Array:
    """``[B, T]`` float32: each position gets its turn's value from ``values [B, K]`` (a per-turn
    advantage broadcast to the turn's tokens), 0 where ``turn_id`` is outside ``[0, K)``."""
    k = values.shape[-1]
    valid = (turn_id >= 0) & (turn_id < k)
    picked = jnp.take_along_axis(values.astype(jnp.float32), jnp.clip(turn_id, 0, k - 1), axis=-1)
    return jnp.where(valid, picked, 0.0)


def trajectory_minmax(values: jax.Array, valid: jax.Array, *, eps: float = 1e-6) -> jax.Array:
    """``[B, K]`` float32: each trajectory's valid turn values rescaled to ``[0, 1]`` by its own
    min and max, ``(v - min) / (max - min + eps)``; 0 on invalid turns, and 0 for every turn of a
    trajectory whose valid values are all equal (or that has one valid turn or none)."""
    v = values.astype(jnp.float32)
    valid = valid.astype(bool)
    lo = jnp.min(jnp.where(valid, v, jnp.inf), axis=-1, keepdims=True)
    hi = jnp.max(jnp.where(valid, v, -jnp.inf), axis=-1, keepdims=True)
    spread = jnp.where(jnp.isfinite(hi - lo), hi - lo, 0.0)
    scaled = (jnp.where(valid, v, 0.0) - jnp.where(jnp.isfinite(lo), lo, 0.0)) / (spread + eps)
    return jnp.where(valid & (spread > 0), scaled, 0.0)


def turn_valid(turn_id: jax.Array, *, num_turns: int) -> jax.Array:
    """``[B, K]`` bool: the turn has at least one position."""
    return _members(turn_id, num_turns).any(axis=-2)


def turn_table(x: jax.Array, turn_id: jax.Array, valid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-turn sums and token counts indexed by turn id, for ids in ``[0, T)`` (the wave-2
    contract's convention), in ``O(B * T)`` memory (a segment sum, not a ``[B, T, K]`` one-hot).

    Args:
      x: ``[B, T]`` values (read only where ``valid``: garbage elsewhere never leaks).
      turn_id: ``[B, T]`` int; valid: ``[B, T]`` bool, the positions that belong to their turn.
    Returns:
      ``(sums [B, T], counts [B, T])`` float32: entry ``[b, k]`` is turn ``k`` of row ``b``.
    """
    b, t = turn_id.shape
    valid = valid & (turn_id >= 0) & (turn_id < t)
    seg = jnp.where(valid, jnp.arange(b, dtype=jnp.int32)[:, None] * t + turn_id, b * t)
    values = jnp.where(valid, x.astype(jnp.float32), 0.0)
    sums = jax.ops.segment_sum(values.reshape(-1), seg.reshape(-1), num_segments=b * t + 1)
    counts = jax.ops.segment_sum(valid.astype(jnp.float32).reshape(-1), seg.reshape(-1),
                                 num_segments=b * t + 1)
    return sums[:-1].reshape(b, t), counts[:-1].reshape(b, t)

