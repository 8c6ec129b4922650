"""GRPO / DAPO clipped surrogate policy loss (verl ``compute_policy_loss`` with dual clip).

The loss is to be minimised; with ``rho = pi_theta / pi_old`` per sampled token,
``l = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high))`` and, for ``A < 0`` only,
``l = min(l, -A c)`` (dual clip, ``c = dual_clip``), which bounds the loss of a negative-advantage
token whose ratio has exploded.

``ratio_level="sequence"`` replaces the token ratio by GSPO's sequence ratio (arXiv 2507.18071, verl
``compute_policy_loss_gspo``, TRL ``importance_sampling_level="sequence"``):
``s_b = exp(min(sum_t m (logp - logp_old) / sum_t m, 10))``, one value per row, with verl's token-level
gradient form ``log s_bt = logp_bt - sg(logp_bt) + sg(log s_b)``: token ``t`` of row ``b`` gets the
gradient ``d l(s_b) / d s_b * s_b``. Weighted by any aggregation mode (uniform within a row), this is
exactly the gradient of ``l(s_b)`` taken through the sequence mean, which is what TRL's autograd computes
(for advantages per sequence and ``log s_b`` below the clamp; TRL does not clamp).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight._validation import check_choice, check_rank, check_same_shape, check_static_float, shape_of
from hindsight.objectives.aggregation import aggregate, as_mask, check_mode
from hindsight.objectives.kl_estimators import ESTIMATORS, LOG_RATIO_CLIP, kl_penalty
from hindsight.ops.logprobs import carry_nonfinite

RATIO_LEVELS = ("token", "sequence")

SEQ_LOG_RATIO_MAX = 10.0
"""Upper clamp of the sequence log-ratio at ``ratio_level="sequence"`` (verl ``compute_policy_loss_gspo``:
``torch.clamp(log_seq_importance_ratio, max=10.0)``, no lower clamp; the gradient is 0 above it). The
token level clamps to ``[-LOG_RATIO_CLIP, LOG_RATIO_CLIP]`` as verl's vanilla loss does."""


def broadcast_advantages(advantages: jax.Array, shape: tuple) -> jax.Array:
    """``[B]`` (one per sequence) or ``[B, T]`` (token-level credit) -> float32 ``[B, T]``."""
    s = shape_of(advantages)
    if s == shape[:1]:
        return jnp.broadcast_to(jnp.asarray(advantages).astype(jnp.float32)[:, None], shape)
    if s == shape:
        return jnp.asarray(advantages).astype(jnp.float32)
    raise ValueError(f"`advantages` must have shape {shape[:1]} (per sequence) or {shape} (per token) "
                     f"to match `logp` {shape}, got {s}")


def clipped_surrogate(logp: jax.Array, logp_old: jax.Array, advantages: jax.Array, mask: jax.Array, *,
                      eps_low: float = 0.2, eps_high: float = 0.2,
                      dual_clip: float | None = 3.0, ratio_level: str = "token") -> tuple[jax.Array, dict]:
    """Per-token PPO/GRPO clipped surrogate loss, with DAPO clip-higher and verl's dual clip.

    Args:
      logp: ``[B, T]`` log-prob of the sampled tokens under the trained policy (with grad).
      logp_old: ``[B, T]`` log-prob under the sampling (behaviour) policy, no grad.
      advantages: ``[B]`` (broadcast over tokens) or ``[B, T]`` (token-level credit), no grad.
      mask: ``[B, T]`` bool or 0/1 float.
      eps_low: lower clip, ``rho >= 1 - eps_low`` (verl 0.2).
      eps_high: upper clip, ``rho <= 1 + eps_high`` (verl 0.2; DAPO clip-higher 0.28).
      dual_clip: ``c > 1`` bounding the loss of ``A < 0`` tokens at ``-A c`` (verl 3.0); None = off.
        At ``ratio_level="sequence"`` it applies to ``s_b`` the same way (OUR CHOICE: verl's
        ``compute_policy_loss_gspo`` and TRL have no dual clip; pass ``dual_clip=None`` to reproduce them,
        which only matters for ``A < 0`` rows with ``s_b > c``).
      ratio_level: ``"token"`` (default; PPO/GRPO, ``rho_bt = exp(clip(logp - logp_old, +-20))``) or
        ``"sequence"`` (GSPO: every token of row ``b`` uses ``s_b``, see the module docstring; clipped
        with ``eps_low`` / ``eps_high`` like a token ratio: the GSPO paper uses much smaller values,
        3e-4 / 4e-4). A row without tokens has ``s_b = 1``, loss 0 and zero gradient. GSPO's
        per-sequence objective is ``mode="seq-mean-token-mean"`` in :func:`policy_loss` (verl's gspo
        loss forces it; TRL recommends ``loss_type="grpo"``).
    Returns:
      ``(loss, metrics)``: ``loss [B, T]`` float32, exactly 0 at masked positions; ``metrics`` a dict of
      token-mean ``(sum, count)`` pairs (count = number of tokens, at both levels): ``clip_low_frac``
      (``A < 0, rho < 1 - eps_low``: clipped, no gradient), ``clip_high_frac``
      (``A > 0, rho > 1 + eps_high``), ``dual_clip_frac`` (``A < 0, rho > c``), ``ratio`` (mean ``rho``)
      and ``approx_kl`` (verl ``ppo_kl``: mean of ``-clip(logp - logp_old, -20, 20)``). At
      ``ratio_level="sequence"`` ``rho`` is ``s_b`` at every token of row ``b``, so ``ratio`` is the
      token-weighted mean of ``s_b`` (each row counted once per token) and the clip fractions are the
      fractions of tokens whose row ratio is clipped (verl's gspo ``pg_clipfrac`` is
      ``clip_low_frac + clip_high_frac``; TRL counts sequences instead); ``approx_kl`` stays the
      token-level estimate (verl's gspo ``ppo_kl`` skips the +-20 clamp).
    """
    check_rank("logp", logp, rank=2)
    check_same_shape(("logp", "logp_old", "mask"), logp, logp_old, mask)
    check_choice("ratio_level", ratio_level, RATIO_LEVELS)
    eps_low = check_static_float("eps_low", eps_low, low=0.0, high=1.0)
    eps_high = check_static_float("eps_high", eps_high, low=0.0)
    if dual_clip is not None:
        dual_clip = check_static_float("dual_clip", dual_clip)
        if dual_clip <= 1.0:
            raise ValueError(f"`dual_clip` must be > 1 (or None to disable), got {dual_clip}")
    adv = broadcast_advantages(advantages, shape_of(logp))
    m = as_mask(mask)
    # Select before exp: a masked position with a garbage log-prob must not reach the backward pass.
    log_ratio = jnp.where(m, jnp.asarray(logp).astype(jnp.float32)
                          - jnp.asarray(logp_old).astype(jnp.float32), 0.0)
    adv = jnp.where(m, adv, 0.0)
    token_log_ratio = jnp.clip(log_ratio, -LOG_RATIO_CLIP, LOG_RATIO_CLIP)
    if ratio_level == "token":
        log_rho = token_log_ratio
    else:
        tokens = jnp.sum(m, axis=-1, keepdims=True, dtype=jnp.float32)
        seq = jnp.sum(log_ratio, axis=-1, keepdims=True) / jnp.maximum(tokens, 1.0)
        sg = jax.lax.stop_gradient
        log_rho = log_ratio - sg(log_ratio) + sg(seq)  # value log s_b, gradient 1 at unmasked tokens
        # torch.clamp(max=10): gradient 0 strictly above the bound, 1 at it.
        log_rho = jnp.where(log_rho > SEQ_LOG_RATIO_MAX, SEQ_LOG_RATIO_MAX, log_rho)
    loss, clip_low, clip_high, dual, ratio = token_surrogate(
        log_rho, log_ratio, adv, m, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip)
    metrics = {
        "clip_low_frac": aggregate(clip_low.astype(jnp.float32), m),
        "clip_high_frac": aggregate(clip_high.astype(jnp.float32), m),
        "dual_clip_frac": aggregate(dual.astype(jnp.float32), m),
        "ratio": aggregate(jax.lax.stop_gradient(ratio), m),
        "approx_kl": aggregate(jax.lax.stop_gradient(-token_log_ratio), m),
    }
    return loss, metrics


def token_surrogate(log_rho: jax.Array, log_ratio: jax.Array, adv: jax.Array, m: jax.Array, *,
                    eps_low: float, eps_high: float, dual_clip: float | None):
    """The elementwise core of :func:`clipped_surrogate` (any shape, validated options).

    Args:
      log_rho: the (clamped) log importance ratio the surrogate uses.
      log_ratio: the unclamped ``logp - logp_old`` (0 where masked): a non-finite value makes the
        loss non-finite (:func:`~hindsight.ops.carry_nonfinite`).
      adv: advantages (0 where masked). m: bool mask.
    Returns:
      ``(loss, clip_low, clip_high, dual, ratio)``: ``loss`` exactly 0 where ``m`` is False, the
      three bool indicators of :func:`clipped_surrogate`'s metrics, and ``rho``.
    """
    ratio = jnp.exp(log_rho)
    loss = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high))
    clip_low = m & (adv < 0) & (ratio < 1.0 - eps_low)
    clip_high = m & (adv > 0) & (ratio > 1.0 + eps_high)
    if dual_clip is None:
        dual = jnp.zeros_like(m)
    else:
        dual = m & (adv < 0) & (ratio > dual_clip)
        loss = jnp.where(adv < 0, jnp.minimum(loss, -adv * dual_clip), loss)
    # the log-ratio clip would turn an infinite log-prob into a finite loss with a NaN gradient
    loss = jnp.where(m, carry_nonfinite(loss, log_ratio), 0.0)
    return loss, clip_low, clip_high, dual, ratio


def policy_loss(logp: jax.Array, logp_old: jax.Array, advantages: jax.Array, mask: jax.Array, *,
                eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float | None = 3.0,
                mode: str = "token-mean", norm: float | None = None,
                logp_ref: jax.Array | None = None, kl_coef: float = 0.0,
                kl_estimator: str = "k3", ratio_level: str = "token") -> tuple[jax.Array, jax.Array, dict]:
    """GRPO/DAPO policy loss: clipped surrogate + ``kl_coef`` x estimated ``KL(pi_theta || pi_ref)``.

    Both terms are aggregated with the same ``mode`` over the same mask, so they share one count and
    the result is a single ``(sum, count)`` pair (verl adds ``kl_coef * agg(kl)`` to ``agg(pg)``).

    Args:
      logp, logp_old, advantages, mask, eps_low, eps_high, dual_clip, ratio_level: see
        :func:`clipped_surrogate` (``ratio_level="sequence"`` with ``mode="seq-mean-token-mean"`` and
        ``dual_clip=None`` is verl's ``compute_policy_loss_gspo``).
      mode, norm: aggregation, see :func:`hindsight.objectives.aggregation.aggregate`.
      logp_ref: ``[B, T]`` reference-policy log-probs; required when ``kl_coef > 0``, and reported as
        the ``kl`` metric whenever given.
      kl_coef: weight of the KL penalty; 0 (default, as verl ``use_kl_loss=false`` and DAPO) turns it off.
        verl's usual value when on is 0.001.
      kl_estimator: see :func:`hindsight.objectives.kl_estimators.kl_penalty` (default ``"k3"``).
    Returns:
      ``(sum, count, metrics)``: the loss is ``finalize(sum, count)`` after summing pairs over
      micro-batches. ``metrics`` holds only ``(sum, count)`` pairs (combine by adding, then
      ``finalize_metrics``): those of :func:`clipped_surrogate`, ``pg_loss`` (the surrogate alone,
      aggregated with ``mode``) and, when ``logp_ref`` is given, ``kl`` (the KL estimate aggregated
      with ``mode``, unweighted, also reported when ``kl_coef = 0``).
    """
    check_mode(mode, norm)
    check_choice("ratio_level", ratio_level, RATIO_LEVELS)
    check_choice("kl_estimator", kl_estimator, ESTIMATORS)
    kl_coef = check_static_float("kl_coef", kl_coef, low=0.0)
    if kl_coef > 0.0 and logp_ref is None:
        raise ValueError(f"`kl_coef`={kl_coef} needs `logp_ref` (reference log-probs of shape "
                         f"{shape_of(logp)}), got None")
    if logp_ref is not None:
        check_same_shape(("logp", "logp_ref"), logp, logp_ref)
    per_token, metrics = clipped_surrogate(logp, logp_old, advantages, mask, eps_low=eps_low,
                                           eps_high=eps_high, dual_clip=dual_clip, ratio_level=ratio_level)
    total, count = aggregate(per_token, mask, mode=mode, norm=norm)
    metrics["pg_loss"] = (jax.lax.stop_gradient(total), count)
    if logp_ref is not None:
        kl_sum, _ = aggregate(kl_penalty(logp, logp_ref, mask, estimator=kl_estimator), mask,
                              mode=mode, norm=norm)
        metrics["kl"] = (jax.lax.stop_gradient(kl_sum), count)
        if kl_coef > 0.0:
            total = total + kl_coef * kl_sum
    return total, count, metrics
