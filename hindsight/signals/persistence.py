"""PCSD — persistence-consistency gate for self-distillation (spec §3).

A token is distilled towards the teacher only if the teacher's preference *persists* over the next
few tokens. Anchor [V-page]: the SDAR gate ``sigmoid(beta * gap)`` on the detached teacher-student
log-prob gap, ``beta = 5``, ``lambda = 0.01``. PCSD replaces the single-token gap by a window
statistic: ``N_min = 1, N_max = 8, alpha = 0.8, tau_low = 0.05, tau_high = 0.5`` are [BRIEF]; every
formula below (decayed forward mean, weighted variance, statistic interpolation and its direction,
OLS trend penalty with ``gamma = (N_max - 1) / 2``, uncentred gate, NLL loss) is OUR CHOICE.

Two stages: :func:`persistence_gate` gathers the realised-token gap from logits;
:func:`persistence_stats_from_gap` / :func:`persistence_gate_from_gap` are the ``[B, T]`` window
transform, reusable by a chunked LM-head path. Windows are a static ``[T, N_max]`` gather of the
right-padded gap, O(T * N_max).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hindsight._validation import (check_choice, check_rank, check_same_shape, check_static_float,
                                   shape_of)
from hindsight.ops import kl, token_logprobs
from hindsight.signals._common import (as_f32, as_valid, masked_sum_count, realised_logprobs,
                                       sdar_per_token, valid_logits)

_DEN_EPS = 1e-12


class PersistenceStats(NamedTuple):
    """Per-position statistics of the PCSD gate, each ``[B, T]`` float32 (0 on masked positions)."""
    m_long: jax.Array    # decayed forward mean over N_max (spec step 2)
    variance: jax.Array  # decay-weighted variance around m_long (step 3)
    omega: jax.Array     # interpolation weight (step 4)
    m: jax.Array         # interpolated statistic (step 4)
    slope: jax.Array     # OLS slope over the N_max window (step 5)
    z: jax.Array         # m - gamma * max(0, -slope) (step 6)
    gate: jax.Array      # sigmoid(beta_gate * z) (step 6)


def _windows(x: jax.Array, n: int) -> jax.Array:
    """``[..., T] -> [..., T, n]`` with ``out[..., i, j] = x[..., i + j]`` and 0 beyond the end."""
    length = shape_of(x)[-1]
    padded = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, n - 1)])
    return padded[..., np.arange(length)[:, None] + np.arange(n)[None, :]]


def _decayed_mean(d: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Weighted mean over the last axis and its denominator; 0 where no weight."""
    den = jnp.sum(w, axis=-1)
    mean = jnp.where(den > 0, jnp.sum(w * d, axis=-1) / jnp.maximum(den, _DEN_EPS), 0.0)
    return mean, den


def _ols_slope(d: jax.Array, m: jax.Array) -> jax.Array:
    """Unweighted OLS slope of ``d`` against ``x_j = j`` over valid ``j``; 0 with < 2 points."""
    x = jnp.arange(shape_of(d)[-1], dtype=jnp.float32)
    n = jnp.sum(m, axis=-1, keepdims=True)
    n_safe = jnp.maximum(n, 1.0)
    dx = x - jnp.sum(m * x, axis=-1, keepdims=True) / n_safe
    dd = d - jnp.sum(m * d, axis=-1, keepdims=True) / n_safe
    sxx = jnp.sum(m * dx * dx, axis=-1)
    sxy = jnp.sum(m * dx * dd, axis=-1)
    return jnp.where(n[..., 0] >= 2, sxy / jnp.maximum(sxx, _DEN_EPS), 0.0)


def persistence_stats_from_gap(gap: jax.Array, mask: jax.Array, *, n_max: int = 8, n_min: int = 1,
                               alpha: float = 0.8, tau_low: float = 0.05, tau_high: float = 0.5,
                               beta_gate: float = 5.0, gamma: float | None = None,
                               variance_direction: str = "shrink") -> PersistenceStats:
    """The PCSD gate and its intermediate statistics from a realised-token gap (spec §3 steps 1-6).

    Args:
      gap: ``[B, T]`` ``logp_T - logp_S`` at the realised tokens (stop-gradient'ed here).
      mask: ``[B, T]`` bool or 0/1 float; positions past ``T`` count as masked.
      n_max, n_min: static window lengths (``1 <= n_min <= n_max``) [BRIEF].
      alpha: decay ``a_j = alpha ** j`` of the forward mean and variance [BRIEF value].
      tau_low, tau_high: variance thresholds of ``omega = clip((v - tau_low) / (tau_high - tau_low),
        0, 1)`` [BRIEF values].
      beta_gate: gate sharpness, SDAR's 5.0.
      gamma: trend-penalty scale; default ``(n_max - 1) / 2`` [OURS] so that ``m - gamma * |slope|``
        is the fitted value at the window end when the gap declines.
      variance_direction: ``"shrink"`` [OURS default]: a volatile future (high variance) falls back
        to the short-window statistic; ``"grow"`` flips it (volatile -> long window).
    Returns:
      :class:`PersistenceStats`, every field ``[B, T]`` float32, 0 on masked positions,
      stop-gradient'ed.
    """
    if not (isinstance(n_max, (int, np.integer)) and isinstance(n_min, (int, np.integer))
            and 1 <= n_min <= n_max):
        raise ValueError(f"`n_min`, `n_max` must be static ints with 1 <= n_min <= n_max, "
                         f"got n_min={n_min!r}, n_max={n_max!r}")
    n_max, n_min = int(n_max), int(n_min)
    alpha = check_static_float("alpha", alpha, low=0.0, high=1.0)
    if not tau_high > tau_low:
        raise ValueError(f"`tau_high` ({tau_high}) must exceed `tau_low` ({tau_low})")
    check_choice("variance_direction", variance_direction, ("shrink", "grow"))
    gamma = (n_max - 1) / 2 if gamma is None else gamma
    check_rank("gap", gap, min_rank=1)
    valid = as_valid(mask, gap, like_name="gap")

    d = jnp.where(valid, jax.lax.stop_gradient(as_f32(gap)), 0.0)
    dw = _windows(d, n_max)
    mw = _windows(valid.astype(jnp.float32), n_max)
    decay = jnp.asarray(alpha ** np.arange(n_max), jnp.float32)
    aw = decay * mw

    m_long, den = _decayed_mean(dw, aw)
    m_short, _ = _decayed_mean(dw[..., :n_min], aw[..., :n_min])
    variance = jnp.where(den > 0, jnp.sum(aw * jnp.square(dw - m_long[..., None]), axis=-1)
                         / jnp.maximum(den, _DEN_EPS), 0.0)
    omega = jnp.clip((variance - tau_low) / (tau_high - tau_low), 0.0, 1.0)
    if variance_direction == "shrink":
        m = (1.0 - omega) * m_long + omega * m_short
    else:
        m = (1.0 - omega) * m_short + omega * m_long
    slope = _ols_slope(dw, mw)
    z = m - gamma * jnp.maximum(0.0, -slope)
    gate = jax.nn.sigmoid(beta_gate * z)
    zero = lambda x: jax.lax.stop_gradient(jnp.where(valid, x, 0.0))
    return PersistenceStats(*(zero(x) for x in (m_long, variance, omega, m, slope, z, gate)))


def persistence_gate_from_gap(gap: jax.Array, mask: jax.Array, **options) -> jax.Array:
    """PCSD gate ``[B, T]`` in ``[0, 1]`` from a realised-token gap ``[B, T]``.

    ``options`` are the keywords of :func:`persistence_stats_from_gap` (spec defaults).
    """
    return persistence_stats_from_gap(gap, mask, **options).gate


def persistence_gate(teacher_logits: jax.Array, student_logits: jax.Array, tokens: jax.Array,
                     mask: jax.Array, *, vocab_mask: jax.Array | None = None,
                     **options) -> jax.Array:
    """PCSD gate from teacher- and student-context logits over the same response tokens.

    Args:
      teacher_logits, student_logits: ``[B, T, V]`` (the gap is detached; no gradient flows).
      tokens: ``[B, T]`` int. mask: ``[B, T]`` bool or 0/1 float.
      vocab_mask: optional ``[V]`` bool.
      **options: keywords of :func:`persistence_stats_from_gap` (spec defaults).
    Returns:
      ``[B, T]`` float32 in ``[0, 1]``, 0 on masked positions, stop-gradient'ed.
    """
    lt, ls = realised_logprobs("teacher_logits", teacher_logits, "student_logits", student_logits,
                               tokens, mask, vocab_mask)
    return persistence_gate_from_gap(lt - ls, mask, **options)


def pcsd_loss(gate: jax.Array, student_logp: jax.Array, mask: jax.Array, *, loss: str = "nll",
              teacher_logp: jax.Array | None = None,
              reverse_kl: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Gate-weighted PCSD auxiliary loss as ``(sum, count)`` (spec §3 step 7).

    ``token_mean = sum / max(count, 1)``; the method adds ``lambda * token_mean`` (``lambda = 0.01``)
    to the GRPO loss.

    Args:
      gate: ``[B, T]`` (detached here).
      student_logp: ``[B, T]`` realised-token log-probs under the student (carries the gradient).
      mask: ``[B, T]`` bool or 0/1 float.
      loss: ``"nll"`` [BRIEF default]: ``-logp_S``; ``"rkl"`` (SDAR's best): the full-vocabulary
        reverse KL ``KL(S || T)`` per position, passed as ``reverse_kl``; ``"rkl_sampled"``: the
        sampled-token reverse KL ``sg(lS - lT) * lS``, needs ``teacher_logp``; ``"sdar"``:
        SDAR's ``compute_sdar_loss`` term ``sg(lT) - lS`` (the gated value ``g (lT - lS)``, the
        gradient of ``"nll"``; SEED's ``L_OPD``), needs ``teacher_logp``.
      teacher_logp: ``[B, T]`` realised-token teacher log-probs (``"rkl_sampled"``, ``"sdar"``).
      reverse_kl: ``[B, T]`` per-position ``KL(S || T)`` with gradient (``"rkl"`` only).
    Returns:
      ``(sum, count)`` float32 scalars.
    """
    check_choice("loss", loss, ("nll", "rkl", "rkl_sampled", "sdar"))
    check_same_shape(("gate", "student_logp"), gate, student_logp)
    valid = as_valid(mask, gate, like_name="gate")
    ls = jnp.where(valid, as_f32(student_logp), 0.0)
    if loss == "nll":
        per_token = -ls
    elif loss == "rkl":
        if reverse_kl is None:
            raise ValueError('`reverse_kl` [B, T] is required with loss="rkl"')
        check_same_shape(("reverse_kl", "gate"), reverse_kl, gate)
        per_token = jnp.where(valid, as_f32(reverse_kl), 0.0)
    else:
        if teacher_logp is None:
            raise ValueError(f'`teacher_logp` [B, T] is required with loss="{loss}"')
        check_same_shape(("teacher_logp", "gate"), teacher_logp, gate)
        if loss == "sdar":
            return masked_sum_count(sdar_per_token(gate, teacher_logp, student_logp, valid), valid)
        lt = jnp.where(valid, as_f32(teacher_logp), 0.0)
        per_token = jax.lax.stop_gradient(ls - lt) * ls
    return masked_sum_count(jax.lax.stop_gradient(as_f32(gate)) * per_token, valid)


def persistence_loss(teacher_logits: jax.Array, student_logits: jax.Array, tokens: jax.Array,
                     mask: jax.Array, *, loss: str = "nll", vocab_mask: jax.Array | None = None,
                     **options) -> tuple[jax.Array, jax.Array]:
    """PCSD auxiliary loss ``(sum, count)`` from dense logits (gate + :func:`pcsd_loss`).

    Args:
      teacher_logits: ``[B, T, V]`` (no gradient). student_logits: ``[B, T, V]`` (gradient).
      tokens: ``[B, T]`` int. mask: ``[B, T]`` bool or 0/1 float.
      loss: see :func:`pcsd_loss`; ``"rkl"`` uses the full-vocabulary ``KL(S || T)``.
      vocab_mask: optional ``[V]`` bool.
      **options: keywords of :func:`persistence_stats_from_gap`.
    Returns:
      ``(sum, count)`` float32 scalars.
    """
    valid = as_valid(mask, shape_of(student_logits)[:-1], like_name="student_logits[..., :-1]")
    teacher_logits = valid_logits(teacher_logits, valid)
    student_logits = valid_logits(student_logits, valid)
    gate = persistence_gate(teacher_logits, student_logits, tokens, mask, vocab_mask=vocab_mask,
                            **options)
    ls = token_logprobs(student_logits, tokens, vocab_mask=vocab_mask)
    teacher = jax.lax.stop_gradient(teacher_logits)
    if loss == "rkl":
        return pcsd_loss(gate, ls, mask, loss=loss,
                         reverse_kl=kl(student_logits, teacher, vocab_mask=vocab_mask))
    if loss in ("rkl_sampled", "sdar"):
        return pcsd_loss(gate, ls, mask, loss=loss,
                         teacher_logp=token_logprobs(teacher, tokens, vocab_mask=vocab_mask))
    return pcsd_loss(gate, ls, mask, loss=loss)
