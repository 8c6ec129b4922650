"""KL and generalized Jensen-Shannon divergences over the vocabulary axis (float32, log space).

Direction is always spelled out: ``kl(p, q)`` is ``KL(p || q) = sum_v p_v (log p_v - log q_v)``.
``generalized_jsd`` follows TRL's ``generalized_jsd_loss`` convention for ``beta``:
``beta = 0 -> KL(teacher || student)`` (forward), ``beta = 1 -> KL(student || teacher)`` (reverse),
otherwise ``beta KL(T || M) + (1 - beta) KL(S || M)`` with ``M = beta T + (1 - beta) S``.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from hindsight._validation import check_static_float, check_vocab_match
from hindsight.ops.logprobs import carries_mass, log_softmax


def kl_from_logprobs(lp: jax.Array, lq: jax.Array) -> jax.Array:
    """``KL(p || q)`` from float32 log-probs ``[..., V] -> [...]``.

    Terms where ``lp <= LOGP_FLOOR`` are exactly 0 (``p = 0`` contributes nothing, a banned token at
    ``-inf`` included), selected *before* the product so that no ``0 * inf`` reaches the backward
    pass. A NaN ``lp`` is live: it makes the value NaN instead of vanishing from it.
    """
    live = carries_mass(lp)
    lp_safe = jnp.where(live, lp, 0.0)
    terms = jnp.where(live, jnp.exp(lp_safe) * (lp_safe - jnp.where(live, lq, 0.0)), 0.0)
    return jnp.sum(terms, axis=-1)


MIX_FLOOR = -1e30
"""Log-probs enter the JSD mixture's ``logaddexp`` floored here: an entry at ``-inf`` in both
distributions (a banned token) would give ``logaddexp(-inf, -inf)``, whose gradient is NaN."""


def generalized_jsd_from_logprobs(student_logp: jax.Array, teacher_logp: jax.Array,
                                  beta: float) -> jax.Array:
    """Generalized JSD (TRL convention, see module doc) from float32 log-probs ``[..., V] -> [...]``.

    ``beta`` must be a static Python float in ``[0, 1]``: the endpoints select the plain KL directions
    (the mixture formula would give 0 there), so it picks a code path.
    """
    beta = check_static_float("beta", beta, low=0.0, high=1.0)
    if beta == 0.0:
        return kl_from_logprobs(teacher_logp, student_logp)
    if beta == 1.0:
        return kl_from_logprobs(student_logp, teacher_logp)
    # floored (NaN stays NaN): the mixture of an entry at -inf on both sides is then finite, and its
    # term is dropped by the selects of kl_from_logprobs with a zero cotangent
    mix = jnp.logaddexp(jnp.maximum(teacher_logp, MIX_FLOOR) + math.log(beta),
                        jnp.maximum(student_logp, MIX_FLOOR) + math.log1p(-beta))
    return (beta * kl_from_logprobs(teacher_logp, mix)
            + (1.0 - beta) * kl_from_logprobs(student_logp, mix))


def kl(p_logits: jax.Array, q_logits: jax.Array, *, vocab_mask: jax.Array | None = None) -> jax.Array:
    """``KL(softmax(p_logits) || softmax(q_logits))`` over the full vocabulary.

    Args:
      p_logits, q_logits: ``[..., V]`` with identical shapes.
      vocab_mask: optional ``[V]`` bool.
    Returns:
      ``[...]`` float32.
    """
    check_vocab_match("p_logits", p_logits, "q_logits", q_logits)
    return kl_from_logprobs(log_softmax(p_logits, vocab_mask=vocab_mask),
                            log_softmax(q_logits, vocab_mask=vocab_mask))


def generalized_jsd(student_logits: jax.Array, teacher_logits: jax.Array, beta: float = 0.5, *,
                    vocab_mask: jax.Array | None = None) -> jax.Array:
    """Generalized JSD between student and teacher distributions (TRL's ``beta`` convention).

    Args:
      student_logits, teacher_logits: ``[..., V]`` with identical shapes.
      beta: static float in ``[0, 1]``; 0 -> ``KL(T||S)``, 1 -> ``KL(S||T)``, else the mixture form.
      vocab_mask: optional ``[V]`` bool.
    Returns:
      ``[...]`` float32, per position (no reduction).
    """
    check_vocab_match("student_logits", student_logits, "teacher_logits", teacher_logits)
    return generalized_jsd_from_logprobs(log_softmax(student_logits, vocab_mask=vocab_mask),
                                         log_softmax(teacher_logits, vocab_mask=vocab_mask), beta)
