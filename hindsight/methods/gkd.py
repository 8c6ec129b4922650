"""GKD — generalized knowledge distillation from a teacher model (TRL's ``GKDTrainer``, spec
``other-methods.md`` §6; Agarwal et al., "On-Policy Distillation of Language Models").

Per step, with probability ``lmbda`` the rows are the student's own samples (on-policy), else the
examples' completions (off-policy, the dataset's) or, with ``seq_kd``, the teacher's samples (the
``gkd`` rollout: one row per prompt). Loss: TRL's ``generalized_jsd_loss``, logits divided by the
temperature, ``M = (1 - beta) S + beta T``, ``beta KL(T || M) + (1 - beta) KL(S || M)`` (0 =
``KL(T || S)``, 1 = ``KL(S || T)``), summed over the vocabulary and averaged over the completion
tokens (``batchmean``): the ``distill`` term. The teacher reads the same context as the student (no
privileged context): by default an external checkpoint (``teacher="external"``,
``teacher.model.name``, sharing the student's tokenizer); ``"reference"`` / ``"self"`` run the
policy's own weights. Defaults are TRL's ``GKDConfig``: ``beta = 0.5``, ``lmbda = 0.5``,
temperature 0.9, ``seq_kd = False``.
"""
from __future__ import annotations

import dataclasses

from hindsight._validation import check_choice, check_static_float
from hindsight.batch import check_batch
from hindsight.methods.distill import TokenDivergence, divergence_loss
from hindsight.methods.forward import context_hidden
from hindsight.methods.method import (TEACHERS, LossConfig, Method, require_no_state,
                                      resolve_config, teacher_hidden)
from hindsight.objectives import Loss

NAME = "gkd"
CONTEXTS = ()
ROLLOUT = "gkd"
FIELDS = ()


@dataclasses.dataclass(frozen=True)
class GKDConfig(LossConfig):
    """GKD options (TRL ``GKDConfig`` defaults).

    Attributes:
      beta: generalized-JSD weight in ``[0, 1]`` (0.5).
      lmbda: probability that a step trains on the student's own samples (0.5).
      seq_kd: off-policy rows are the teacher's samples instead of the dataset's (False).
      temperature: the loss's and the sampling's (0.9).
      teacher: ``"external"`` (default), ``"reference"`` or ``"self"``.
    """
    beta: float = 0.5
    lmbda: float = 0.5
    seq_kd: bool = False
    temperature: float = 0.9
    teacher: str = "external"

    def __post_init__(self):
        super().__post_init__()
        check_static_float("beta", self.beta, low=0.0, high=1.0)
        check_static_float("lmbda", self.lmbda, low=0.0, high=1.0)
        if not isinstance(self.seq_kd, bool):
            raise ValueError(f"`seq_kd` must be a bool, got {self.seq_kd!r}")
        check_choice("teacher", self.teacher, TEACHERS)
        if self.seq_kd and self.teacher != "external":
            raise ValueError(f"`seq_kd=True` samples the off-policy rows from an external teacher: "
                             f"it needs teacher='external', got teacher={self.teacher!r}")

    @property
    def needs_reference(self) -> bool:
        return self.teacher == "reference"


def loss_fn(model, batch, *, config: GKDConfig | None = None, head=None, reference=None,
            method_state=None, external_teacher=None) -> Loss:
    """GKD loss: the ``distill`` term, token-mean generalized JSD(student, teacher).

    Metrics: ``entropy`` (student), ``teacher_gap`` (mean ``l_T - l_S`` at the row's tokens)."""
    config = resolve_config(NAME, config, GKDConfig())
    require_no_state(NAME, method_state)
    check_batch(batch, method=NAME, contexts=CONTEXTS, fields=FIELDS)
    sides = {"student": context_hidden(model, batch),
             "teacher": teacher_hidden(NAME, config.teacher, model, reference, batch, None,
                                       external=external_teacher)}

    divergence = TokenDivergence(divergence="full", alpha=config.beta)
    return Loss(*divergence_loss(sides, batch, divergence, head=head,
                                 temperature=config.temperature))

METHOD = Method(name=NAME, loss_fn=loss_fn, config=GKDConfig(), contexts=CONTEXTS,
                rollout=ROLLOUT, fields=FIELDS,
                paper="GKD, generalized knowledge distillation (TRL GKDTrainer; spec §6)")
