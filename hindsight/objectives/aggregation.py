"""Loss aggregation as ``(sum, count)`` pairs, so that means are exact across micro-batches.

Every mode reduces a per-token quantity ``[B, T]`` to a float32 pair ``(sum, count)``. For
``"token-mean"``, ``"seq-mean-token-mean"`` and ``"seq-mean-token-sum"`` the ratio ``sum / count`` is
the value of verl's ``agg_loss`` (``verl/trainer/ppo/core_algos.py``, defaults ``dp_size=1`` and no
``batch_num_tokens`` / ``global_batch_size``; the global values play the role of our summed counts).
``"seq-mean-token-sum-norm"`` is the Dr.GRPO / TRL ``loss_type="dr_grpo"`` normalisation, equal to
verl's only from verl v0.7.1 on (see :func:`aggregate`). Pairs from micro-batches (or devices) are
combined by adding sums and counts (``jax.tree.map(jnp.add, a, b)`` works on whole metric dicts);
:func:`finalize` divides once per optimizer step, which is what makes the result independent of how
the batch was split.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight._validation import check_choice, check_rank, check_same_shape, check_static_float

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def as_mask(mask: jax.Array) -> jax.Array:
    """Boolean view of a response mask (bool or 0/1 float; any positive value counts as a token)."""
    return jnp.asarray(mask) > 0


def check_mode(mode: str, norm: float | None) -> float | None:
    """Validate an aggregation ``mode`` and its ``norm``; return ``norm`` as a Python float (or None).

    Losses call this before any computation, so that a bad configuration fails before tracing.
    """
    check_choice("mode", mode, MODES)
    if mode != "seq-mean-token-sum-norm":
        if norm is not None:
            raise ValueError(f"`norm` only applies to mode='seq-mean-token-sum-norm', got mode={mode!r}")
        return None
    if norm is None:
        raise ValueError("mode='seq-mean-token-sum-norm' needs `norm` (e.g. the maximum response "
                         "length), got None")
    norm = check_static_float("norm", norm)
    if norm <= 0:
        raise ValueError(f"`norm` must be positive, got {norm}")
    return norm


def aggregate(per_token: jax.Array, mask: jax.Array, *, mode: str = "token-mean",
              norm: float | None = None) -> tuple[jax.Array, jax.Array]:
    """Reduce ``per_token [B, T]`` over the masked tokens to ``(sum, count)``.

    Modes (``finalize(sum, count)`` is the verl ``agg_loss`` value; for the last mode only from v0.7.1):
      * ``"token-mean"`` (DAPO, verl default): ``(sum_bt x*m, sum_bt m)``.
      * ``"seq-mean-token-mean"`` (original GRPO): ``(sum_b mean_t x, #rows with >= 1 token)``.
      * ``"seq-mean-token-sum"``: ``(sum_b sum_t x, #rows with >= 1 token)``.
      * ``"seq-mean-token-sum-norm"`` (Dr.GRPO): ``(sum_b sum_t x / norm, #rows with >= 1 token)``;
        ``norm`` is a constant such as the maximum response length, required here. ``finalize`` gives
        ``sum_bt x*m / (R * norm)`` with ``R`` the number of rows holding >= 1 token. That is TRL's
        ``loss_type="dr_grpo"`` (``trl/trainer/grpo_trainer.py`` ``_compute_loss``:
        ``(per_token_loss * mask).sum() / (B * max_completion_length)``) with
        ``norm = max_completion_length`` whenever every row has a token; TRL's ``B`` counts ALL rows,
        so a batch with empty rows gives TRL ``R / B`` times our value. verl's
        ``agg_loss(..., "seq-mean-token-sum-norm", loss_scale_factor=norm)`` equals ours from verl
        v0.7.1 on (PR #5417, 2026-02-26: the token sums of the rows with a token, divided by ``R`` and
        by ``loss_scale_factor``). verl up to v0.7.0 (and its main branch before that PR, e.g.
        volcengine/verl b178a3cd) returns ``sum_bt x*m / loss_scale_factor`` without dividing by any
        number of rows: our ``sum`` alone, ``R`` times our value (``ones[4, 8]`` with ``norm = 8``:
        4.0 there, 1.0 here). A documented difference with those versions: the per-row mean keeps the
        loss scale independent of the batch size, as in Dr.GRPO, TRL and current verl.
    Rows without any token contribute 0 to both sum and count in every mode.

    Args:
      per_token: ``[B, T]`` any float dtype; values at masked positions are ignored (even NaN).
      mask: ``[B, T]`` bool or 0/1 float.
      mode: one of ``MODES``.
      norm: static positive float, only for ``"seq-mean-token-sum-norm"``.
    Returns:
      ``(sum, count)``, two float32 scalars.
    """
    check_rank("per_token", per_token, rank=2)
    check_same_shape(("per_token", "mask"), per_token, mask)
    norm = check_mode(mode, norm)
    m = as_mask(mask)
    x = jnp.where(m, jnp.asarray(per_token).astype(jnp.float32), 0.0)
    if mode == "token-mean":
        return jnp.sum(x), jnp.sum(m, dtype=jnp.float32)
    tokens = jnp.sum(m, axis=-1, dtype=jnp.float32)
    rows = jnp.sum(tokens > 0, dtype=jnp.float32)
    row_sum = jnp.sum(x, axis=-1)
    if mode == "seq-mean-token-mean":
        return jnp.sum(row_sum / jnp.maximum(tokens, 1.0)), rows
    if mode == "seq-mean-token-sum":
        return jnp.sum(row_sum), rows
    return jnp.sum(row_sum) / norm, rows


def token_weights(mask: jax.Array, *, mode: str = "token-mean",
                  norm: float | None = None) -> jax.Array:
    """``[B, T]`` float32 weights ``w`` with ``aggregate(x, mask, mode=mode)[0] == sum(w * x)``
    (up to float reassociation) for every ``x``: each mode's sum is linear in the per-token values,
    with coefficients that depend on the mask only. 0 at masked positions; ``1`` (token-mean,
    seq-mean-token-sum), ``1 / tokens_b`` (seq-mean-token-mean), ``1 / norm``
    (seq-mean-token-sum-norm). What a loss needs to form a term's sum one position at a time
    (:func:`hindsight.ops.lm_head_sum`)."""
    check_rank("mask", mask, rank=2)
    norm = check_mode(mode, norm)
    m = as_mask(mask)
    one = m.astype(jnp.float32)
    if mode in ("token-mean", "seq-mean-token-sum"):
        return one
    if mode == "seq-mean-token-mean":
        return one / jnp.maximum(jnp.sum(one, axis=-1, keepdims=True), 1.0)
    return one / norm


def finalize(total: jax.Array, count: jax.Array) -> jax.Array:
    """``total / max(count, 1)``: the mean of a ``(sum, count)`` pair; 0 when nothing was counted."""
    return jnp.asarray(total, jnp.float32) / jnp.maximum(jnp.asarray(count, jnp.float32), 1.0)


def finalize_metrics(metrics: dict) -> dict:
    """Apply :func:`finalize` to every ``(sum, count)`` pair of a metrics dict (after combining)."""
    return {name: finalize(*pair) for name, pair in metrics.items()}
