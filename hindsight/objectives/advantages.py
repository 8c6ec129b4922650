"""Group-relative advantages (GRPO / Dr.GRPO / TRL batch scaling), one scalar per sequence.

Rows of a group are contiguous: ``rewards[B]`` with ``B = P * G`` holds prompt ``p``'s ``G`` samples
at rows ``p*G .. p*G + G - 1``. The advantage is broadcast to every token of its sequence by the
policy loss.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight._validation import check_choice, check_group_size, check_rank, check_static_float, shape_of

SCALES = ("std", "none", "batch")
SINGLETONS = ("zero", "reward")

TRL_EPS = 1e-4
"""The eps TRL adds to the std (``trl/trainer/grpo_trainer.py``: ``advantages / (std_rewards + 1e-4)``,
for ``scale_rewards="group"`` and ``"batch"`` alike). Our ``eps`` default stays verl's 1e-6; pass
``eps=TRL_EPS`` to reproduce TRL."""


def _std(centred: jax.Array, n: int, ddof: int, axis) -> jax.Array:
    """``sqrt(sum centred^2 / (n - ddof))`` over ``axis`` (keepdims), with a finite gradient at 0."""
    var = jnp.sum(centred * centred, axis=axis, keepdims=True) / (n - ddof)
    # sqrt has an infinite derivative at 0: take it only where the variance is positive.
    return jnp.sqrt(jnp.where(var > 0, var, 1.0)) * (var > 0)


def _divide(centred: jax.Array, std: jax.Array, eps: float) -> jax.Array:
    """``centred / (std + eps)``; where ``std + eps == 0`` (then ``centred`` is 0) the result is 0, with
    a finite gradient (no ``0/0`` in the forward or backward pass even with ``eps=0``)."""
    den = std + eps
    ok = den > 0
    return jnp.where(ok, centred / jnp.where(ok, den, 1.0), 0.0)


def group_advantages(rewards: jax.Array, group_size: int, scale: str = "std", *, eps: float = 1e-6,
                     ddof: int = 1, singleton: str = "zero") -> jax.Array:
    """``A_i = (R_i - mean_g R) / (std R + eps)``, the mean taken within each group of ``group_size`` rows.

    Args:
      rewards: ``[B]`` scalar reward per sequence (any float/int dtype).
      group_size: ``G``, a static Python int dividing ``B``.
      scale: ``"std"`` (GRPO, verl ``norm_adv_by_std=True``, TRL ``scale_rewards="group"``): the std of
        the group; ``"batch"`` (TRL ``scale_rewards="batch"``, PPO-Lite): the group mean is subtracted
        but the std is that of all ``B`` rewards of the batch (around the batch mean); ``"none"``
        (Dr.GRPO, TRL ``scale_rewards="none"``: ``R_i - mean_g R``, the SDPO config). The batch is the
        ``rewards`` passed in: TRL takes the std over the batch gathered from all processes, so pass the
        whole (gathered) batch to reproduce it.
      eps: added to the std (verl: 1e-6, our default; TRL: 1e-4 = ``TRL_EPS``, for both ``"group"`` and
        ``"batch"``).
      ddof: std degrees of freedom; 1 is the unbiased estimator that verl (``torch.std``) and TRL
        (``nanstd``, Bessel-corrected) use, 0 the population std.
      singleton: advantage of a group with ``G = 1``. ``"zero"`` (OUR CHOICE: one sample carries no
        relative information; also TRL's value, since its centred reward is then 0) or ``"reward"``
        (verl: mean 0 and std 1, so ``A = R / (1 + eps)`` with ``scale="std"`` and ``A = R`` with
        ``scale="none"``; verl has no batch scaling, so ``scale="batch"`` rejects it).
    Returns:
      ``[B]`` float32. A group whose rewards are all equal gets exactly 0 (no ``0/eps`` noise from a
      float32 mean that is off by one ulp) under every ``scale``, and so does a singleton group under
      ``singleton="zero"``; all-equal rewards give 0 with finite gradients even with ``eps=0``.
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
        if scale == "batch":
            raise ValueError("`singleton`='reward' (verl's convention) is not defined with `scale`='batch' "
                             "(verl has no batch scaling); use singleton='zero' or scale='std'/'none'")
        return r[:, 0] / (1.0 + eps) if scale == "std" else r[:, 0]
    centred = r - jnp.mean(r, axis=1, keepdims=True)
    if scale == "std":
        centred = _divide(centred, _std(centred, group_size, ddof, axis=1), eps)
    elif scale == "batch":
        # B >= G >= 2 here, so B - ddof >= 1.
        centred = _divide(centred, _std(r - jnp.mean(r), batch, ddof, axis=None), eps)
    constant = jnp.all(r == r[:, :1], axis=1, keepdims=True)
    return jnp.where(constant, 0.0, centred).reshape(batch)
