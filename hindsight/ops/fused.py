"""Fused weighted-sum distillation loss over the LM head (one forward scan yields value and gradients).

For ``loss_sum = sum_{b,t} w[b,t] * f(log_softmax(h_s[b,t] @ W / tau), log_softmax(h_t[b,t] @ W_t / tau))``
the gradient of each row's loss w.r.t. its logits is local to the row. So a single ``lax.scan`` over
blocks of rows can, per block: project student and teacher, form ``dlogits``, then emit
``grad_h = dlogits @ W^T`` and accumulate ``grad_W += h^T @ dlogits`` in float32, one vocabulary
slab at a time with the LM head's fused backend's tile loop (:func:`hindsight.ops.lm_head._tile_pass`,
unembeddings in their memory orientation, see :mod:`hindsight.ops.lm_head`). The custom VJP's
backward pass only scales these by the scalar cotangent, so no logits are recomputed. When the loss
is not differentiated, the primal path runs a value-only scan and computes no gradient.

For the built-in losses ``dlogits`` has a closed form (see :func:`_reverse_kl`, :func:`_forward_kl`,
:func:`_jsd`), computed in a few passes over the two float32 ``[C, V]`` logit blocks that recompute
their ``exp``/``log`` terms instead of storing them (see :func:`_fresh`): a block holds those two
buffers only, ``dlogits`` overwriting the student's. That is why the default block
(:func:`fused_chunk_size`) is about three times the rows of the generic path at the same memory, and
why the fused loss costs about as much time as the dense one. A callable ``loss`` gets its
``dlogits`` from ``jax.vjp`` and keeps the :func:`~hindsight.ops.default_chunk_size` blocks.

The teacher is a constant: its hidden states and unembedding get zero gradient, as if wrapped in
``stop_gradient``. The weights ``w`` (a mask or token-mean weights) get their exact gradient ``f``.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from hindsight._validation import check_choice, check_static_float, shape_of
from hindsight.ops import lm_head as _lm
from hindsight.ops._chunking import (check_projection, check_temperature,
                                     check_vocab_mask, chunk_rows, default_chunk_size,
                                     put_rows, shifted_block, temper_and_mask)
from hindsight.ops.divergences import generalized_jsd_from_logprobs, kl_from_logprobs
from hindsight.ops.logprobs import PAD_LOGIT

DISTILLATION_LOSSES = ("reverse_kl", "forward_kl", "jsd")

FUSED_BLOCK_BYTES = 224 * 2 ** 20
"""Budget of the float32 ``[C, V]`` buffers a block of the closed-form path holds (two: the student
and teacher logits, ``dlogits`` overwriting the student's; the gradient tiles of
:data:`hindsight.ops.lm_head.VOCAB_TILE` rows are small beside them). At ``V = 151,936`` that is at most 192 rows, 176 for 1,024
tokens (six even blocks): XLA plans 0.2 GiB of temporaries, and the measured working memory (about
0.29 GiB) is a ninth of the dense reverse KL's there, the smaller of the two dense losses'."""

_LIVE_BLOCKS = 2                 # float32 [C, V] buffers of a closed-form block
_EXP_CAP = 80.0                  # largest log-probability ratio the JSD exponentiates (e^80 < f32 max)


def fused_chunk_size(rows: int, vocab: int) -> int:
    """Default rows per block of :func:`fused_distillation_loss` for a built-in loss.

    The most rows whose ``_LIVE_BLOCKS`` float32 ``[C, V]`` buffers fit :data:`FUSED_BLOCK_BYTES`
    (a multiple of 8, at least 8), then evened out over the blocks that ``rows`` needs, so that the
    last block is not mostly padding: 1,024 tokens at ``V = 151,936`` run as 6 blocks of 176 rows
    rather than 5 of 192 and one of 64. The grad-``W`` update reads and writes the whole ``[D, V]``
    accumulator once per block, so fewer, larger blocks are faster.
    """
    rows = max(rows, 1)
    cap = max(8, FUSED_BLOCK_BYTES // (_LIVE_BLOCKS * 4 * max(vocab, 1)) // 8 * 8)
    per_block = -(-rows // -(-rows // cap))           # ceil(rows / number of blocks)
    return min(cap, -(-per_block // 8) * 8)


class _Config(NamedTuple):
    row_loss: Callable            # per-row value ``f(student_logp, *teacher_logps)`` (generic path)
    closed: Callable | None       # closed form ``(z_s, z_t, lmap, g) -> (f, dlogits)``; None: vjp
    lead: tuple
    chunk: int
    temperature: float
    rows: tuple = ()              # per unembedding (student, *teachers): a [V, D] loop operand


# ---- closed-form value and dlogits of the built-in losses ------------------------------------------
#
# Each takes the raw float32 projections ``z_s, z_t [C, V]`` of a block, the logit map ``lmap = (k, b)``
# (``logits = z * k + b``: ``k [C, 1]`` the inverse temperature or None, ``b [1, V]`` 0 / PAD_LOGIT for
# a vocab mask or None) and the row weights ``g [C]`` of ``dlogits`` (None: value only). It returns
# ``(f [C], g * df/dz_s [C, V] or None)``. Every pass over the blocks takes its inputs through
# :func:`_fresh`, and no pass uses one ``[C, V]`` subexpression twice: a second use of ``log p_s``
# reads its row statistics from a second barrier output, and the JSD takes ``log p_t - log p_s``
# on the raw projections (the logit map's bias cancels there). These are what let XLA fuse each
# pass into one loop without intermediate buffers; the tests check the two-buffer plan.

def _fresh(*xs):
    """The same arrays, opaque to XLA's common-subexpression elimination.

    Without this barrier XLA merges the terms the passes recompute and, as it does not duplicate an
    ``exp``/``log`` (nor a broadcast or a shared subexpression feeding a reduction) into two
    consumers, keeps each shared ``[C, V]`` intermediate live in a buffer of its own: up to seven
    buffers instead of two for the JSD. Recomputing costs a few transcendentals per logit. Each
    reduction is a single-output ``sum``, which XLA accumulates accurately (a variadic reduction is
    summed sequentially, losing ~1e-5 relative at ``V = 151,936``)."""
    return jax.lax.optimization_barrier(xs)


def _row_sum(fn, *xs):
    """``sum(fn(*xs), axis=-1, keepdims=True)`` with ``xs`` taken through :func:`_fresh`."""
    return jnp.sum(fn(*_fresh(*xs)), axis=-1, keepdims=True)


def _logits(z, k, b):
    if k is not None:
        z = z * k
    return z if b is None else z + b


def _scaled(d, k):
    return d if k is None else d * k


def _lse(z, k, b):
    """Row max and log-normaliser ``(m, log l)``, each ``[C, 1]``, of the (finite) logits
    ``x = z * k + b``: ``log softmax(x) = (x - m) - log l``, shifted by the max first as
    ``jax.nn.log_softmax`` does (``x - (m + log l)`` would round ``logsumexp`` at the logits'
    magnitude, ~1e-5 at logits of 100)."""
    m = jnp.max(_logits(*_fresh(z, k, b)), axis=-1, keepdims=True)
    return m, jnp.log(_row_sum(lambda z, k, b, m: jnp.exp(_logits(z, k, b) - m), z, k, b, m))


def _logp(z, k, b, m, log_l):
    return (_logits(z, k, b) - m) - log_l


def _reverse_kl(zs, zt, lmap, g):
    """``KL(S||T)`` and ``g * d/dz_s = g k p_s (r - KL)``, ``r = log p_s - log p_t``.

    Where ``log p_s <= LOGP_FLOOR`` the float32 ``p_s`` is exactly 0 and ``r`` is finite, so the term
    is 0 as in :func:`kl_from_logprobs` without its select. The student's row statistics enter the
    value's pass twice, as separate barrier outputs, so that the two uses of ``log p_s`` are
    separate expressions rather than one shared ``[C, V]`` intermediate."""
    k, b = lmap
    st_s, st_t = _lse(zs, k, b), _lse(zt, k, b)
    f = _row_sum(lambda zs, zt, k, b, s1, s2, t: jnp.exp(_logp(zs, k, b, *s1))
                 * (_logp(zs, k, b, *s2) - _logp(zt, k, b, *t)), zs, zt, k, b, st_s, st_s, st_t)
    if g is None:
        return f[:, 0], None
    zs, zt, k, b, st_s, st_t, f1, g = _fresh(zs, zt, k, b, st_s, st_t, f, _scaled(g[:, None], k))
    ls = _logp(zs, k, b, *st_s)
    return f[:, 0], g * jnp.exp(ls) * (ls - _logp(zt, k, b, *st_t) - f1)


def _forward_kl(zs, zt, lmap, g):
    """``KL(T||S)`` and ``g * d/dz_s = g k (p_s - p_t)``."""
    k, b = lmap
    st_s, st_t = _lse(zs, k, b), _lse(zt, k, b)
    f = _row_sum(lambda zs, zt, k, b, s, t1, t2: jnp.exp(_logp(zt, k, b, *t1))
                 * (_logp(zt, k, b, *t2) - _logp(zs, k, b, *s)), zs, zt, k, b, st_s, st_t, st_t)
    if g is None:
        return f[:, 0], None
    # `+ 0 * f` (finite: logits are finite) orders the value's pass before this one, which can then
    # write dlogits over the student's logits (their last use) instead of into a third buffer
    zs, zt, k, b, st_s, (m_t, l_t), g = _fresh(zs, zt, k, b, st_s, st_t, _scaled(g[:, None], k))
    return f[:, 0], g * (jnp.exp(_logp(zs, k, b, *st_s)) - jnp.exp(_logp(zt, k, b, m_t, l_t + 0.0 * f)))


def _jsd(beta, zs, zt, lmap, g):
    """Mixture JSD (``0 < beta < 1``) and ``g * d/dz_s``.

    With ``m = beta p_t + (1 - beta) p_s``, ``r_s = log p_s - log m`` and ``r_t = log p_t - log m``:
    ``f = beta KL(T||M) + (1 - beta) KL(S||M) = beta sum p_t r_t + (1 - beta) sum p_s r_s``, and
    ``df/dlogits_s = (1 - beta) p_s (r_s - KL(S||M))`` (``df/dp_s = (1 - beta) r_s``, then the
    softmax Jacobian). With ``u = log p_t - log p_s``: ``r_s = -log(1 - beta + beta e^u)`` and
    ``r_t = -log(beta + (1 - beta) e^-u)``. Each exponent is capped at ``_EXP_CAP``: beyond it the
    probability multiplying the log is below ``e^-_EXP_CAP``, so the term is below float32 resolution
    of the row sum, and the cap keeps it ``tiny * finite`` rather than ``0 * inf``. The constants
    enter as ``[C, 1]`` rows through :func:`_fresh`: a broadcast scalar would be one ``[C, V]``
    value shared by the passes, which XLA keeps as a buffer."""
    k, b = lmap
    st_s, st_t = _lse(zs, k, b), _lse(zt, k, b)
    c = (st_s[0] - st_t[0]) + (st_s[1] - st_t[1])     # u = (z_t - z_s) k + c
    row = lambda v: jnp.full((shape_of(zs)[0], 1), v, jnp.float32)
    consts = (row(_EXP_CAP), row(beta), row(1.0 - beta))

    def r_s(zs, zt, k, c, cap, bt, bt1):                # log p_s - log m
        return -jnp.log(bt1 + bt * jnp.exp(jnp.minimum(_scaled(zt - zs, k) + c, cap)))

    def s_term(zs, zt, k, b, st_s, c, *consts):        # p_s r_s
        return jnp.exp(_logp(zs, k, b, *st_s)) * r_s(zs, zt, k, c, *consts)

    def t_term(zs, zt, k, b, st_t, c, cap, bt, bt1):   # p_t r_t
        return jnp.exp(_logp(zt, k, b, *st_t)) * -jnp.log(
            bt + bt1 * jnp.exp(jnp.minimum(_scaled(zs - zt, k) - c, cap)))

    ks = _row_sum(s_term, zs, zt, k, b, st_s, c, *consts)       # KL(S||M)
    kt = _row_sum(t_term, zs, zt, k, b, st_t, c, *consts)       # KL(T||M)
    f = (beta * kt + (1.0 - beta) * ks)[:, 0]
    if g is None:
        return f, None
    zs, zt, k, b, st_s, c, ks, g, consts = _fresh(
        zs, zt, k, b, st_s, c, ks, _scaled(((1.0 - beta) * g)[:, None], k), consts)
    return f, g * jnp.exp(_logp(zs, k, b, *st_s)) * (r_s(zs, zt, k, c, *consts) - ks)


def _row_loss(loss, beta) -> tuple[Callable, Callable | None]:
    """``(f, closed)`` for ``loss``: the per-row ``f(student_logp [C, V], *teacher_logps) -> [C]``
    and, for a built-in loss, its closed form (None for a callable, differentiated with ``jax.vjp``)."""
    if callable(loss):
        return loss, None
    check_choice("loss", loss, DISTILLATION_LOSSES)
    if loss == "jsd":
        beta = check_static_float("beta", beta, low=0.0, high=1.0)
        loss = {0.0: "forward_kl", 1.0: "reverse_kl"}.get(beta, loss)
    if loss == "reverse_kl":
        return kl_from_logprobs, _reverse_kl
    if loss == "forward_kl":
        return (lambda ls, lt: kl_from_logprobs(lt, ls)), _forward_kl
    return (lambda ls, lt: generalized_jsd_from_logprobs(ls, lt, beta)), partial(_jsd, beta)


# ---- the scan ----------------------------------------------------------------------------------------

class _Blocks(NamedTuple):
    """The positions as ``n`` flat rows and ``count`` blocks of ``cfg.chunk`` rows, without padding.

    Block ``j`` reads rows ``[start, start + C)`` with ``start = min(j C, n - C)``: the last block is
    shifted back to end at row ``n`` and its rows below ``j C`` (already done by the block before) are
    *stale*: zero weight, and their outputs are not written. Padding instead would copy the hidden
    states (and slice the per-row outputs) whenever ``C`` does not divide ``n``: working memory
    growing with the number of positions."""
    n: int
    count: int
    hs: jax.Array                 # [n, D]
    hts: tuple                    # [n, D_t] per teacher
    w: jax.Array                  # [n] float32

    @classmethod
    def of(cls, cfg, s_hidden, t_hiddens, weights):
        n = math.prod(cfg.lead)
        flat = lambda x: jnp.reshape(x, (n,) + shape_of(x)[len(cfg.lead):])
        return cls(n, -(-n // cfg.chunk), flat(s_hidden), tuple(map(flat, t_hiddens)),
                   flat(weights.astype(jnp.float32)))

    def take(self, cfg, j):
        """``(start, fresh [C] bool, hs_c, hts_c, w_c)`` of block ``j`` (stale rows: weight 0)."""
        c = cfg.chunk
        start, fresh = shifted_block(j, c, self.n)
        rows = lambda x: jax.lax.dynamic_slice_in_dim(x, start, c, axis=0)
        return (start, fresh, rows(self.hs), tuple(map(rows, self.hts)),
                jnp.where(fresh, rows(self.w), 0.0))


def _teacher_logps(cfg, ht_c, t_unembeds, vocab_mask):
    return tuple(jax.nn.log_softmax(temper_and_mask(_lm._project_raw(h, w, r), vocab_mask,
                                                    cfg.temperature))
                 for h, w, r in zip(ht_c, t_unembeds, cfg.rows[1:]))


def _logit_map(cfg, vocab_mask):
    """``(k, b)`` of :func:`_reverse_kl` & co. for this configuration (each None when not needed)."""
    k = None if cfg.temperature == 1.0 else jnp.full((cfg.chunk, 1), 1.0 / cfg.temperature,
                                                      jnp.float32)
    b = None if vocab_mask is None else jnp.where(vocab_mask, 0.0, PAD_LOGIT)[None, :]
    return k, b


def _block(cfg, hs_c, ht_c, w_c, unembed, t_unembeds, vocab_mask, with_grad):
    """``(f [C], dz [C, V] or None)`` of one block: per-row losses and ``d(sum w f)/dz_s``."""
    z = _lm._project_raw(hs_c, unembed, cfg.rows[0])
    live = w_c != 0
    if cfg.closed is not None:
        zt = _lm._project_raw(ht_c[0], t_unembeds[0], cfg.rows[1])
        g = jnp.where(live, w_c, 0.0) if with_grad else None
        f, dz = cfg.closed(z, zt, _logit_map(cfg, vocab_mask), g)
    else:
        t_logps = _teacher_logps(cfg, ht_c, t_unembeds, vocab_mask)

        def rows(z):
            logits = temper_and_mask(z, vocab_mask, cfg.temperature)
            return cfg.row_loss(jax.nn.log_softmax(logits), *t_logps)

        if not with_grad:
            return rows(z), None
        f, vjp = jax.vjp(rows, z)
        (dz,) = vjp(jnp.where(live, w_c, 0.0))
    # a zero-weight row contributes exactly 0, even where its loss is inf/NaN
    return f, None if dz is None else jnp.where(live[:, None], dz, 0.0)


def _weighted(w_c, f):
    # `where`, not a product: a zero-weight row whose loss is inf/NaN still contributes exactly 0.
    return jnp.where(w_c != 0, w_c * f, 0.0)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused_sum(cfg, s_hidden, unembed, t_hiddens, t_unembeds, weights, vocab_mask):
    """Value-only path: ``sum w * f`` as a float32 scalar, no gradient work."""
    blocks = _Blocks.of(cfg, s_hidden, t_hiddens, weights)

    def body(acc, j):
        _, _, hs_c, ht_c, w_c = blocks.take(cfg, j)
        f, _ = _block(cfg, hs_c, ht_c, w_c, unembed, t_unembeds, vocab_mask, with_grad=False)
        return acc + jnp.sum(_weighted(w_c, f)), None

    total, _ = jax.lax.scan(body, jnp.float32(0.0), jnp.arange(blocks.count))
    return total


def _fused_fwd(cfg, s_hidden, unembed, t_hiddens, t_unembeds, weights, vocab_mask):
    blocks = _Blocks.of(cfg, s_hidden, t_hiddens, weights)

    def body(carry, j):
        acc, grad_w, grad_h, f_rows = carry
        start, fresh, hs_c, ht_c, w_c = blocks.take(cfg, j)
        f, dz = _block(cfg, hs_c, ht_c, w_c, unembed, t_unembeds, vocab_mask, with_grad=True)
        gh, grad_w = _lm._tile_pass(dz, unembed, cfg.rows[0], hs_c, grad_w, want_h=True)
        return (acc + jnp.sum(_weighted(w_c, f)), grad_w,
                put_rows(grad_h, start, fresh, gh.astype(grad_h.dtype)),
                put_rows(f_rows, start, fresh, f)), None

    init = (jnp.float32(0.0), jnp.zeros(shape_of(unembed), jnp.float32),
            jnp.zeros(shape_of(blocks.hs), s_hidden.dtype), jnp.zeros((blocks.n,), jnp.float32))
    (total, grad_w, grad_h, f), _ = jax.lax.scan(body, init, jnp.arange(blocks.count))
    residuals = (jnp.reshape(grad_h, shape_of(s_hidden)), grad_w.astype(unembed.dtype),
                 jnp.reshape(f, cfg.lead).astype(weights.dtype))
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
      chunk_size: rows per block (static int); None picks :func:`fused_chunk_size` for a built-in
        loss (176 rows for 1,024 positions at V = 151,936), :func:`~hindsight.ops.default_chunk_size`
        for a callable one (64 rows at V = 151,936).
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
    row_loss, closed = _row_loss(loss, beta)
    if chunk_size is None:
        chunk_size = (default_chunk_size(vocab) if closed is None
                      else fused_chunk_size(math.prod(lead), vocab))
    rows = tuple(map(_lm._is_transpose, (unembed, *t_unembeds)))
    cfg = _Config(row_loss, closed, lead, chunk_rows(lead, vocab, chunk_size),
                  check_temperature(temperature), rows)
    unembed = _lm._operand(unembed, rows[0])
    t_unembeds = tuple(map(_lm._operand, t_unembeds, rows[1:]))
    w = jnp.asarray(weights)
    w = w.astype(jnp.float32) if not jnp.issubdtype(w.dtype, jnp.floating) else w
    mask = None if vocab_mask is None else jnp.asarray(vocab_mask, bool)
    total = _fused_sum(cfg, student_hidden, unembed, t_hiddens, t_unembeds, w, mask)
    return total, jnp.sum(jax.lax.stop_gradient(w).astype(jnp.float32))
