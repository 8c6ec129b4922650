"""Fused weighted-sum distillation loss over the LM head (one forward scan yields value and gradients).

For ``loss_sum = sum_{b,t} w[b,t] * f(log_softmax(h_s[b,t] @ W / tau), log_softmax(h_t[b,t] @ W_t / tau))``
the gradient of each row's loss w.r.t. its logits is local to the row. So a single ``lax.scan`` over
blocks of rows can, per block: project student and teacher, take ``dlogits`` with ``jax.vjp``, then
emit ``grad_h = dlogits @ W^T`` and accumulate ``grad_W += h^T @ dlogits`` in float32. The custom
VJP's backward pass only scales these by the scalar cotangent, so no logits are recomputed, which is
why this path costs about as much as the dense loss while its working memory stays at one block.
When the loss is not differentiated, the primal path runs a value-only scan and computes no
gradient.

The teacher is a constant: its hidden states and unembedding get zero gradient, as if wrapped in
``stop_gradient``. The weights ``w`` (a mask or token-mean weights) get their exact gradient ``f``.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from hindsight._validation import check_choice, check_static_float, shape_of
from hindsight.ops._chunking import (check_projection, check_temperature,
                                     check_vocab_mask, chunk_rows, from_chunks, project,
                                     temper_and_mask, to_chunks)
from hindsight.ops.divergences import generalized_jsd_from_logprobs, kl_from_logprobs

DISTILLATION_LOSSES = ("reverse_kl", "forward_kl", "jsd")

VOCAB_TILE = 8192
"""Unembedding-gradient columns updated per step. Adding a whole ``h^T @ dlogits`` block at once
would hold a second float32 ``[D, V]`` buffer (as large as the gradient itself); tiles bound that
temporary to ``[D, VOCAB_TILE]`` while the accumulator is updated in place."""


class _Config(NamedTuple):
    row_loss: Callable
    lead: tuple
    chunk: int
    temperature: float


def _row_loss(loss, beta) -> Callable:
    """The per-row ``f(student_logp [C, V], *teacher_logps [C, V]) -> [C]`` named by ``loss``."""
    if callable(loss):
        return loss
    check_choice("loss", loss, DISTILLATION_LOSSES)
    if loss == "reverse_kl":
        return kl_from_logprobs
    if loss == "forward_kl":
        return lambda ls, lt: kl_from_logprobs(lt, ls)
    beta = check_static_float("beta", beta, low=0.0, high=1.0)
    return lambda ls, lt: generalized_jsd_from_logprobs(ls, lt, beta)


def _chunk_inputs(cfg, s_hidden, t_hiddens, weights):
    return (to_chunks(s_hidden, cfg.lead, cfg.chunk),
            tuple(to_chunks(h, cfg.lead, cfg.chunk) for h in t_hiddens),
            to_chunks(weights.astype(jnp.float32), cfg.lead, cfg.chunk))


def _teacher_logps(cfg, ht_c, t_unembeds, vocab_mask):
    return tuple(jax.nn.log_softmax(project(h, w, vocab_mask, cfg.temperature))
                 for h, w in zip(ht_c, t_unembeds))


def _weighted(w_c, f):
    # `where`, not a product: a zero-weight row whose loss is inf/NaN still contributes exactly 0.
    return jnp.where(w_c != 0, w_c * f, 0.0)


def _accumulate_grad_w(grad_w: jax.Array, h: jax.Array, dz: jax.Array) -> jax.Array:
    """``grad_w [D, V] + h [C, D]^T @ dz [C, V]`` in float32, one vocabulary tile at a time."""
    vocab = shape_of(grad_w)[1]
    tile = min(VOCAB_TILE, vocab)

    def step(j, g):
        # The last tile is shifted left to stay inside V; columns it shares with the previous tile
        # were already added, so they are zeroed here.
        start = jnp.minimum(j * tile, vocab - tile)
        fresh = start + jnp.arange(tile) >= j * tile
        dz_t = jnp.where(fresh, jax.lax.dynamic_slice_in_dim(dz, start, tile, axis=1), 0.0)
        upd = jax.lax.dynamic_slice_in_dim(g, start, tile, axis=1) + jnp.matmul(
            h.T, dz_t, preferred_element_type=jnp.float32)
        return jax.lax.dynamic_update_slice_in_dim(g, upd, start, axis=1)

    return jax.lax.fori_loop(0, -(-vocab // tile), step, grad_w)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused_sum(cfg, s_hidden, unembed, t_hiddens, t_unembeds, weights, vocab_mask):
    """Value-only path: ``sum w * f`` as a float32 scalar, no gradient work."""
    def body(acc, xs):
        hs_c, ht_c, w_c = xs
        ls = jax.nn.log_softmax(project(hs_c, unembed, vocab_mask, cfg.temperature))
        f = cfg.row_loss(ls, *_teacher_logps(cfg, ht_c, t_unembeds, vocab_mask))
        return acc + jnp.sum(_weighted(w_c, f)), None

    total, _ = jax.lax.scan(body, jnp.float32(0.0),
                            _chunk_inputs(cfg, s_hidden, t_hiddens, weights))
    return total


def _fused_fwd(cfg, s_hidden, unembed, t_hiddens, t_unembeds, weights, vocab_mask):
    def body(carry, xs):
        acc, grad_w = carry
        hs_c, ht_c, w_c = xs
        t_logps = _teacher_logps(cfg, ht_c, t_unembeds, vocab_mask)
        z = jnp.matmul(hs_c, unembed, preferred_element_type=jnp.float32)

        def rows(z):
            logits = temper_and_mask(z, vocab_mask, cfg.temperature)
            return cfg.row_loss(jax.nn.log_softmax(logits), *t_logps)

        f, vjp = jax.vjp(rows, z)
        live = w_c != 0
        (dz,) = vjp(jnp.where(live, w_c, 0.0))
        dz = jnp.where(live[:, None], dz, 0.0)
        grad_h = jnp.matmul(dz, unembed.T, preferred_element_type=jnp.float32)
        grad_w = _accumulate_grad_w(grad_w, hs_c, dz)
        return (acc + jnp.sum(_weighted(w_c, f)), grad_w), (grad_h.astype(hs_c.dtype), f)

    init = (jnp.float32(0.0), jnp.zeros(shape_of(unembed), jnp.float32))
    (total, grad_w), (grad_h, f) = jax.lax.scan(
        body, init, _chunk_inputs(cfg, s_hidden, t_hiddens, weights))
    residuals = (from_chunks(grad_h, cfg.lead), grad_w.astype(unembed.dtype),
                 from_chunks(f, cfg.lead).astype(weights.dtype))
    return total, residuals


def _fused_bwd(cfg, residuals, g):
    grad_h, grad_w, f = residuals
    # the teacher (hidden states, unembeddings) and the vocab mask get no gradient
    return ((g * grad_h).astype(grad_h.dtype), (g * grad_w).astype(grad_w.dtype), None, None,
            (g * f).astype(f.dtype), None)


_fused_sum.defvjp(_fused_fwd, _fused_bwd)


def fused_distillation_loss(student_hidden: jax.Array, teacher_hidden: jax.Array | Sequence[jax.Array],
                            unembed: jax.Array, weights: jax.Array, *, loss: str | Callable = "jsd",
                            beta: float = 0.5,
                            teacher_unembed: jax.Array | Sequence[jax.Array] | None = None,
                            chunk_size: int | None = None,
                            vocab_mask: jax.Array | None = None,
                            temperature: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """Weighted sum of a per-position distillation loss, with a fused (no-recompute) gradient.

    Computes ``loss_sum = sum_{b,t} weights[b,t] * f(student_logp[b,t], teacher_logp[b,t])`` where
    ``student_logp = log_softmax(student_hidden @ unembed / temperature)`` (and likewise for the
    teacher), without materialising ``[B, T, V]`` logits. Differentiable w.r.t. ``student_hidden``,
    ``unembed`` and ``weights``; the teacher is a constant (zero gradient).

    Args:
      student_hidden: ``[B, T, D]`` (any leading shape ``L``), float32 or bf16.
      teacher_hidden: ``[B, T, D_t]``, or a sequence of them for a callable ``loss`` that takes
        several teacher-side distributions.
      unembed: student ``[D, V]``.
      weights: ``[B, T]`` float or bool (mask, or token-mean weights); rows with weight 0 contribute
        exactly 0 to the value and the gradients.
      loss: ``"reverse_kl"`` (``KL(S||T)``), ``"forward_kl"`` (``KL(T||S)``), ``"jsd"`` (generalized
        JSD, TRL ``beta`` convention), or a callable ``f(student_logp [C, V], *teacher_logps [C, V])
        -> [C]`` on float32 log-probs (rows independent); its gradient is taken with ``jax.vjp``.
      beta: static float in ``[0, 1]``, used by ``"jsd"``.
      teacher_unembed: ``[D_t, V]`` (default ``unembed``), or one per teacher hidden tensor.
      chunk_size: rows per block (static int); None picks :func:`~hindsight.ops.default_chunk_size`
        from V (64 at V = 151,936).
      vocab_mask: optional ``[V]`` bool, True for real vocabulary entries.
      temperature: static float > 0 dividing student and teacher logits.
    Returns:
      ``(loss_sum, weight_sum)``: float32 scalars, ``sum w * f`` and ``sum w``. With ``weights`` a
      0/1 mask this is the ``(sum, count)`` pair of the objectives contract; divide once per step.
    """
    t_hiddens = tuple(teacher_hidden) if isinstance(teacher_hidden, (tuple, list)) else (teacher_hidden,)
    if teacher_unembed is None:
        t_unembeds = (unembed,) * len(t_hiddens)
    elif isinstance(teacher_unembed, (tuple, list)):
        t_unembeds = tuple(teacher_unembed)
    else:
        t_unembeds = (teacher_unembed,) * len(t_hiddens)
    if len(t_unembeds) != len(t_hiddens) or not t_hiddens:
        raise ValueError(f"`teacher_unembed` must give one unembedding per teacher hidden tensor: "
                         f"got {len(t_unembeds)} for {len(t_hiddens)}")
    if not callable(loss) and len(t_hiddens) != 1:
        raise ValueError(f"loss {loss!r} takes exactly one teacher, got {len(t_hiddens)} teacher "
                         f"hidden tensors; pass a callable `loss` for several")
    sfx = [""] if len(t_hiddens) == 1 else [f"[{i}]" for i in range(len(t_hiddens))]
    lead, vocab = check_projection(
        [("student_hidden", student_hidden, "unembed", unembed)]
        + [(f"teacher_hidden{s}", h, f"teacher_unembed{s}", w)
           for s, h, w in zip(sfx, t_hiddens, t_unembeds)])
    check_vocab_mask(vocab_mask, vocab)
    if shape_of(weights) != lead:
        raise ValueError(f"`weights` must have shape {lead} (the hidden states' positions), got "
                         f"{shape_of(weights)}")
    cfg = _Config(_row_loss(loss, beta), lead, chunk_rows(lead, vocab, chunk_size),
                  check_temperature(temperature))
    w = jnp.asarray(weights)
    w = w.astype(jnp.float32) if not jnp.issubdtype(w.dtype, jnp.floating) else w
    mask = None if vocab_mask is None else jnp.asarray(vocab_mask, bool)
    total = _fused_sum(cfg, student_hidden, unembed, t_hiddens, t_unembeds, w, mask)
    return total, jnp.sum(jax.lax.stop_gradient(w).astype(jnp.float32))
