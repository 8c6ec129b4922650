"""HSD — hindsight self-distillation: GRPO plus a reverse KL to the policy reprompted with a
successful peer and the reference answer (spec ``other-methods.md`` §12; "Localizing Credit at the
Divergence", arXiv 2606.15576; verified at abstract level only).

Verified: the teacher is the same model conditioned on a successful peer rollout ``o+`` of the
current GRPO group plus the ground-truth answer, the answer alone when no peer succeeded; no extra
sampling, one extra teacher pass per step. OUR CHOICE (after SDPO, spec §12): the peer is drawn
uniformly among the group's other successes (recipe ``("random_successful_peer", "reference")``,
thinking stripped; an exact sample of the success-conditioned policy, which a similarity-based
choice would bias), every row with a context is distilled (successes included), the divergence is
the reverse KL over the student's top-100 ids + tail, and

    L = L_GRPO + lam_hsd * L_RKL,   lam_hsd = 0.1,

two named terms (``policy``: GRPO's clipped surrogate, token mean; ``distill``: token mean of
the reverse KL). The teacher is the current policy under ``stop_gradient`` (``teacher="self"``,
OUR CHOICE: no extra copy of the weights; ``"reference"`` runs it on the reference model).
"""
from __future__ import annotations

import dataclasses

import jax

from hindsight._validation import check_static_float
from hindsight.batch import check_batch
from hindsight.methods.distill import TeacherSurrogateConfig, teacher_policy_rows
from hindsight.methods.forward import context_mask, context_rows
from hindsight.methods.method import Method, require_no_state, resolve_config
from hindsight.methods.policy_gradient import surrogate_terms
from hindsight.objectives import Loss, aggregate, term

NAME = "hsd"
CONTEXTS = ("teacher",)
ROLLOUT = "group"
FIELDS = ("logp_old", "advantages")


@dataclasses.dataclass(frozen=True)
class HSDConfig(TeacherSurrogateConfig):
    """HSD options on top of GRPO's surrogate (spec §12, OUR CHOICE).

    Attributes:
      lam_hsd: weight of the distillation term (0.1).
      top_k, tail, teacher: as :class:`~hindsight.methods.distill.TeacherSurrogateConfig`.
      teacher_context: the teacher-context recipe (``("random_successful_peer", "reference")``).
    """
    lam_hsd: float = 0.1
    teacher_context: tuple = ("random_successful_peer", "reference")

    def __post_init__(self):
        super().__post_init__()
        check_static_float("lam_hsd", self.lam_hsd, low=0.0)


def loss_fn(model, batch, *, config: HSDConfig | None = None, head=None, reference=None,
            method_state=None, external_teacher=None) -> Loss:
    """HSD loss: ``policy`` (GRPO) and ``distill`` (weight ``lam_hsd``, token-mean reverse KL
    over the rows with a context).

    Metrics: GRPO's plus ``reverse_kl`` (unweighted), ``teacher_gap`` and ``context_rows``.
    """
    config = resolve_config(NAME, config, HSDConfig())
    require_no_state(NAME, method_state)
    check_batch(batch, method=NAME, contexts=CONTEXTS, fields=FIELDS)
    rows = teacher_policy_rows(NAME, model, batch, config, head=head, reference=reference,
                               external_teacher=external_teacher)
    terms, metrics = surrogate_terms(rows, batch, config)
    mask = context_mask(batch, "teacher")
    terms["distill"] = term(rows["reverse_kl"], mask, weight=config.lam_hsd)
    metrics["reverse_kl"] = aggregate(jax.lax.stop_gradient(rows["reverse_kl"]), mask)
    metrics["teacher_gap"] = aggregate(
        jax.lax.stop_gradient(rows["teacher_logp"] - rows["logp"]), batch["mask"])
    metrics["context_rows"] = context_rows(batch, "teacher")
    return Loss(terms, metrics)


METHOD = Method(name=NAME, loss_fn=loss_fn, config=HSDConfig(), contexts=CONTEXTS,
                rollout=ROLLOUT, fields=FIELDS,
                paper="HSD, hindsight self-distillation (arXiv 2606.15576; spec §12)")
