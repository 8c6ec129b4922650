"""The clipped-surrogate core shared by the GRPO family (grpo, dapo, drgrpo, hdl, pcsd, craft).

One chunked LM-head pass gives, per response position, the policy's log-prob of the sampled token
(with gradient), its entropy, and the stop-gradient log-probs of the same token under the reference
model and a teacher context when the method has them; the surrogate then goes through
:func:`hindsight.objectives.policy_loss`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax

from hindsight._validation import check_choice, check_static_float
from hindsight.methods.forward import Side, context_hidden, gather, vocab_rows
from hindsight.methods.method import LossConfig
from hindsight.objectives import aggregate, policy_loss
from hindsight.ops import entropy_from_logprobs, kl_from_logprobs

ADVANTAGE_SCALES = ("std", "none")


@dataclasses.dataclass(frozen=True)
class SurrogateConfig(LossConfig):
    """Clipped-surrogate options (verl defaults, spec §1.1).

    Attributes:
      eps_low: ``rho >= 1 - eps_low``. eps_high: ``rho <= 1 + eps_high``.
      dual_clip: bound ``-A c`` on the loss of ``A < 0`` tokens (verl ``clip_ratio_c = 3``); None =
        off.
      advantage_scale: read by the rollout layer, which computes the advantages
        (:func:`hindsight.objectives.group_advantages` ``scale``): ``"std"`` (GRPO) or ``"none"``
        (Dr.GRPO).
    """
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = 3.0
    advantage_scale: str = "std"

    def __post_init__(self):
        super().__post_init__()
        check_static_float("eps_low", self.eps_low, low=0.0, high=1.0)
        check_static_float("eps_high", self.eps_high, low=0.0)
        if self.dual_clip is not None and not check_static_float("dual_clip", self.dual_clip) > 1:
            raise ValueError(f"`dual_clip` must be > 1 (or None), got {self.dual_clip}")
        check_choice("advantage_scale", self.advantage_scale, ADVANTAGE_SCALES)


def policy_rows(model, batch: Mapping, config: LossConfig, *, reference=None,
                teacher: Side | None = None, teacher_kl: bool = False) -> dict[str, jax.Array]:
    """Per-position policy quantities from one chunked pass, each ``[B, T]`` float32.

    Args:
      model: the trained policy (gradient flows through ``logp`` and ``teacher_kl``).
      batch: the batch dict.
      config: supplies ``temperature`` and ``chunk_size``.
      reference: optional reference model, run on the policy context (no gradient).
      teacher: optional frozen teacher side (e.g. ``context_hidden(model, batch, "teacher",
        frozen=True)``).
      teacher_kl: also return the full-vocabulary ``KL(policy || teacher)`` (with gradient).
    Returns:
      ``logp`` (grad), ``entropy`` (no grad); ``ref_logp`` with ``reference``; ``teacher_logp``
      with ``teacher``; ``teacher_kl`` when asked.
    """
    if teacher_kl and teacher is None:
        raise ValueError("`teacher_kl` needs a `teacher` side")
    sides = {"policy": context_hidden(model, batch)}
    if reference is not None:
        sides["reference"] = context_hidden(reference, batch, frozen=True)
    if teacher is not None:
        sides["teacher"] = teacher

    def row(logp, tokens):
        out = {"logp": gather(logp["policy"], tokens),
               "entropy": jax.lax.stop_gradient(entropy_from_logprobs(logp["policy"]))}
        if "reference" in logp:
            out["ref_logp"] = gather(logp["reference"], tokens)
        if "teacher" in logp:
            out["teacher_logp"] = gather(logp["teacher"], tokens)
        if teacher_kl:
            out["teacher_kl"] = kl_from_logprobs(logp["policy"], logp["teacher"])
        return out

    return vocab_rows(row, sides, batch["targets"], chunk_size=config.chunk_size,
                      temperature=config.temperature)


def surrogate_loss(rows: Mapping[str, jax.Array], batch: Mapping, config: SurrogateConfig, *,
                   mode: str = "token-mean", norm: float | None = None, kl_coef: float = 0.0,
                   kl_estimator: str = "k3") -> tuple[jax.Array, jax.Array, dict]:
    """Clipped surrogate (+ ``kl_coef`` x KL to the reference) as ``(sum, count, metrics)``.

    ``metrics``: those of :func:`hindsight.objectives.policy_loss` (clip fractions, ratio,
    approx_kl, pg_loss, and ``kl`` when ``rows`` has ``ref_logp``) plus the policy ``entropy``
    (token-mean over the loss mask).
    """
    total, count, metrics = policy_loss(
        rows["logp"], batch["logp_old"], batch["advantages"], batch["mask"],
        eps_low=config.eps_low, eps_high=config.eps_high, dual_clip=config.dual_clip, mode=mode,
        norm=norm, logp_ref=rows.get("ref_logp"), kl_coef=kl_coef, kl_estimator=kl_estimator)
    metrics["entropy"] = aggregate(rows["entropy"], batch["mask"])
    return total, count, metrics
