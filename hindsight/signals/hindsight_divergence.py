"""HDL — Hindsight-Divergence Localization: where to branch a finished rollout (spec §2).

The score of position ``t`` is how much the hindsight context ``h`` (verifier feedback + reflection)
changes the log-prob of the realised token: ``s_t = |logp_hind_t - logp_orig_t| * mask_t`` [BRIEF].
Branch points are picked by greedy non-maximum suppression over eligible positions [OURS].

What stays with the rollout layer (``hindsight.rollout``), not here: the spec's production values
``tail_guard = 8`` and ``min_gap = d_min = max(16, floor(0.05 * len))`` (the contract defaults here,
``min_gap=1, tail_guard=2``, are the spec's toy-test values); the fallbacks when fewer than
``num_points`` positions are returned (relax ``d_min`` to 1, then uniform random eligible positions,
then fresh full rollouts from the prompt so the group stays at 16); sampling the continuations; the
suffix-only loss mask.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hindsight._validation import check_rank, check_same_shape, shape_of
from hindsight.signals._common import as_f32, as_valid, realised_logprobs

BRANCH_COUNTS = (4, 3)
"""Continuations per branch point, best first: ``2 roots x (1 + 4 + 3) = 16`` [BRIEF/OURS]."""


def hindsight_divergence_from_logprobs(logp: jax.Array, hindsight_logp: jax.Array,
                                       mask: jax.Array) -> jax.Array:
    """HDL score from realised-token log-probs (spec §2 step 1).

    Args:
      logp: ``[B, T]`` ``log pi_old(y_t | x, y_<t)`` (original context).
      hindsight_logp: ``[B, T]`` ``log pi_old(y_t | h, y_<t)`` (hindsight context).
      mask: ``[B, T]`` bool or 0/1 float.
    Returns:
      ``[B, T]`` float32 ``|hindsight_logp - logp|``, 0 on masked positions, stop-gradient'ed.
    """
    check_rank("logp", logp, min_rank=1)
    check_same_shape(("logp", "hindsight_logp"), logp, hindsight_logp)
    valid = as_valid(mask, logp, like_name="logp")
    diff = jnp.where(valid, as_f32(hindsight_logp) - as_f32(logp), 0.0)
    return jax.lax.stop_gradient(jnp.abs(diff))


def hindsight_divergence(logits: jax.Array, hindsight_logits: jax.Array, tokens: jax.Array,
                         mask: jax.Array, *, vocab_mask: jax.Array | None = None) -> jax.Array:
    """HDL score ``[B, T]`` from the two teacher-forced passes over the same response tokens.

    Args:
      logits: ``[B, T, V]`` under the original context ``x``.
      hindsight_logits: ``[B, T, V]`` under the hindsight context ``h``.
      tokens: ``[B, T]`` int response tokens (masked positions must still hold a valid id).
      mask: ``[B, T]`` bool or 0/1 float.
      vocab_mask: optional ``[V]`` bool for a padded vocabulary.
    Returns:
      ``[B, T]`` float32, 0 on masked positions, stop-gradient'ed.
    """
    lo, lh = realised_logprobs("logits", logits, "hindsight_logits", hindsight_logits, tokens, mask,
                               vocab_mask)
    return hindsight_divergence_from_logprobs(lo, lh, mask)


def _check_static_int(name: str, value, low: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
        raise ValueError(f"`{name}` must be a static Python int >= {low}, got {value!r}")
    return int(value)


def select_branch_points(scores: jax.Array, mask: jax.Array, num_points: int = 2, min_gap: int = 1,
                         tail_guard: int = 2, *,
                         eligible_mask: jax.Array | None = None) -> jax.Array:
    """Greedy non-maximum suppression over HDL scores (spec §2 steps 2-3, [OURS]).

    Eligible positions: ``mask[t]``, ``1 <= t <= len - 1 - tail_guard`` with ``len`` the number of
    valid tokens of the row (branching at 0 is a fresh sample; the tail guard leaves room for a
    suffix), and ``eligible_mask[t]`` if given. Picks are made one at a time: the highest eligible
    score (ties -> lowest index), then every position closer than ``min_gap`` to it is suppressed.
    This equals the spec's "sort descending, accept if ``>= d_min`` from every accepted one", but
    runs as a static loop of ``num_points`` argmaxes, so it is jittable (the spec allows host-side
    numpy).

    Args:
      scores: ``[..., T]`` float (e.g. :func:`hindsight_divergence`).
      mask: ``[..., T]`` bool or 0/1 float.
      num_points: ``K``, static.
      min_gap: static; accepted picks are at least this many positions apart (1 = no suppression).
      tail_guard: static; positions in the last ``tail_guard`` valid tokens are not eligible.
      eligible_mask: optional ``[..., T]`` bool from the caller (e.g. forbid the final answer).
    Returns:
      ``[..., K]`` int32 positions in descending score order; ``-1`` where fewer than ``K`` eligible
      positions survive (the rollout layer applies the fallbacks, see the module doc).
    """
    num_points = _check_static_int("num_points", num_points, 1)
    min_gap = _check_static_int("min_gap", min_gap, 1)
    tail_guard = _check_static_int("tail_guard", tail_guard, 0)
    check_rank("scores", scores, min_rank=1)
    valid = as_valid(mask, scores)
    s = jax.lax.stop_gradient(as_f32(scores))
    # A NaN score ranks lowest; left as NaN, `s == best` would match nothing and argmax would
    # return the ineligible position 0.
    s = jnp.where(jnp.isnan(s), -jnp.inf, s)
    t = jnp.arange(shape_of(scores)[-1])
    length = jnp.sum(valid, axis=-1, keepdims=True)
    eligible = valid & (t >= 1) & (t <= length - 1 - tail_guard)
    if eligible_mask is not None:
        eligible = eligible & as_valid(eligible_mask, scores, name="eligible_mask")
    picks = []
    for _ in range(num_points):
        best = jnp.max(jnp.where(eligible, s, -jnp.inf), axis=-1, keepdims=True)
        # argmax of a bool array is its first True: ties go to the lowest index, and an eligible
        # position whose score is itself -inf can still be picked.
        idx = jnp.argmax(eligible & (s == best), axis=-1)
        found = jnp.any(eligible, axis=-1)
        picks.append(jnp.where(found, idx, -1).astype(jnp.int32))
        eligible = eligible & (jnp.abs(t - idx[..., None]) >= min_gap)
    return jnp.stack(picks, axis=-1)


def branch_counts(branch_pos: jax.Array, counts: tuple[int, ...] = BRANCH_COUNTS) -> jax.Array:
    """Continuations assigned to each branch point (spec §2 step 4, [OURS] assignment).

    Args:
      branch_pos: ``[..., K]`` int from :func:`select_branch_points` (descending score, -1 = none).
      counts: static, one count per pick; the default gives the best point 4 and the other 3.
    Returns:
      ``[..., K]`` int32, ``counts[k]`` where a point was found, else 0 (the rollout layer replaces
      the missing continuations by fresh rollouts so the group size is unchanged).
    """
    if shape_of(branch_pos)[-1:] != (len(counts),):
        raise ValueError(f"`branch_pos` has shape {shape_of(branch_pos)} but `counts` has "
                         f"{len(counts)} entries; they must agree on K")
    return jnp.where(jnp.asarray(branch_pos) >= 0, jnp.asarray(counts, jnp.int32), 0)
