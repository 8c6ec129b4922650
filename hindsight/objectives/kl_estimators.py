"""Sampled estimators of ``KL(pi_theta || pi_ref)`` from log-probs of tokens drawn from ``pi_theta``.

Schulman's k1/k2/k3 with verl's names in brackets: ``k1`` [``kl``] ``= logp - logp_ref``;
``k2`` [``mse``] ``= 0.5 (logp - logp_ref)^2``; ``k3`` [``low_var_kl``] ``= exp(d) - d - 1`` with
``d = logp_ref - logp`` (unbiased because ``E_{pi_theta}[pi_ref / pi_theta] = 1``, and never negative).
The straight-through variants ``k1+`` / ``k3+`` have the forward value of k1 / k3 and the gradient of
k2, whose gradient ``(logp - logp_ref) grad logp`` is the unbiased gradient of the KL as a loss term.
``abs`` [``abs``] ``= |logp - logp_ref|`` is verl's absolute-difference penalty (``kl_penalty_forward`` in
``verl/trainer/ppo/core_algos.py``): not an estimator of the KL (its expectation is not the KL), kept
for parity; its gradient is ``sign(logp - logp_ref)`` with ``sign(0) = 0`` (as torch's ``abs``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight._validation import check_choice, check_same_shape
from hindsight.objectives.aggregation import as_mask
from hindsight.ops.logprobs import carry_nonfinite

ESTIMATORS = ("k1", "k2", "k3", "k1+", "k3+", "abs")

LOG_RATIO_CLIP = 20.0
"""``|logp_ref - logp|`` is clipped here before ``exp`` in k3 (verl)."""

K3_CLIP = 10.0
"""k3 is clipped to ``[-K3_CLIP, K3_CLIP]`` (verl ``low_var_kl``)."""


def _plain(log_ratio: jax.Array, estimator: str) -> jax.Array:
    """k1 / k2 / k3 / abs from ``log_ratio = logp - logp_ref``."""
    if estimator == "k1":
        return log_ratio
    if estimator == "abs":
        # |x| = x * sign(x) with the sign held constant: gradient sign(x), exactly 0 at x = 0 (jnp.abs
        # would give 1 there), so a masked position (log_ratio selected to 0) gets a zero gradient.
        return log_ratio * jax.lax.stop_gradient(jnp.sign(log_ratio))
    if estimator == "k2":
        return 0.5 * log_ratio * log_ratio
    d = jnp.clip(-log_ratio, -LOG_RATIO_CLIP, LOG_RATIO_CLIP)
    return jnp.clip(jnp.exp(d) - d - 1.0, -K3_CLIP, K3_CLIP)


def kl_penalty(logp: jax.Array, logp_ref: jax.Array, mask: jax.Array | None = None, *,
               estimator: str = "k3") -> jax.Array:
    """Per-token estimate of ``KL(pi_theta || pi_ref)`` at tokens sampled from ``pi_theta``.

    Args:
      logp: ``[...]`` log-prob of the sampled token under the trained policy ``pi_theta`` (with grad).
      logp_ref: ``[...]`` log-prob of the same token under the reference policy.
      mask: optional ``[...]`` bool or 0/1 float; masked positions give exactly 0 (and zero gradient).
      estimator: ``"k1"``, ``"k2"``, ``"k3"`` (spec/verl default), ``"k1+"`` or ``"k3+"``
        (straight-through: value of k1/k3, gradient of k2), or ``"abs"`` (verl: ``|logp - logp_ref|``).
    Returns:
      ``[...]`` float32, to be aggregated like the policy loss and added with a coefficient.
    """
    check_same_shape(("logp", "logp_ref"), logp, logp_ref)
    check_choice("estimator", estimator, ESTIMATORS)
    log_ratio = jnp.asarray(logp).astype(jnp.float32) - jnp.asarray(logp_ref).astype(jnp.float32)
    if mask is not None:
        check_same_shape(("logp", "mask"), logp, mask)
        log_ratio = jnp.where(as_mask(mask), log_ratio, 0.0)
    if estimator.endswith("+"):
        k2 = _plain(log_ratio, "k2")
        value = _plain(log_ratio, estimator[:-1])
        out = k2 - jax.lax.stop_gradient(k2) + jax.lax.stop_gradient(value)
    else:
        out = _plain(log_ratio, estimator)
    # k3's clips would turn an infinite log-prob into a finite value with a NaN gradient
    return carry_nonfinite(out, log_ratio)
