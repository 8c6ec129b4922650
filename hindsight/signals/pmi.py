"""OPSD-PMI — the purified distillation target for long-CoT self-distillation (spec §5).

Verified [V-page]: with a reference solution in context the teacher's signal is dominated by a
reference-induced component; a *reference-only* probe (same model, reference but no question)
isolates it, and the residual ``lT - lR`` — a pointwise-mutual-information estimate between the
next token and the question — reweights a clean base ``P0`` into the target. Mean-centring, the
``tanh`` soft clip ``c = 10`` and ``log q = l0 + beta * rcl`` are [BRIEF]; ``beta = 1``, the JSD
weight 0.5 and temperature 1.0 are OUR CHOICE.

Per-position vocabulary functions on log-probs ``[..., V]`` (:func:`pmi_target_from_logprobs`,
:func:`pmi_jsd_from_logprobs`) are what a chunked LM-head path calls; :func:`pmi_target` and
:func:`pmi_loss` are the dense logits forms. The spec's top-k memory option is not built in: a
top-k path gathers the support's log-probs ``[..., k]`` and calls
:func:`pmi_target_from_logprobs` on them, which then centres over the support as the spec asks.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight._validation import (check_rank, check_same_shape, check_static_float,
                                   check_vocab_match, shape_of)
from hindsight.ops import generalized_jsd_from_logprobs, log_softmax
from hindsight.signals._common import (LOGP_TARGET_FLOOR, as_f32, as_valid, masked_sum_count,
                                       valid_logits)


def pmi_target_from_logprobs(teacher_logp: jax.Array, probe_logp: jax.Array, base_logp: jax.Array,
                             *, beta: float = 1.0, clip: float = 10.0,
                             floor: float = LOGP_TARGET_FLOOR,
                             vocab_mask: jax.Array | None = None) -> jax.Array:
    """Purified target ``log q`` from float32 log-probs (spec §5 steps 2-5).

    ``r = max(lT, floor) - max(lR, floor)``; ``rc = r - mean_valid(r)``;
    ``rcl = clip * tanh(rc / clip)``; ``log q = log_softmax_valid(l0 + beta * rcl)``.

    Args:
      teacher_logp: ``[..., V]`` question + reference context.
      probe_logp: ``[..., V]`` reference-only context.
      base_logp: ``[..., V]`` frozen base, question only.
      beta: residual strength [OURS 1.0; sweep 0.5, 1, 2]; 0 gives the base.
      clip: ``tanh`` soft-clip scale ``c`` [BRIEF 10].
      floor: log-prob floor for teacher and probe.
      vocab_mask: optional ``[V]`` bool; padded entries are excluded from the mean and get
        (numerically) zero target mass.
    Returns:
      ``[..., V]`` float32 log-probs, stop-gradient'ed.
    """
    check_rank("teacher_logp", teacher_logp, min_rank=1)
    check_same_shape(("teacher_logp", "probe_logp", "base_logp"), teacher_logp, probe_logp,
                     base_logp)
    clip = check_static_float("clip", clip, low=1e-6)
    residual = jnp.maximum(as_f32(teacher_logp), floor) - jnp.maximum(as_f32(probe_logp), floor)
    if vocab_mask is None:
        centre = jnp.mean(residual, axis=-1, keepdims=True)
    else:
        vm = jnp.asarray(vocab_mask, bool)
        centre = (jnp.sum(jnp.where(vm, residual, 0.0), axis=-1, keepdims=True)
                  / jnp.maximum(jnp.sum(vm), 1))
    soft = clip * jnp.tanh((residual - centre) / clip)
    target = log_softmax(as_f32(base_logp) + beta * soft, vocab_mask=vocab_mask)
    return jax.lax.stop_gradient(target)


def pmi_target(teacher_logits: jax.Array, probe_logits: jax.Array, base_logits: jax.Array, *,
               beta: float = 1.0, clip: float = 10.0, floor: float = LOGP_TARGET_FLOOR,
               temperature: float = 1.0, vocab_mask: jax.Array | None = None) -> jax.Array:
    """Purified OPSD target from the three no-grad passes (spec §5).

    Args:
      teacher_logits: ``[B, T, V]`` question + reference.
      probe_logits: ``[B, T, V]`` reference only.
      base_logits: ``[B, T, V]`` frozen base model, question only.
      beta, clip, floor: see :func:`pmi_target_from_logprobs`.
      temperature: applied to all logits before the softmax [OURS 1.0].
      vocab_mask: optional ``[V]`` bool.
    Returns:
      ``[B, T, V]`` float32 target log-probs, stop-gradient'ed.
    """
    check_vocab_match("teacher_logits", teacher_logits, "probe_logits", probe_logits)
    check_vocab_match("teacher_logits", teacher_logits, "base_logits", base_logits)
    lp = lambda x: log_softmax(jax.lax.stop_gradient(as_f32(x)) / temperature,
                               vocab_mask=vocab_mask)
    return pmi_target_from_logprobs(lp(teacher_logits), lp(probe_logits), lp(base_logits),
                                    beta=beta, clip=clip, floor=floor, vocab_mask=vocab_mask)


def pmi_jsd_from_logprobs(student_logp: jax.Array, teacher_logp: jax.Array, probe_logp: jax.Array,
                          base_logp: jax.Array, *, beta_jsd: float = 0.5,
                          vocab_mask: jax.Array | None = None, **target_options) -> jax.Array:
    """Per-position OPSD-PMI loss: generalized JSD between the purified target and the student.

    ``beta_jsd = 0.5`` [OURS] gives ``0.5 KL(q || M) + 0.5 KL(S || M)``, ``M = (q + S) / 2``
    (TRL convention of :func:`hindsight.ops.generalized_jsd`, the target in the teacher slot).

    Args:
      student_logp: ``[..., V]`` (carries the gradient).
      teacher_logp, probe_logp, base_logp: ``[..., V]`` (no gradient).
      beta_jsd: static float in ``[0, 1]``.
      vocab_mask: optional ``[V]`` bool.
      **target_options: ``beta``, ``clip``, ``floor`` of :func:`pmi_target_from_logprobs`.
    Returns:
      ``[...]`` float32.
    """
    check_same_shape(("student_logp", "teacher_logp"), student_logp, teacher_logp)
    target = pmi_target_from_logprobs(teacher_logp, probe_logp, base_logp, vocab_mask=vocab_mask,
                                      **target_options)
    return generalized_jsd_from_logprobs(as_f32(student_logp), target, beta_jsd)


def pmi_loss(teacher_logits: jax.Array, probe_logits: jax.Array, base_logits: jax.Array,
             student_logits: jax.Array, mask: jax.Array, *, beta_jsd: float = 0.5,
             temperature: float = 1.0, vocab_mask: jax.Array | None = None,
             **target_options) -> tuple[jax.Array, jax.Array]:
    """OPSD-PMI loss ``(sum, count)`` over response tokens (spec §5 step 6).

    Args:
      teacher_logits, probe_logits, base_logits: ``[B, T, V]`` (no gradient).
      student_logits: ``[B, T, V]`` question only (carries the gradient).
      mask: ``[B, T]`` bool or 0/1 float.
      beta_jsd: see :func:`pmi_jsd_from_logprobs`.
      temperature: applied to all four logits [OURS 1.0].
      vocab_mask: optional ``[V]`` bool.
      **target_options: ``beta``, ``clip``, ``floor`` of :func:`pmi_target_from_logprobs`.
    Returns:
      ``(sum, count)`` float32 scalars; ``token_mean = sum / max(count, 1)``.
    """
    check_rank("student_logits", student_logits, rank=3)
    check_vocab_match("student_logits", student_logits, "teacher_logits", teacher_logits)
    valid = as_valid(mask, shape_of(student_logits)[:-1], like_name="student_logits[..., :-1]")
    target = pmi_target(*(valid_logits(x, valid) for x in (teacher_logits, probe_logits,
                                                           base_logits)),
                        temperature=temperature, vocab_mask=vocab_mask, **target_options)
    student = log_softmax(valid_logits(student_logits, valid) / temperature,
                          vocab_mask=vocab_mask)
    return masked_sum_count(generalized_jsd_from_logprobs(student, target, beta_jsd), valid)
