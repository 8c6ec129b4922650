"""CRAFT — counterfactual credit from free sibling rollouts (spec §4).

Verified from the abstract [V-page]: three independently switchable pillars — (1) Counterfactual
Token Importance (CTI): the G-1 GRPO siblings, importance-weighted by the teacher-student gap,
give a self-normalised estimate of the counterfactual change in advantage, i.e. a signed per-token
credit; (2) an asymmetric controller trading the distillation weight against the reference-KL weight
along an EMA of gate activity; (3) per-token KL polarisation by the sign of the credit; each switch
off reproduces the baseline (SDAR-style single-gap gate) bit for bit. Every formula and default here
is OUR CHOICE: index alignment of siblings, SNIS over ``softmax(D / tau)``, leave-one-out ``dA``,
the centred asymmetric sigmoid (``k = 2, kappa = (1, 0.5)``), ``G_min = 2``, ``theta_KL = 0.1``, the
controller law (``eta = 0.1, rho* = 0.5, k_up = 1, k_down = 2``), the polarisation estimators.

Stages: :func:`counterfactual_credit` gathers the realised-token gap from logits;
:func:`counterfactual_credit_from_gap` is the ``[B, T]`` group transform. :func:`craft_loss_terms`
composes the pillars into the auxiliary ``(sum, count)`` that a method adds to the GRPO surrogate
(which lives in ``hindsight.objectives``).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from hindsight._validation import (check_choice, check_group_size, check_rank, check_same_shape,
                                   shape_of)
from hindsight.ops import carry_nonfinite
from hindsight.signals._common import (as_f32, as_valid, masked_sum_count, realised_logprobs,
                                       sdar_per_token)

LOG_RATIO_CLIP = 20.0
"""``|logp_ref - logp_S|`` is clipped here before ``exp`` (verl's k3 convention)."""


def counterfactual_credit_from_gap(gap: jax.Array, mask: jax.Array, advantages: jax.Array,
                                   group_size: int, *, tau: float = 1.0, k: float = 2.0,
                                   kappa_pos: float = 1.0, kappa_neg: float = 0.5,
                                   g_min: int = 2) -> jax.Array:
    """Signed per-token credit from the siblings of each rollout (spec §4 steps 1-4, [OURS]).

    For rollout ``i`` at position ``t``, the valid siblings are ``S = {j != i : mask[j, t]}`` of the
    same group (alignment by position index). With ``w = softmax_{j in S}(D[j, t] / tau)`` (SNIS
    weights of the teacher-tilted policy), ``dA = sum_S w_j A_j - mean_S A_j`` and
    ``c = kappa_pos * tanh(k dA / 2)`` if ``dA >= 0`` else ``kappa_neg * tanh(k dA / 2)`` (the spec's
    ``2 sigmoid(k dA) - 1``, written as ``tanh`` to keep precision near 0). ``c = 0`` where
    ``|S| < g_min`` or the position is masked.

    Args:
      gap: ``[B, T]`` ``logp_T - logp_S`` at the realised tokens (detached here).
      mask: ``[B, T]`` bool or 0/1 float.
      advantages: ``[B]`` GRPO advantages (detached here).
      group_size: static ``G``; rows of a group are contiguous, ``B = P * G``.
      tau: SNIS temperature. k: sigmoid sharpness. kappa_pos, kappa_neg: credit scale for positive /
        negative evidence. g_min: minimum number of valid siblings.
    Returns:
      ``[B, T]`` float32 in ``(-kappa_neg, kappa_pos)``, 0 on masked positions, stop-gradient'ed.
    """
    check_rank("gap", gap, rank=2)
    valid = as_valid(mask, gap, like_name="gap")
    batch, length = shape_of(gap)
    if shape_of(advantages) != (batch,):
        raise ValueError(f"`advantages` must have shape ({batch},) to match `gap` {shape_of(gap)}, "
                         f"got {shape_of(advantages)}")
    check_group_size(batch, group_size)
    g = group_size
    d = jnp.where(valid, jax.lax.stop_gradient(as_f32(gap)), 0.0).reshape(-1, g, length) / tau
    a = jax.lax.stop_gradient(as_f32(advantages)).reshape(-1, g)
    m = valid.reshape(-1, g, length)

    # sib[p, i, j, t]: rollout j is a valid sibling of rollout i at position t.
    sib = m[:, None, :, :] & ~jnp.eye(g, dtype=bool)[None, :, :, None]
    logits = jnp.where(sib, d[:, None, :, :], -jnp.inf)
    top = jnp.max(logits, axis=2, keepdims=True)
    e = jnp.where(sib, jnp.exp(logits - jnp.where(sib, top, 0.0)), 0.0)
    n = jnp.sum(sib, axis=2).astype(jnp.float32)
    a_j = a[:, None, :, None]
    snis = jnp.sum(e * a_j, axis=2) / jnp.maximum(jnp.sum(e, axis=2), 1e-30)
    loo_mean = jnp.sum(jnp.where(sib, a_j, 0.0), axis=2) / jnp.maximum(n, 1.0)
    live = m & (n >= g_min)
    delta = jnp.where(live, snis - loo_mean, 0.0)
    c0 = jnp.tanh(0.5 * k * delta)
    credit = jnp.where(delta >= 0, kappa_pos * c0, kappa_neg * c0)
    return jax.lax.stop_gradient(credit.reshape(batch, length))


def counterfactual_credit(teacher_logits: jax.Array, student_logits: jax.Array, tokens: jax.Array,
                          mask: jax.Array, advantages: jax.Array, group_size: int, *,
                          vocab_mask: jax.Array | None = None, **options) -> jax.Array:
    """CRAFT credit ``[B, T]`` from teacher- and student-context logits (gap ``sg(lT - lS)``).

    Args:
      teacher_logits, student_logits: ``[B, T, V]``.
      tokens: ``[B, T]`` int. mask: ``[B, T]`` bool or 0/1 float. advantages: ``[B]``.
      group_size: static ``G`` dividing ``B``.
      vocab_mask: optional ``[V]`` bool.
      **options: keywords of :func:`counterfactual_credit_from_gap` (spec defaults).
    Returns:
      ``[B, T]`` float32, 0 on masked positions, stop-gradient'ed.
    """
    lt, ls = realised_logprobs("teacher_logits", teacher_logits, "student_logits", student_logits,
                               tokens, mask, vocab_mask)
    return counterfactual_credit_from_gap(lt - ls, mask, advantages, group_size, **options)


def cti_loss(credit: jax.Array, gap: jax.Array, student_logp: jax.Array,
             mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """CTI loss ``(sum, count)`` of ``-c * D * logp_S`` (spec §4 step 5, [OURS]).

    The credit-weighted sampled reverse-KL surrogate: ``c = 1`` is plain sampled on-policy
    distillation, ``c < 0`` pushes away from the teacher's preference. ``c`` and ``D`` are detached.

    Args:
      credit, gap, student_logp: ``[B, T]`` (only ``student_logp`` carries the gradient).
      mask: ``[B, T]`` bool or 0/1 float.
    Returns:
      ``(sum, count)`` float32 scalars; ``L_cti = sum / max(count, 1)``.
    """
    check_same_shape(("credit", "gap", "student_logp"), credit, gap, student_logp)
    valid = as_valid(mask, gap, like_name="gap")
    return masked_sum_count(_weighted_sampled_rkl(credit, gap, student_logp, valid), valid)


def _weighted_sampled_rkl(weight, gap, student_logp, valid) -> jax.Array:
    """Per-token ``-sg(weight * D) * logp_S`` (CTI, step 5), masked positions selected away
    first."""
    w = jax.lax.stop_gradient(jnp.where(valid, as_f32(weight) * as_f32(gap), 0.0))
    return -(w * jnp.where(valid, as_f32(student_logp), 0.0))


def _sdar_gated(gate, gap, student_logp, valid) -> jax.Array:
    """Per-token SDAR loss ``sg(g) (sg(logp_T) - logp_S)`` (``compute_sdar_loss``; its value is
    ``g D`` and its gradient ``-g grad logp_S``), masked positions selected away first."""
    ls = jnp.where(valid, as_f32(student_logp), 0.0)
    return sdar_per_token(gate, jnp.where(valid, as_f32(gap), 0.0) + ls, student_logp, valid)


class ControllerState(NamedTuple):
    """CRAFT controller state (spec §4 step 6): a pytree of float32 scalars, checkpointed with the
    train state. ``lam`` weights the distillation term, ``mu`` the reference KL."""
    ema: jax.Array
    lam: jax.Array
    mu: jax.Array


def controller_init(*, rho_target: float = 0.5, lambda_0: float = 0.01,
                    mu_0: float = 0.001) -> ControllerState:
    """Initial state ``e_0 = rho*``, so ``lambda = lambda_0`` (SDAR) and ``mu = mu_0`` (verl k3)."""
    f = lambda x: jnp.asarray(x, jnp.float32)
    return ControllerState(ema=f(rho_target), lam=f(lambda_0), mu=f(mu_0))


def credit_activity(credit: jax.Array, mask: jax.Array, *,
                    theta_kl: float = 0.1) -> tuple[jax.Array, jax.Array]:
    """Gate activity ``(sum, count)`` of ``1[|c| > theta_KL]``; ``rho = sum / max(count, 1)``.

    Returned as a pair so the train step can accumulate it over micro-batches before
    :func:`controller_update`.
    """
    valid = as_valid(mask, credit, like_name="credit")
    active = (jnp.abs(jax.lax.stop_gradient(as_f32(credit))) > theta_kl).astype(jnp.float32)
    return masked_sum_count(active, valid)


def controller_update(state: ControllerState, rho: jax.Array, *, eta: float = 0.1,
                      rho_target: float = 0.5, lambda_0: float = 0.01, mu_0: float = 0.001,
                      k_up: float = 1.0, k_down: float = 2.0) -> ControllerState:
    """One controller step (spec §4 step 6, [OURS]); call once per optimizer step.

    ``e <- (1 - eta) e + eta rho``; ``lambda = clip(lambda_0 exp(k_up (e - rho*)), lambda_0 / 10,
    10 lambda_0)``; ``mu = clip(mu_0 exp(-k_down (e - rho*)), mu_0 / 10, 10 mu_0)``: more active
    credit raises the distillation weight and lowers the reference-KL weight, at asymmetric rates.

    Args:
      state: the current :class:`ControllerState`.
      rho: scalar batch activity from :func:`credit_activity` (detached here).
    Returns:
      The new :class:`ControllerState`.
    """
    rho = jax.lax.stop_gradient(as_f32(rho))
    ema = (1.0 - eta) * as_f32(state.ema) + eta * rho
    lam = jnp.clip(lambda_0 * jnp.exp(k_up * (ema - rho_target)), lambda_0 / 10, 10 * lambda_0)
    mu = jnp.clip(mu_0 * jnp.exp(-k_down * (ema - rho_target)), mu_0 / 10, 10 * mu_0)
    return ControllerState(ema=ema, lam=lam, mu=mu)


def _log_ratio(student_logp, ref_logp, valid) -> jax.Array:
    """``clip(logp_ref - logp_S, +-20)`` with masked positions selected to 0 before any use."""
    return jnp.clip(_raw_log_ratio(student_logp, ref_logp, valid), -LOG_RATIO_CLIP, LOG_RATIO_CLIP)


def _raw_log_ratio(student_logp, ref_logp, valid) -> jax.Array:
    return jnp.where(valid, as_f32(ref_logp), 0.0) - jnp.where(valid, as_f32(student_logp), 0.0)


def _valid_kl(out, student_logp, ref_logp, valid) -> jax.Array:
    """``out`` at valid positions (0 elsewhere), NaN where the log-ratio is not finite: the clips
    would otherwise hide an infinite log-prob behind a finite value with a NaN gradient."""
    return jnp.where(valid, carry_nonfinite(out, _raw_log_ratio(student_logp, ref_logp, valid)),
                     0.0)


def _clip_kl(x, kl_clip):
    return x if kl_clip is None else jnp.clip(x, -kl_clip, kl_clip)


def reverse_k3(student_logp: jax.Array, ref_logp: jax.Array, mask: jax.Array, *,
               kl_clip: float | None = 10.0) -> jax.Array:
    """Per-token reverse k3 ``r - 1 - log r``, ``r = pi_ref / pi_S`` (verl ``low_var_kl``).

    Args:
      student_logp, ref_logp: ``[B, T]`` realised-token log-probs (student carries the gradient).
      mask: ``[B, T]`` bool or 0/1 float.
      kl_clip: verl clips the estimate to ``+-10``; ``None`` disables.
    Returns:
      ``[B, T]`` float32, 0 on masked positions.
    """
    check_same_shape(("student_logp", "ref_logp"), student_logp, ref_logp)
    valid = as_valid(mask, student_logp, like_name="student_logp")
    d = _log_ratio(student_logp, ref_logp, valid)
    return _valid_kl(_clip_kl(jnp.exp(d) - 1.0 - d, kl_clip), student_logp, ref_logp, valid)


def polarised_kl(student_logp: jax.Array, ref_logp: jax.Array, credit: jax.Array, mask: jax.Array,
                 *, theta_kl: float = 0.1, neg_mode: str = "forward", neutral: str = "reverse",
                 kl_clip: float | None = 10.0,
                 forward_kl_clip: float | None = 10.0) -> jax.Array:
    """Per-token KL to the reference, polarised by the sign of the credit (spec §4 step 7, [OURS]).

    With ``r = exp(clip(logp_ref - logp_S, +-20))``: ``c > theta_KL`` -> reverse k3
    ``r - 1 - log r`` (mode-seeking, the baseline); ``c < -theta_KL`` -> the forward-KL estimator
    ``r log r - (r - 1)`` (mode-covering; unbiased for ``KL(pi_ref || pi_S)`` under samples of
    ``pi_S``); ``|c| <= theta_KL`` -> reverse k3.

    Args:
      student_logp, ref_logp: ``[B, T]`` realised-token log-probs (student carries the gradient).
      credit: ``[B, T]`` (detached here). mask: ``[B, T]`` bool or 0/1 float.
      theta_kl: neutral-zone half-width.
      neg_mode: ``"forward"`` (default, the abstract's mode-covering reading) or ``"negate"``
        (``-k3``, the [BRIEF] variant).
      neutral: ``"reverse"`` (default) or ``"zero"`` (no KL in the neutral zone).
      kl_clip: the reverse k3 (and ``-k3``) is clipped to ``+-kl_clip`` like verl's; None: off.
      forward_kl_clip: the forward-KL estimator's own clip (``r log r`` grows faster than k3
        as ``r`` grows); None: off.
    Returns:
      ``[B, T]`` float32, 0 on masked positions.
    """
    check_choice("neg_mode", neg_mode, ("forward", "negate"))
    check_choice("neutral", neutral, ("reverse", "zero"))
    check_same_shape(("student_logp", "ref_logp", "credit"), student_logp, ref_logp, credit)
    valid = as_valid(mask, student_logp, like_name="student_logp")
    c = jax.lax.stop_gradient(as_f32(credit))
    d = _log_ratio(student_logp, ref_logp, valid)
    r = jnp.exp(d)
    rev = _clip_kl(r - 1.0 - d, kl_clip)
    neg = _clip_kl(r * d - (r - 1.0), forward_kl_clip) if neg_mode == "forward" else -rev
    mid = rev if neutral == "reverse" else jnp.zeros_like(rev)
    out = jnp.where(c > theta_kl, rev, jnp.where(c < -theta_kl, neg, mid))
    return _valid_kl(out, student_logp, ref_logp, valid)


def craft_loss_terms(student_logp: jax.Array, ref_logp: jax.Array, gap: jax.Array, mask: jax.Array,
                     advantages: jax.Array, group_size: int,
                     state: ControllerState | None = None, *, cti: bool = True,
                     controller: bool = True, polarise: bool = True, beta_gate: float = 5.0,
                     lambda_0: float = 0.01, mu_0: float = 0.001, theta_kl: float = 0.1,
                     neg_mode: str = "forward", neutral: str = "reverse",
                     kl_clip: float | None = 10.0, forward_kl_clip: float | None = 10.0,
                     **credit_options) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """CRAFT auxiliary loss ``lambda * L_distill + mu * L_KL`` as ``(sum, count, metrics)``.

    The method adds it to the GRPO surrogate (same token count under token-mean):
    ``L = L_GRPO + (sum / max(count, 1))``. Each pillar is a static flag that swaps in the baseline
    term — never a multiplication by 0 (spec §4, bit-exact switches):

    * ``cti``: the credit-weighted sampled reverse-KL surrogate ``-sg(c D) logp_S`` (CTI, step 5);
      off -> the baseline, SDAR's gated loss ``sg(g) (sg(logp_T) - logp_S)``,
      ``g = sigmoid(beta_gate * D)`` (value ``g D``, gradient ``-g grad logp_S``).
    * ``controller``: ``(lambda, mu)`` from ``state`` (step 6); off -> the constants
      ``(lambda_0, mu_0)``.
    * ``polarise``: :func:`polarised_kl` (step 7); off -> plain :func:`reverse_k3`.

    With all three off the result is the baseline (SDAR-gated distillation + fixed-weight k3 KL).

    Args:
      student_logp: ``[B, T]`` realised-token student log-probs (carries the gradient).
      ref_logp: ``[B, T]`` reference-policy log-probs. gap: ``[B, T]`` ``logp_T - logp_S``.
      mask: ``[B, T]`` bool or 0/1 float. advantages: ``[B]``. group_size: static ``G``.
      state: :class:`ControllerState`, required when ``controller`` is on.
      cti, controller, polarise: static pillar switches.
      beta_gate: sharpness of the baseline SDAR gate.
      lambda_0, mu_0: baseline weights (used when the controller is off).
      theta_kl, neg_mode, neutral, kl_clip, forward_kl_clip: see :func:`polarised_kl` /
        :func:`credit_activity` (``kl_clip`` also clips the baseline reverse k3).
      **credit_options: keywords of :func:`counterfactual_credit_from_gap`.
    Returns:
      ``(sum, count, metrics)``: float32 scalars, and a dict with ``distill_sum``, ``kl_sum``,
      ``lambda``, ``mu`` and, when the credit is computed, ``active_sum`` (numerator of ``rho`` for
      :func:`controller_update`).
    """
    check_same_shape(("student_logp", "ref_logp", "gap"), student_logp, ref_logp, gap)
    valid = as_valid(mask, gap, like_name="gap")
    check_group_size(shape_of(gap)[0], group_size)
    if controller and state is None:
        raise ValueError("`state` (ControllerState) is required when `controller=True`")
    gap = jax.lax.stop_gradient(as_f32(gap))
    metrics = {}
    credit = None
    if cti or polarise or controller:
        credit = counterfactual_credit_from_gap(gap, mask, advantages, group_size, **credit_options)
        metrics["active_sum"], _ = credit_activity(credit, mask, theta_kl=theta_kl)

    if cti:
        per_token = _weighted_sampled_rkl(credit, gap, student_logp, valid)
    else:
        gate = jax.nn.sigmoid(beta_gate * jnp.where(valid, gap, 0.0))
        per_token = _sdar_gated(gate, gap, student_logp, valid)
    distill_sum, count = masked_sum_count(per_token, valid)
    if polarise:
        kl_tok = polarised_kl(student_logp, ref_logp, credit, mask, theta_kl=theta_kl,
                              neg_mode=neg_mode, neutral=neutral, kl_clip=kl_clip,
                              forward_kl_clip=forward_kl_clip)
    else:
        kl_tok = reverse_k3(student_logp, ref_logp, mask, kl_clip=kl_clip)
    kl_sum, _ = masked_sum_count(kl_tok, valid)

    if controller:
        lam, mu = state.lam, state.mu
    else:
        lam, mu = lambda_0, mu_0
    total = lam * distill_sum + mu * kl_sum
    metrics.update({"distill_sum": distill_sum, "kl_sum": kl_sum,
                    "lambda": jnp.asarray(lam, jnp.float32), "mu": jnp.asarray(mu, jnp.float32)})
    return total, count, metrics
