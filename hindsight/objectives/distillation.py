"""On-policy (self-)distillation losses (OPSD, SDPO), each with its divergence direction named.

The teacher is evaluated on the student's own sampled tokens and is a fixed target: its logits and
log-probs never receive gradient here. Divergence names: ``"forward_kl"`` = ``KL(teacher || student)``
(mass-covering), ``"reverse_kl"`` = ``KL(student || teacher)`` (mode-seeking), ``"jsd"`` = generalized
JSD in TRL's ``beta`` convention, ``beta KL(T || M) + (1 - beta) KL(S || M)`` with
``M = beta T + (1 - beta) S`` (SDPO's ``alpha`` is the same number).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight._validation import (check_choice, check_leading, check_rank, check_same_shape,
                                   check_static_float, check_vocab_match, shape_of)
from hindsight.objectives.aggregation import aggregate, as_mask, check_mode
from hindsight.objectives.kl_estimators import LOG_RATIO_CLIP
from hindsight.ops import generalized_jsd, topk_divergence

DIVERGENCES = ("forward_kl", "reverse_kl", "jsd")
_KL_BETA = {"forward_kl": 0.0, "reverse_kl": 1.0}


def _divergence_beta(divergence: str, beta: float | None) -> float:
    """TRL ``beta`` for a named divergence; ``beta`` may only be given for ``"jsd"`` (default 0.5)."""
    check_choice("divergence", divergence, DIVERGENCES)
    if divergence != "jsd":
        if beta is not None:
            raise ValueError(f"`beta` only applies to divergence='jsd'; divergence={divergence!r} "
                             f"already fixes the direction, got beta={beta!r}")
        return _KL_BETA[divergence]
    return 0.5 if beta is None else check_static_float("beta", beta, low=0.0, high=1.0)


def distillation_loss(student_logits: jax.Array, teacher_logits: jax.Array, mask: jax.Array, *,
                      divergence: str, beta: float | None = None, top_k: int | None = None,
                      support: str = "student", temperature: float = 1.0,
                      vocab_mask: jax.Array | None = None, mode: str = "token-mean",
                      norm: float | None = None) -> tuple[jax.Array, jax.Array, dict]:
    """Distillation loss over the vocabulary (full, or top-k + tail) at every response position.

    Args:
      student_logits: ``[B, T, V]`` (with grad), any float dtype; accumulated in float32.
      teacher_logits: ``[B, T, V]``, same shape; treated as a constant (stop-gradient).
      mask: ``[B, T]`` bool or 0/1 float (fold SDPO's per-sample ``self_distillation_mask`` in here).
      divergence: ``"forward_kl"`` (``KL(T||S)``), ``"reverse_kl"`` (``KL(S||T)``) or ``"jsd"``.
      beta: only for ``"jsd"``: TRL mixture weight in ``[0, 1]``, default 0.5 (OPSD, SDPO).
      top_k: None = full vocabulary (OPSD); an int ``k`` = the divergence over ``k`` entries plus a tail
        bucket ``log(1 - sum_k p)`` (SDPO ``distillation_topk=100, distillation_add_tail=True``). The
        tail is always kept: OPSD's ``top_k_loss`` renormalises over the k entries instead, which drops
        the mass outside them from the divergence.
      support: whose top-k indices: ``"student"`` (SDPO) or ``"teacher"`` (OPSD ``top_k_loss``).
      temperature: both logits are divided by it before the softmax (OPSD: 1.1, its sampling temperature).
      vocab_mask: optional ``[V]`` bool, False for padded vocabulary entries.
      mode, norm: aggregation, see :func:`hindsight.objectives.aggregation.aggregate`.
    Returns:
      ``(sum, count, metrics)`` float32; the loss is ``finalize(sum, count)`` after summing pairs over
      micro-batches. ``metrics["divergence"]`` is the token-mean ``(sum, count)`` of the per-token
      divergence (equal to the loss pair under ``mode="token-mean"``).
    """
    check_rank("student_logits", student_logits, rank=3)
    check_vocab_match("student_logits", student_logits, "teacher_logits", teacher_logits)
    check_leading("mask", mask, shape_of(student_logits)[:-1], "student_logits[..., :-1]")
    check_rank("mask", mask, rank=2)
    check_choice("support", support, ("student", "teacher"))
    vocab = shape_of(student_logits)[-1]
    if top_k is not None and (not isinstance(top_k, int) or not 1 <= top_k < vocab):
        raise ValueError(f"`top_k` must be None or a Python int in [1, {vocab}) for `student_logits` "
                         f"{shape_of(student_logits)}, got {top_k!r}")
    check_mode(mode, norm)
    beta = _divergence_beta(divergence, beta)
    temperature = check_static_float("temperature", temperature)
    if temperature <= 0.0:
        raise ValueError(f"`temperature` must be positive, got {temperature}")
    m = as_mask(mask)
    # Masked positions may hold anything (padding, uninitialised buffers): replace their logits by 0
    # before any exp/log so that nothing non-finite reaches the backward pass.
    def prepare(logits):
        return jnp.where(m[..., None], jnp.asarray(logits).astype(jnp.float32) / temperature, 0.0)
    student = prepare(student_logits)
    teacher = jax.lax.stop_gradient(prepare(teacher_logits))
    if top_k is None:
        per_token = generalized_jsd(student, teacher, beta, vocab_mask=vocab_mask)
    else:
        per_token = topk_divergence(student, teacher, beta, k=top_k, support=support,
                                    vocab_mask=vocab_mask)
    total, count = aggregate(per_token, m, mode=mode, norm=norm)
    metrics = {"divergence": aggregate(jax.lax.stop_gradient(per_token), m)}
    return total, count, metrics


def sampled_distillation_loss(logp_student: jax.Array, logp_teacher: jax.Array, mask: jax.Array, *,
                              logp_old: jax.Array | None = None, is_clip: float | None = 2.0,
                              mode: str = "token-mean",
                              norm: float | None = None) -> tuple[jax.Array, jax.Array, dict]:
    """Sampled-token reverse-KL distillation: ``KL(student || teacher)`` through its sampled gradient.

    Per token ``y_t`` sampled from the student: advantage ``a_t = sg(logp_T - logp_S)`` and loss
    ``-a_t logp_S w_t``, whose gradient ``(logp_S - logp_T) grad logp_S`` is the score-function gradient
    of ``KL(S || T)`` (OPSD's sampled alternative; SDPO's ``sg(lS - lT) * lS``). Only the reverse
    direction has this form, since the samples come from the student. With ``logp_old`` (SDPO, samples
    from an older student) each token is weighted by ``w_t = sg(min(exp(clip(logp_S - logp_old, +-20)),
    is_clip))``; otherwise ``w_t = 1``.

    Args:
      logp_student: ``[B, T]`` log-prob of the sampled tokens under the student (with grad).
      logp_teacher: ``[B, T]`` under the teacher (constant).
      mask: ``[B, T]`` bool or 0/1 float.
      logp_old: optional ``[B, T]`` log-probs under the sampling policy, for the importance weight.
      is_clip: upper bound of the importance weight (SDPO 2.0); None = unclipped.
      mode, norm: aggregation, see :func:`hindsight.objectives.aggregation.aggregate`.
    Returns:
      ``(sum, count, metrics)`` float32. ``metrics`` holds token-mean ``(sum, count)`` pairs:
      ``reverse_kl`` (the k1 estimate ``logp_S - logp_T`` of ``KL(S || T)``, unweighted) and, with
      ``logp_old``, ``is_weight`` (mean ``w_t``) and ``is_clip_frac`` (fraction with ``w_t`` clipped).
    """
    check_rank("logp_student", logp_student, rank=2)
    check_same_shape(("logp_student", "logp_teacher", "mask"), logp_student, logp_teacher, mask)
    check_mode(mode, norm)
    if logp_old is not None:
        check_same_shape(("logp_student", "logp_old"), logp_student, logp_old)
    if is_clip is not None:
        is_clip = check_static_float("is_clip", is_clip)
        if is_clip <= 0.0:
            raise ValueError(f"`is_clip` must be positive (or None), got {is_clip}")
    m = as_mask(mask)
    ls = jnp.where(m, jnp.asarray(logp_student).astype(jnp.float32), 0.0)
    lt = jax.lax.stop_gradient(jnp.where(m, jnp.asarray(logp_teacher).astype(jnp.float32), 0.0))
    advantage = jax.lax.stop_gradient(lt - ls)
    metrics = {"reverse_kl": aggregate(-advantage, m)}
    per_token = -advantage * ls
    if logp_old is not None:
        lo = jnp.where(m, jnp.asarray(logp_old).astype(jnp.float32), 0.0)
        ratio = jnp.exp(jnp.clip(jax.lax.stop_gradient(ls) - lo, -LOG_RATIO_CLIP, LOG_RATIO_CLIP))
        if is_clip is None:
            clipped = jnp.zeros_like(m)
        else:
            clipped = m & (ratio > is_clip)
            ratio = jnp.minimum(ratio, is_clip)
        per_token = per_token * ratio
        metrics["is_weight"] = aggregate(ratio, m)
        metrics["is_clip_frac"] = aggregate(clipped.astype(jnp.float32), m)
    total, count = aggregate(per_token, m, mode=mode, norm=norm)
    return total, count, metrics
