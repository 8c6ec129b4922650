"""PCSD — GRPO plus persistence-consistency-gated self-distillation (spec §3).

Paper not located; the gate extends SDAR's ``sigmoid(beta * gap)`` gate (arXiv 2605.15155,
``beta = 5``, ``lambda = 0.01``, reverse-KL ablation) with a window statistic (``N_max = 8``,
``alpha = 0.8``, ``tau = (0.05, 0.5)`` [BRIEF]; formulas OUR CHOICE, see
:mod:`hindsight.signals.persistence`).

``L = L_GRPO + lambda * token_mean(sg(w) * l)`` with the gate ``w`` computed from the gap
``D = sg(logp_T - logp_S)`` between the teacher context (privileged: question + reference answer /
feedback, same weights under ``stop_gradient`` by default) and the policy, at the sampled tokens;
``l = -logp_S`` (``loss="nll"``, [BRIEF] default), the full-vocabulary ``KL(S || T)``
(``"rkl"``, SDAR's best), its sampled form ``sg(lS - lT) lS`` (``"rkl_sampled"``) or SDAR's
``compute_sdar_loss`` term ``sg(lT) - lS`` (``"sdar"``: the gradient of ``"nll"``, the value
``g (lT - lS)``; SEED's, :mod:`hindsight.methods.seed`). The method
returns two named terms, ``policy`` and ``distill`` (weight ``lam``), each a token mean.
"""
from __future__ import annotations

import dataclasses

import jax

from hindsight._validation import check_choice, check_static_float
from hindsight.batch import check_batch
from hindsight.methods.method import (TEACHERS, Method, require_no_state,
                                      resolve_config, teacher_hidden)
from hindsight.methods.policy_gradient import SurrogateConfig, policy_rows, surrogate_terms
from hindsight.objectives import Loss, Term, aggregate
from hindsight.signals import pcsd_loss, persistence_gate_from_gap

NAME = "pcsd"
CONTEXTS = ("teacher",)
ROLLOUT = "group"
FIELDS = ("logp_old", "advantages")
LOSSES = ("nll", "rkl", "rkl_sampled", "sdar")


@dataclasses.dataclass(frozen=True)
class PCSDConfig(SurrogateConfig):
    """PCSD options (spec §3 defaults) on top of GRPO's surrogate.

    Attributes:
      lam: weight of the distillation term (0.01, SDAR).
      loss: ``"nll"`` (default), ``"rkl"``, ``"rkl_sampled"`` or ``"sdar"``.
      teacher: ``"self"`` (same params, stop-gradient) or ``"reference"``.
      n_max, n_min, alpha, tau_low, tau_high, beta_gate, gamma, variance_direction: the gate's
        window options (:func:`hindsight.signals.persistence_stats_from_gap`).
    """
    lam: float = 0.01
    loss: str = "nll"
    teacher: str = "self"
    n_max: int = 8
    n_min: int = 1
    alpha: float = 0.8
    tau_low: float = 0.05
    tau_high: float = 0.5
    beta_gate: float = 5.0
    gamma: float | None = None
    variance_direction: str = "shrink"

    def __post_init__(self):
        super().__post_init__()
        check_static_float("lam", self.lam, low=0.0)
        check_choice("loss", self.loss, LOSSES)
        check_choice("teacher", self.teacher, TEACHERS)
        check_choice("variance_direction", self.variance_direction, ("shrink", "grow"))
        if not (isinstance(self.n_max, int) and isinstance(self.n_min, int)
                and 1 <= self.n_min <= self.n_max):
            raise ValueError(f"`n_min`, `n_max` must be ints with 1 <= n_min <= n_max, got "
                             f"n_min={self.n_min!r}, n_max={self.n_max!r}")
        if not self.tau_high > self.tau_low:
            raise ValueError(f"`tau_high` ({self.tau_high}) must exceed `tau_low` "
                             f"({self.tau_low})")

    @property
    def needs_reference(self) -> bool:
        return self.teacher == "reference"

    def gate_options(self) -> dict:
        return dict(n_max=self.n_max, n_min=self.n_min, alpha=self.alpha, tau_low=self.tau_low,
                    tau_high=self.tau_high, beta_gate=self.beta_gate, gamma=self.gamma,
                    variance_direction=self.variance_direction)


def loss_fn(model, batch, *, config: PCSDConfig | None = None, head=None, reference=None,
            method_state=None, external_teacher=None) -> Loss:
    """PCSD loss ``L_GRPO + lam * L_pcsd``: terms ``policy`` and ``distill`` (``L_pcsd``, weight
    ``lam``), both token means.

    Metrics: GRPO's (:func:`hindsight.methods.grpo.loss_fn`) plus ``gate_mean``, ``teacher_gap``
    (mean ``logp_T - logp_S`` at the sampled tokens) and, with ``loss="rkl"``, ``teacher_kl``
    (mean full-vocabulary ``KL(S || T)``).
    """
    config = resolve_config(NAME, config, PCSDConfig())
    require_no_state(NAME, method_state)
    check_batch(batch, method=NAME, contexts=CONTEXTS, fields=FIELDS)
    teacher = teacher_hidden(NAME, config.teacher, model, reference, batch,
                             external=external_teacher)
    rows = policy_rows(model, batch, config, head=head, reference=reference, teacher=teacher,
                       teacher_kl=config.loss == "rkl")
    terms, metrics = surrogate_terms(rows, batch, config)
    mask = batch["mask"]
    gap = jax.lax.stop_gradient(rows["teacher_logp"] - rows["logp"])
    gate = persistence_gate_from_gap(gap, mask, **config.gate_options())
    aux, aux_count = pcsd_loss(gate, rows["logp"], mask, loss=config.loss,
                               teacher_logp=rows["teacher_logp"], reverse_kl=rows.get("teacher_kl"))
    terms["distill"] = Term(sum=aux, count=aux_count, weight=config.lam)
    metrics["gate_mean"] = aggregate(gate, mask)
    metrics["teacher_gap"] = aggregate(gap, mask)
    if "teacher_kl" in rows:
        metrics["teacher_kl"] = aggregate(jax.lax.stop_gradient(rows["teacher_kl"]), mask)
    return Loss(terms, metrics)


METHOD = Method(name=NAME, loss_fn=loss_fn, config=PCSDConfig(), contexts=CONTEXTS,
                rollout=ROLLOUT, fields=FIELDS,
                paper="PCSD (paper not located; spec §3), gate anchored on SDAR (arXiv 2605.15155)")
