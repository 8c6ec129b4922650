"""Group-relative advantages (GRPO / Dr.GRPO), one scalar per sequence.

Rows of a group are contiguous: ``rewards[B]`` with ``B = P * G`` holds prompt ``p``'s ``G`` samples
at rows ``p*G .. p*G + G - 1``. The advantage is broadcast to every token of its sequence by the
policy loss.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight._validation import check_choice, check_group_size, check_rank, check_static_float, shape_of

SCALES = ("std", "none")
SINGLETONS = ("zero", "reward")


def group_advantages(rewards: jax.Array, group_size: int, scale: str = "std", *, eps: float = 1e-6,
                     ddof: int = 1, singleton: str = "zero") -> jax.Array:
    """``A_i = (R_i - mean_g R) / (std_g R + eps)`` within each group of ``group_size`` rows.

    Args:
      rewards: ``[B]`` scalar reward per sequence (any float/int dtype).
      group_size: ``G``, a static Python int dividing ``B``.
      scale: ``"std"`` (GRPO, verl ``norm_adv_by_std=True``) or ``"none"`` (Dr.GRPO: ``R_i - mean_g R``,
        the SDPO config).
      eps: added to the std (verl: 1e-6).
      ddof: std degrees of freedom; 1 is the unbiased estimator that verl uses (``torch.std``),
        0 the population std.
      singleton: advantage of a group with ``G = 1``. ``"zero"`` (OUR CHOICE: one sample carries no
        relative information) or ``"reward"`` (verl: mean 0 and std 1, so ``A = R / (1 + eps)`` with
        ``scale="std"`` and ``A = R`` with ``scale="none"``).
    Returns:
      ``[B]`` float32. A group whose rewards are all equal gets exactly 0 (no ``0/eps`` noise from a
      float32 mean that is off by one ulp), and so does a singleton group under ``singleton="zero"``.
    """
    check_rank("rewards", rewards, rank=1)
    batch = shape_of(rewards)[0]
    check_group_size(batch, group_size)
    check_choice("scale", scale, SCALES)
    check_choice("singleton", singleton, SINGLETONS)
    eps = check_static_float("eps", eps, low=0.0)
    if ddof not in (0, 1):
        raise ValueError(f"`ddof` must be 0 or 1, got {ddof!r}")
    r = jnp.asarray(rewards).astype(jnp.float32).reshape(batch // group_size, group_size)
    if group_size == 1:
        if singleton == "zero":
            return jnp.zeros((batch,), jnp.float32)
        return r[:, 0] / (1.0 + eps) if scale == "std" else r[:, 0]
    centred = r - jnp.mean(r, axis=1, keepdims=True)
    if scale == "std":
        var = jnp.sum(centred * centred, axis=1, keepdims=True) / (group_size - ddof)
        # sqrt has an infinite derivative at 0: take it only where the variance is positive.
        std = jnp.sqrt(jnp.where(var > 0, var, 1.0)) * (var > 0)
        centred = centred / (std + eps)
    constant = jnp.all(r == r[:, :1], axis=1, keepdims=True)
    return jnp.where(constant, 0.0, centred).reshape(batch)
