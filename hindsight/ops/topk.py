"""Top-k supports with a tail bucket (SDPO ``distillation_add_tail``).

A divergence restricted to the top-k entries of one distribution is not a divergence between
distributions unless the remaining mass is kept: each distribution is summarised as its k gathered
log-probs plus one bucket ``log(1 - sum_k p)`` for everything else, a proper distribution over
``k + 1`` outcomes (so a KL over it is never negative).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight._validation import check_choice, check_vocab_match, shape_of
from hindsight.ops.divergences import generalized_jsd_from_logprobs
from hindsight.ops.logprobs import log_softmax

TAIL_CAP = -1e-7
"""The top-k log-mass is capped here before ``log(-expm1(.))`` so the tail bucket stays finite."""


def topk_tail_logprobs(logp: jax.Array, indices: jax.Array) -> jax.Array:
    """Gather ``logp [..., V]`` at ``indices [..., k]`` and append the tail bucket.

    Returns:
      ``[..., k + 1]`` float32 log-probs: the k gathered entries, then ``log(1 - sum_k p)``.
    """
    picked = jnp.take_along_axis(logp, indices, axis=-1)
    head = jnp.minimum(jax.nn.logsumexp(picked, axis=-1, keepdims=True), TAIL_CAP)
    return jnp.concatenate([picked, jnp.log(-jnp.expm1(head))], axis=-1)


def renormalized_topk_logprobs(logp: jax.Array, indices: jax.Array) -> jax.Array:
    """Gather ``logp [..., V]`` at ``indices [..., k]`` and renormalise over the k entries
    (OPSD's ``top_k_loss``; SDPO with ``distillation_add_tail=False``) -> ``[..., k]``."""
    picked = jnp.take_along_axis(logp, indices, axis=-1)
    return picked - jax.nn.logsumexp(picked, axis=-1, keepdims=True)


def topk_divergence_from_logprobs(student_logp: jax.Array, teacher_logp: jax.Array,
                                  beta: float = 0.5, *, k: int, support: str = "student",
                                  tail: bool = True) -> jax.Array:
    """Generalized JSD (TRL ``beta`` convention) over the top-k entries of one side, from
    float32 log-probs ``[..., V]`` -> ``[...]``.

    Args:
      beta: static float in ``[0, 1]``; 0 -> ``KL(T||S)``, 1 -> ``KL(S||T)``.
      k: explicit entries, a static int in ``[1, V)``.
      support: whose top-k: ``"student"`` (SDPO) or ``"teacher"`` (OPSD ``top_k_loss``); the
        indices are not differentiated.
      tail: append the tail bucket ``log(1 - sum_k p)`` to each side (a distribution over k + 1
        outcomes, nothing renormalised: SDPO); False renormalises both sides over the k entries.
    """
    check_choice("support", support, ("student", "teacher"))
    vocab = shape_of(student_logp)[-1]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k < vocab:
        raise ValueError(f"`k` must be a Python int in [1, {vocab}) for vocab {vocab}, got {k!r}")
    _, idx = jax.lax.top_k(jax.lax.stop_gradient(
        student_logp if support == "student" else teacher_logp), k)
    pick = topk_tail_logprobs if tail else renormalized_topk_logprobs
    return generalized_jsd_from_logprobs(pick(student_logp, idx), pick(teacher_logp, idx), beta)


def topk_divergence(student_logits: jax.Array, teacher_logits: jax.Array, beta: float = 0.5, *,
                    k: int, support: str = "student", tail: bool = True,
                    vocab_mask: jax.Array | None = None) -> jax.Array:
    """:func:`topk_divergence_from_logprobs` on logits ``[..., V]`` (optional ``[V]`` bool
    ``vocab_mask``) -> ``[...]`` float32."""
    check_vocab_match("student_logits", student_logits, "teacher_logits", teacher_logits)
    return topk_divergence_from_logprobs(log_softmax(student_logits, vocab_mask=vocab_mask),
                                         log_softmax(teacher_logits, vocab_mask=vocab_mask),
                                         beta, k=k, support=support, tail=tail)
