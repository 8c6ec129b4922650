"""Vocabulary reductions computed from hidden states and an unembedding, chunk by chunk.

Each reduction runs :func:`hindsight.ops.lm_head_map` with its ``"scan"`` backend: hidden states
``[..., D]`` go through unembeddings ``[D, V]`` one block of ``chunk_size`` rows at a time inside a
``lax.scan`` whose body is under ``jax.checkpoint``: the forward
pass keeps only per-row outputs, and the backward pass recomputes each block's logits, so neither
pass ever holds float32 logits for more than ``chunk_size`` rows. Gradients flow to the hidden
states, the unembeddings and float extras. The public reductions mirror the dense ops in
:mod:`hindsight.ops.logprobs`, :mod:`~hindsight.ops.divergences` and :mod:`~hindsight.ops.topk`, and
apply those same functions to each block, so the math exists once.

(The training path's methods call ``lm_head_map`` themselves, with the backend of
``train.lm_head``, default ``"fused"``; these reductions are for scoring, sampling and tests, and
keep the scan path, which also supports forward-mode differentiation.)

For a weighted-sum distillation loss, :func:`hindsight.ops.fused.fused_distillation_loss` is faster:
it produces the gradients in the forward scan instead of recomputing the logits.

Gradient notes: with the scan backend JAX accumulates an unembedding's gradient across chunks in
the unembedding's own dtype (pass a float32 unembedding when a bf16 sum over many chunks is not
accurate enough), and adds each block's ``[D, V]`` contribution whole, so the backward pass holds
one extra gradient-sized buffer. The fused backend (and ``fused_distillation_loss``) accumulate in
float32, tile by tile, and avoid both.
"""
from __future__ import annotations

import functools

import jax

from hindsight._validation import check_tokens_in_vocab, shape_of
from hindsight.ops._chunking import check_projection
from hindsight.ops.divergences import generalized_jsd_from_logprobs, kl_from_logprobs
from hindsight.ops.lm_head import lm_head_map
from hindsight.ops.logprobs import entropy_from_logprobs, token_logprobs
from hindsight.ops.topk import topk_divergence


def _check_pair(student_hidden, teacher_hidden, unembed, teacher_unembed) -> None:
    check_projection([("student_hidden", student_hidden, "unembed", unembed),
                      ("teacher_hidden", teacher_hidden, "teacher_unembed", teacher_unembed)])


_scan = functools.partial(lm_head_map, backend="scan")


def chunked_token_logprobs(hidden: jax.Array, unembed: jax.Array, tokens: jax.Array, *,
                           chunk_size: int | None = None, vocab_mask: jax.Array | None = None,
                           temperature: float = 1.0, with_entropy: bool = False):
    """Chunked :func:`~hindsight.ops.token_logprobs` (optionally with the entropy from the same pass).

    Args:
      hidden: ``[B, T, D]`` (any leading shape ``L``).
      unembed: ``[D, V]``.
      tokens: ``[B, T]`` int ids in ``[0, V)``.
      with_entropy: also return the entropy of each position's distribution.
    Returns:
      ``[B, T]`` float32 log-probs, or ``(logprobs, entropy)`` when ``with_entropy``.
    """
    lead, vocab = check_projection([("hidden", hidden, "unembed", unembed)])
    if shape_of(tokens) != lead:
        raise ValueError(f"`tokens` has shape {shape_of(tokens)} but `hidden` {shape_of(hidden)} "
                         f"needs {lead}")
    check_tokens_in_vocab("tokens", tokens, vocab)

    def row(logits, extras):
        (z,), (tok,) = logits, extras
        lp = token_logprobs(z, tok)
        return (lp, entropy_from_logprobs(jax.nn.log_softmax(z))) if with_entropy else lp

    return _scan(row, (hidden,), (unembed,), (tokens,), chunk_size=chunk_size,
                       vocab_mask=vocab_mask, temperature=temperature)


def chunked_entropy(hidden: jax.Array, unembed: jax.Array, *, chunk_size: int | None = None,
                    vocab_mask: jax.Array | None = None, temperature: float = 1.0) -> jax.Array:
    """Chunked :func:`~hindsight.ops.entropy`: ``hidden [B, T, D]``, ``unembed [D, V]`` -> ``[B, T]``."""
    check_projection([("hidden", hidden, "unembed", unembed)])
    return _scan(lambda logits, _: entropy_from_logprobs(jax.nn.log_softmax(logits[0])),
                       (hidden,), (unembed,), chunk_size=chunk_size, vocab_mask=vocab_mask,
                       temperature=temperature)


def chunked_kl(p_hidden: jax.Array, q_hidden: jax.Array, unembed: jax.Array, *,
               q_unembed: jax.Array | None = None, chunk_size: int | None = None,
               vocab_mask: jax.Array | None = None, temperature: float = 1.0) -> jax.Array:
    """Chunked :func:`~hindsight.ops.kl`: ``KL(p || q)`` per position.

    Args:
      p_hidden, q_hidden: ``[B, T, D_p]``, ``[B, T, D_q]``.
      unembed: ``[D_p, V]`` for ``p``; ``q_unembed`` ``[D_q, V]`` for ``q`` (default: ``unembed``).
    Returns:
      ``[B, T]`` float32.
    """
    q_unembed = unembed if q_unembed is None else q_unembed
    check_projection([("p_hidden", p_hidden, "unembed", unembed),
                      ("q_hidden", q_hidden, "q_unembed", q_unembed)])
    return _scan(
        lambda logits, _: kl_from_logprobs(*(jax.nn.log_softmax(z) for z in logits)),
        (p_hidden, q_hidden), (unembed, q_unembed), chunk_size=chunk_size, vocab_mask=vocab_mask,
        temperature=temperature)


def chunked_generalized_jsd(student_hidden: jax.Array, teacher_hidden: jax.Array,
                            unembed: jax.Array, beta: float = 0.5, *,
                            teacher_unembed: jax.Array | None = None,
                            chunk_size: int | None = None,
                            vocab_mask: jax.Array | None = None,
                            temperature: float = 1.0) -> jax.Array:
    """Chunked :func:`~hindsight.ops.generalized_jsd` (TRL ``beta`` convention).

    Gradients reach both sides; wrap the teacher's inputs in ``jax.lax.stop_gradient`` to treat it as
    a constant (its logits are then not recomputed for a gradient).

    Args:
      student_hidden, teacher_hidden: ``[B, T, D_s]``, ``[B, T, D_t]``.
      unembed: student ``[D_s, V]``; ``teacher_unembed`` ``[D_t, V]`` (default: ``unembed``).
      beta: static float in ``[0, 1]``; 0 -> ``KL(T||S)``, 1 -> ``KL(S||T)``.
    Returns:
      ``[B, T]`` float32.
    """
    teacher_unembed = unembed if teacher_unembed is None else teacher_unembed
    _check_pair(student_hidden, teacher_hidden, unembed, teacher_unembed)
    return _scan(
        lambda logits, _: generalized_jsd_from_logprobs(
            *(jax.nn.log_softmax(z) for z in logits), beta),
        (student_hidden, teacher_hidden), (unembed, teacher_unembed), chunk_size=chunk_size,
        vocab_mask=vocab_mask, temperature=temperature)


def chunked_topk_divergence(student_hidden: jax.Array, teacher_hidden: jax.Array,
                            unembed: jax.Array, beta: float = 0.5, *, k: int,
                            support: str = "student", teacher_unembed: jax.Array | None = None,
                            chunk_size: int | None = None,
                            vocab_mask: jax.Array | None = None,
                            temperature: float = 1.0) -> jax.Array:
    """Chunked :func:`~hindsight.ops.topk_divergence` (top-k + tail bucket), ``[B, T]`` float32.

    Arguments as :func:`chunked_generalized_jsd`, plus ``k`` and ``support`` as in the dense op.
    """
    teacher_unembed = unembed if teacher_unembed is None else teacher_unembed
    _check_pair(student_hidden, teacher_hidden, unembed, teacher_unembed)
    return _scan(
        lambda logits, _: topk_divergence(*logits, beta, k=k, support=support),
        (student_hidden, teacher_hidden), (unembed, teacher_unembed), chunk_size=chunk_size,
        vocab_mask=vocab_mask, temperature=temperature)
