"""DemoPSD — disagreement-modulated policy self-distillation (spec §6).

DemoPSD (arXiv 2607.02502; abstract-level verification): the target is a reverse-KL barycenter of
teacher and student, ``q ∝ T^(1 - alpha) S^alpha``, with a per-token blend ``alpha`` that grows with
the teacher-student disagreement ``d = JSD_0.5(T, S)`` (strong disagreement is read as privileged
information leaking into the teacher): ``alpha = alpha_max (2 sigmoid(beta d) - 1)``,
``alpha_max = 0.15`` [BRIEF], ``beta = 25`` (OUR CHOICE, middle of the sweep). Loss: the
full-vocabulary ``KL(S || sg(q))`` per response token, token-mean.

Inherited from SDPO (OUR CHOICE, spec §6): an EMA teacher (``teacher="reference"`` with an EMA
reference, SDPO's rate 0.05 = ``ema_decay`` 0.95) and the importance weight
``min(exp(clip(logp_S - logp_old, +-20)), is_clip)``, ``is_clip = 2`` (detached), for tokens sampled
by an older policy.
"""
from __future__ import annotations

import dataclasses

import jax

from hindsight._validation import check_choice, check_static_float
from hindsight.batch import check_batch
from hindsight.methods.distill import weighted_distill_term
from hindsight.methods.forward import context_hidden, gather, vocab_rows
from hindsight.methods.method import (TEACHERS, LossConfig, Method,
                                      require_no_state, resolve_config, teacher_hidden)
from hindsight.objectives import Loss, aggregate
from hindsight.ops import entropy_from_logprobs, kl_from_logprobs
from hindsight.signals import LOGP_TARGET_FLOOR, barycenter_target_from_logprobs

NAME = "demopsd"
CONTEXTS = ("teacher",)
ROLLOUT = "group"
FIELDS = ("logp_old",)


@dataclasses.dataclass(frozen=True)
class DemoPSDConfig(LossConfig):
    """DemoPSD options (spec §6).

    Attributes:
      alpha_max: largest student weight of the target (0.15).
      beta: sharpness of the disagreement sigmoid (25).
      floor: log-prob floor inside the geometric target (-50).
      teacher: ``"reference"`` (EMA teacher, SDPO) or ``"self"`` (current params, stop-gradient).
      is_clip: cap of the importance weight (2.0); None = no importance weight.
    """
    alpha_max: float = 0.15
    beta: float = 25.0
    floor: float = LOGP_TARGET_FLOOR
    teacher: str = "reference"
    is_clip: float | None = 2.0

    def __post_init__(self):
        super().__post_init__()
        check_static_float("alpha_max", self.alpha_max, low=0.0, high=1.0)
        check_static_float("beta", self.beta, low=0.0)
        check_choice("teacher", self.teacher, TEACHERS)
        if self.is_clip is not None and not check_static_float("is_clip", self.is_clip) > 0:
            raise ValueError(f"`is_clip` must be > 0 (or None), got {self.is_clip}")

    @property
    def needs_reference(self) -> bool:
        return self.teacher == "reference"


def loss_fn(model, batch, *, config: DemoPSDConfig | None = None, head=None, reference=None,
            method_state=None, external_teacher=None) -> Loss:
    """DemoPSD loss: the ``distill`` term, token-mean of ``w * KL(S || q)``.

    Metrics: ``barycenter_kl`` (unweighted ``KL(S || q)``), ``alpha`` (mean blend), ``entropy``
    (student) and, with ``is_clip``, ``is_weight`` and ``is_clip_frac``.
    """
    config = resolve_config(NAME, config, DemoPSDConfig())
    require_no_state(NAME, method_state)
    check_batch(batch, method=NAME, contexts=CONTEXTS, fields=FIELDS)
    sides = {"student": context_hidden(model, batch),
             "teacher": teacher_hidden(NAME, config.teacher, model, reference, batch,
                                       external=external_teacher)}

    def row(logp, tokens):
        ls = logp["student"]
        log_q, alpha = barycenter_target_from_logprobs(
            logp["teacher"], ls, alpha_max=config.alpha_max, beta=config.beta, floor=config.floor)
        sg = jax.lax.stop_gradient
        return {"kl": kl_from_logprobs(ls, log_q), "alpha": alpha,
                "entropy": sg(entropy_from_logprobs(ls)), "logp": sg(gather(ls, tokens))}

    rows = vocab_rows(row, sides, batch["targets"], batch["mask"], head=head,
                      temperature=config.temperature)
    mask = batch["mask"]
    metrics = {"barycenter_kl": aggregate(jax.lax.stop_gradient(rows["kl"]), mask),
               "alpha": aggregate(rows["alpha"], mask),
               "entropy": aggregate(rows["entropy"], mask)}
    distill, is_metrics = weighted_distill_term(rows["kl"], rows["logp"], batch["logp_old"],
                                                mask, is_clip=config.is_clip)
    return Loss({"distill": distill}, {**metrics, **is_metrics})


METHOD = Method(name=NAME, loss_fn=loss_fn, config=DemoPSDConfig(), contexts=CONTEXTS,
                rollout=ROLLOUT, fields=FIELDS,
                paper="DemoPSD (arXiv 2607.02502); formulas spec §6")
