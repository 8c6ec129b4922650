"""DemoPSD — disagreement-modulated geometric (reverse-KL barycenter) target (spec §6).

Verified [V-page]: the target is a weighted geometric combination of teacher and student, the blend
set per token from the teacher-student discrepancy (more student weight on strong disagreement, read
as privileged-information leakage), stop-gradient target, reverse KL. ``alpha_max = 0.15``, the beta
sweep, JSD as the discrepancy and the rescaled sigmoid are [BRIEF]; the exact form
``alpha = alpha_max * (2 sigmoid(beta d) - 1)``, ``beta = 25`` and the full-vocabulary estimator are
OUR CHOICE.

Barycenter identity (derived, checked in the tests): ``argmin_q (1 - a) KL(q || T) + a KL(q || S)``
is ``q ∝ T^(1 - a) S^a``.

Not implemented here: the spec's memory options (student top-100 + tail bucket; sampled-token KL
fallback) and the SDPO-inherited EMA teacher / IS clip, which belong to the chunked path and the
method.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight._validation import check_rank, check_same_shape, check_vocab_match, shape_of
from hindsight.ops import generalized_jsd_from_logprobs, kl_from_logprobs, log_softmax
from hindsight.signals._common import (LOGP_TARGET_FLOOR, as_f32, as_valid, masked_sum_count,
                                       valid_logits)


def disagreement_alpha(d: jax.Array, *, alpha_max: float = 0.15, beta: float = 25.0) -> jax.Array:
    """Student weight ``alpha_max * (2 sigmoid(beta d) - 1)`` (spec §6 step 2), written as the
    identical ``alpha_max * tanh(beta d / 2)`` for precision near ``d = 0``. ``[...] -> [...]``."""
    return alpha_max * jnp.tanh(0.5 * beta * jnp.maximum(as_f32(d), 0.0))


def geometric_target_from_logprobs(teacher_logp: jax.Array, student_logp: jax.Array,
                                   alpha: jax.Array, *, floor: float = LOGP_TARGET_FLOOR,
                                   vocab_mask: jax.Array | None = None) -> jax.Array:
    """``log q = log_softmax((1 - alpha) lT + alpha lS)`` (spec §6 step 3), stop-gradient'ed.

    Args:
      teacher_logp, student_logp: ``[..., V]`` float log-probs.
      alpha: ``[...]`` (or a scalar) student weight in ``[0, 1]``.
      floor: both log-probs are floored here first, so a one-hot teacher never meets ``-inf * 0``.
      vocab_mask: optional ``[V]`` bool.
    Returns:
      ``[..., V]`` float32.
    """
    check_same_shape(("teacher_logp", "student_logp"), teacher_logp, student_logp)
    a = jnp.asarray(as_f32(alpha))[..., None]
    lt = jnp.maximum(as_f32(teacher_logp), floor)
    ls = jnp.maximum(as_f32(student_logp), floor)
    return jax.lax.stop_gradient(log_softmax((1.0 - a) * lt + a * ls, vocab_mask=vocab_mask))


def barycenter_target_from_logprobs(teacher_logp: jax.Array, student_logp: jax.Array, *,
                                    alpha_max: float = 0.15, beta: float = 25.0,
                                    floor: float = LOGP_TARGET_FLOOR,
                                    vocab_mask: jax.Array | None = None
                                    ) -> tuple[jax.Array, jax.Array]:
    """DemoPSD target and its blend from float32 log-probs (spec §6 steps 1-3).

    ``d = JSD_0.5(T, S)`` (natural log, in ``[0, ln 2]``), ``alpha = disagreement_alpha(d)``,
    ``log q = log_softmax((1 - alpha) lT + alpha lS)``; everything stop-gradient'ed.

    Args:
      teacher_logp, student_logp: ``[..., V]``.
      alpha_max, beta: see :func:`disagreement_alpha`.
      floor, vocab_mask: see :func:`geometric_target_from_logprobs`.
    Returns:
      ``(log_q [..., V], alpha [...])`` float32.
    """
    check_rank("teacher_logp", teacher_logp, min_rank=1)
    check_same_shape(("teacher_logp", "student_logp"), teacher_logp, student_logp)
    lt = jax.lax.stop_gradient(as_f32(teacher_logp))
    ls = jax.lax.stop_gradient(as_f32(student_logp))
    alpha = disagreement_alpha(generalized_jsd_from_logprobs(ls, lt, 0.5), alpha_max=alpha_max,
                               beta=beta)
    return geometric_target_from_logprobs(lt, ls, alpha, floor=floor, vocab_mask=vocab_mask), alpha


def barycenter_target(teacher_logits: jax.Array, student_logits: jax.Array, *,
                      alpha_max: float = 0.15, beta: float = 25.0, floor: float = LOGP_TARGET_FLOOR,
                      vocab_mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """DemoPSD target from teacher (privileged) and student logits (spec §6).

    Args:
      teacher_logits, student_logits: ``[B, T, V]``.
      alpha_max, beta, floor, vocab_mask: see :func:`barycenter_target_from_logprobs`.
    Returns:
      ``(log_q [B, T, V], alpha [B, T])`` float32, stop-gradient'ed. Recompute per micro-step: the
      target contains the current student.
    """
    check_vocab_match("teacher_logits", teacher_logits, "student_logits", student_logits)
    return barycenter_target_from_logprobs(log_softmax(teacher_logits, vocab_mask=vocab_mask),
                                           log_softmax(student_logits, vocab_mask=vocab_mask),
                                           alpha_max=alpha_max, beta=beta, floor=floor,
                                           vocab_mask=vocab_mask)


def barycenter_kl_from_logprobs(student_logp: jax.Array, teacher_logp: jax.Array,
                                **target_options) -> jax.Array:
    """Per-position DemoPSD loss ``KL(S || q)`` over the full vocabulary (spec §6 step 4).

    Args:
      student_logp: ``[..., V]`` (carries the gradient; the target uses a detached copy).
      teacher_logp: ``[..., V]`` (no gradient).
      **target_options: keywords of :func:`barycenter_target_from_logprobs`.
    Returns:
      ``[...]`` float32.
    """
    log_q, _ = barycenter_target_from_logprobs(teacher_logp, student_logp, **target_options)
    return kl_from_logprobs(as_f32(student_logp), log_q)


def barycenter_loss(teacher_logits: jax.Array, student_logits: jax.Array, mask: jax.Array,
                    **target_options) -> tuple[jax.Array, jax.Array]:
    """DemoPSD loss ``(sum, count)`` of ``KL(S || q)`` over response tokens.

    Args:
      teacher_logits: ``[B, T, V]`` (no gradient). student_logits: ``[B, T, V]`` (gradient).
      mask: ``[B, T]`` bool or 0/1 float.
      **target_options: keywords of :func:`barycenter_target_from_logprobs` (incl. ``vocab_mask``).
    Returns:
      ``(sum, count)`` float32 scalars; ``token_mean = sum / max(count, 1)``.
    """
    check_rank("student_logits", student_logits, rank=3)
    check_vocab_match("student_logits", student_logits, "teacher_logits", teacher_logits)
    valid = as_valid(mask, shape_of(student_logits)[:-1], like_name="student_logits[..., :-1]")
    vocab_mask = target_options.get("vocab_mask")
    per_token = barycenter_kl_from_logprobs(
        log_softmax(valid_logits(student_logits, valid), vocab_mask=vocab_mask),
        log_softmax(jax.lax.stop_gradient(valid_logits(teacher_logits, valid)),
                    vocab_mask=vocab_mask), **target_options)
    return masked_sum_count(per_token, valid)
