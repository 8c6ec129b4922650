"""SEED — GRPO plus on-policy distillation towards the policy's own skill-conditioned self
(spec ``other-methods.md`` §11; "SEED: Self-Evolving On-Policy Distillation", arXiv 2607.14777,
code not fetchable; the gate's form is verified in the SDAR codebase SEED builds on).

Setup (§11):

* Stage 1: SFT so that the policy can write hindsight skills from finished trajectories (the
  paper: 180 tasks x 8 rollouts). Here ``configs/seed_stages.py``, stage ``sft``: the policy's
  own skills, kept when useful (OUR CHOICE, below), trained after the conversation that asked
  for them.
* Stage 2 (this method): at each update the snapshot policy ``pi_old`` acts as actor and as
  analyzer, writing skills from its own completed trajectories. Here the rollout's policy (the
  snapshot that samples the group) writes **one skill per group** right after the group is
  verified, continuing the cached conversation of one finished row with a request turn
  (OUR CHOICE of the rule, the wording and the cap; :mod:`hindsight.rollout.generated`,
  ``Templates.skill_*``, ``rollout.generated_max_tokens`` = 48 tokens). The teacher context is
  the question + the skill (``teacher_context=("skill",)``, the registered part ``skill``); a
  group with no finished row gets no skill, and its rows (``teacher_row_mask`` 0) are left out
  of the distillation term (OUR CHOICE), not of the policy term.

Loss, per sampled token ``y_t`` of a row with a skill (all positions masked before any
arithmetic):

1. re-score twice, in one LM-head pass: ``l_ord = log pi(y_t | ordinary history)`` (the policy
   context, with gradient) and ``l_skill = log pi(y_t | history + skill)`` (the teacher context,
   under ``stop_gradient``), both at the loss temperature (the sampling one);
2. ``Delta_t = l_skill - l_ord`` and the gate ``g_t = sigmoid(beta sg(Delta_t))``
   (:func:`hindsight.signals.skill_shift_gate`);
3. ``L_OPD = agg(sg(g_t) (sg(l_skill) - l_ord))``, SDAR's ``compute_sdar_loss``
   (:func:`hindsight.signals.pcsd_loss` with ``loss="sdar"``): its value is ``g_t Delta_t``,
   its gradient ``-g_t grad l_ord``, so it raises ``l_ord`` on the tokens the skill supports;
   ``agg`` is the token mean over the rows with a skill;
4. ``L = L_GRPO + lambda_opd L_OPD``: two named terms, ``policy`` (GRPO's clipped surrogate,
   token mean over every row) and ``distill`` (``L_OPD``, weight ``lambda_opd``), each with its
   own count.

OUR CHOICE (SDAR's defaults, spec §11): ``beta = 5``, ``lambda_opd = 0.01``. The teacher is the
stop-gradient snapshot: ``teacher="self"``, the trained params under ``stop_gradient``, which
are the snapshot that sampled the rollout at its first update (one update per rollout, the
default ``train.ppo_epochs = ppo_minibatches = 1``; with more, the later updates' teacher is the
current params, as PCSD's and HSD's); ``"reference"`` runs it on the reference model.

Spec test (``tests/methods/test_seed.py``): ``Delta = [0.8, 0, -0.6]`` gives the gate
``[0.9820, 0.5, 0.0474]`` and the loss terms ``[0.7856, 0, -0.0285]``; the gradient on
``l_ord`` is ``-g``.
"""
from __future__ import annotations

import dataclasses

import jax

from hindsight._validation import check_choice, check_static_float
from hindsight.batch import check_batch
from hindsight.methods.distill import check_teacher_context
from hindsight.methods.forward import context_mask, context_rows
from hindsight.methods.method import (TEACHERS, Method, require_no_state, resolve_config,
                                      teacher_hidden)
from hindsight.methods.policy_gradient import SurrogateConfig, policy_rows, surrogate_terms
from hindsight.objectives import Loss, Term, aggregate
from hindsight.signals import pcsd_loss, skill_shift_gate

NAME = "seed"
CONTEXTS = ("teacher",)
ROLLOUT = "group"
FIELDS = ("logp_old", "advantages")


@dataclasses.dataclass(frozen=True)
class SEEDConfig(SurrogateConfig):
    """SEED options (spec §11) on top of GRPO's surrogate.

    Attributes:
      beta: the gate's sharpness (5, SDAR's; OUR CHOICE per the spec).
      lambda_opd: weight of the ``distill`` term (0.01, SDAR's; OUR CHOICE per the spec).
      teacher: ``"self"`` (the params under ``stop_gradient``: the snapshot) or
        ``"reference"`` / ``"external"``.
      teacher_context: the teacher-context recipe (``("skill",)``: question + the group's skill).
    """
    beta: float = 5.0
    lambda_opd: float = 0.01
    teacher: str = "self"
    teacher_context: tuple = ("skill",)

    def __post_init__(self):
        super().__post_init__()
        check_static_float("beta", self.beta, low=0.0)
        check_static_float("lambda_opd", self.lambda_opd, low=0.0)
        check_choice("teacher", self.teacher, TEACHERS)
        object.__setattr__(self, "teacher_context", check_teacher_context(self.teacher_context))

    @property
    def needs_reference(self) -> bool:
        return self.teacher == "reference"


def opd_loss(skill_logprobs, ordinary_logprobs, mask, *, beta: float = 5.0):
    """SEED's ``L_OPD`` as ``(sum, count)`` and its gate (spec §11 steps 2-3).

    Args:
      skill_logprobs: ``[B, T]`` ``l_skill``, the sampled tokens' log-probs under the history +
        skill (stop-gradient here).
      ordinary_logprobs: ``[B, T]`` ``l_ord`` under the ordinary history (carries the gradient).
      mask: ``[B, T]`` bool or 0/1: the tokens of rows with a skill.
    Returns:
      ``((sum, count), gate)``: float32 scalars of ``sum_t g_t (sg(l_skill) - l_ord)`` over the
      mask and its token count; ``gate [B, T]`` = ``sigmoid(beta sg(l_skill - l_ord))``, 0 where
      masked.
    """
    gate = skill_shift_gate(skill_logprobs, ordinary_logprobs, mask, beta=beta)
    return pcsd_loss(gate, ordinary_logprobs, mask, loss="sdar",
                     teacher_logp=jax.lax.stop_gradient(skill_logprobs)), gate


def loss_fn(model, batch, *, config: SEEDConfig | None = None, head=None, reference=None,
            method_state=None, external_teacher=None) -> Loss:
    """SEED loss ``L_GRPO + lambda_opd L_OPD``: terms ``policy`` (token mean over every row)
    and ``distill`` (weight ``lambda_opd``, token mean over the rows with a skill).

    Metrics: GRPO's plus ``gate_mean`` and ``skill_gap`` (mean ``Delta_t = l_skill - l_ord``),
    both over the rows with a skill, and ``context_rows`` (rows with a skill, rows).
    """
    config = resolve_config(NAME, config, SEEDConfig())
    require_no_state(NAME, method_state)
    check_batch(batch, method=NAME, contexts=CONTEXTS, fields=FIELDS)
    teacher = teacher_hidden(NAME, config.teacher, model, reference, batch, row_masked=True,
                             external=external_teacher)
    rows = policy_rows(model, batch, config, head=head, reference=reference, teacher=teacher)
    terms, metrics = surrogate_terms(rows, batch, config)
    mask = context_mask(batch, "teacher")
    (total, count), gate = opd_loss(rows["teacher_logp"], rows["logp"], mask, beta=config.beta)
    terms["distill"] = Term(sum=total, count=count, weight=config.lambda_opd)
    metrics["gate_mean"] = aggregate(gate, mask)
    metrics["skill_gap"] = aggregate(
        jax.lax.stop_gradient(rows["teacher_logp"] - rows["logp"]), mask)
    metrics["context_rows"] = context_rows(batch, "teacher")
    return Loss(terms, metrics)


METHOD = Method(name=NAME, loss_fn=loss_fn, config=SEEDConfig(), contexts=CONTEXTS,
                rollout=ROLLOUT, fields=FIELDS,
                paper="SEED, self-evolving on-policy distillation (arXiv 2607.14777; spec §11), "
                      "SDAR's gated loss")
