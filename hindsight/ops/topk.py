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


def topk_divergence(student_logits: jax.Array, teacher_logits: jax.Array, beta: float = 0.5, *,
                    k: int, support: str = "student",
                    vocab_mask: jax.Array | None = None) -> jax.Array:
    """Generalized JSD (TRL ``beta`` convention) over a top-k + tail support.

    Args:
      student_logits, teacher_logits: ``[..., V]``.
      beta: static float in ``[0, 1]``; 0 -> ``KL(T||S)``, 1 -> ``KL(S||T)``.
      k: number of explicit entries (static int, ``1 <= k < V``).
      support: ``"student"`` (SDPO default: the student's top-k, indices are not differentiated) or
        ``"teacher"`` (OPSD ``top_k_loss``).
      vocab_mask: optional ``[V]`` bool.
    Returns:
      ``[...]`` float32.
    """
    check_vocab_match("student_logits", student_logits, "teacher_logits", teacher_logits)
    check_choice("support", support, ("student", "teacher"))
    vocab = shape_of(student_logits)[-1]
    if not isinstance(k, int) or not 1 <= k < vocab:
        raise ValueError(f"`k` must be a Python int in [1, {vocab}) for vocab {vocab}, got {k!r}")
    ls = log_softmax(student_logits, vocab_mask=vocab_mask)
    lt = log_softmax(teacher_logits, vocab_mask=vocab_mask)
    _, idx = jax.lax.top_k(jax.lax.stop_gradient(ls if support == "student" else lt), k)
    return generalized_jsd_from_logprobs(topk_tail_logprobs(ls, idx), topk_tail_logprobs(lt, idx), beta)
