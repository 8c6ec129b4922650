"""OPSD-PMI — self-distillation toward a purified (PMI) target (spec §5).

Purified OPSD (arXiv 2607.02234; abstract-level verification): with the reference solution in
context, the teacher's signal is dominated by a reference-induced component; a reference-only
probe (same model, reference but no question) isolates it, and the residual ``lT - lR`` (a
pointwise-mutual-information estimate between the next token and the question) reweights a clean
base ``P0`` into the target ``log q = log_softmax(l0 + beta * c tanh((r - mean r) / c))``.

Passes per response position: teacher (``teacher`` context: question + reference) and probe
(``probe`` context: reference only), both run by the current params under ``stop_gradient``
(``teacher="self"``) or by the reference model; the base ``P0`` is the ``reference`` model (the
frozen initial policy) on the policy context (question only); the student is the policy on the
policy context. Loss: generalized JSD (``beta_jsd = 0.5``) between target and student,
token-mean. ``c = 10`` [BRIEF], ``beta = 1``, ``beta_jsd = 0.5``, temperature 1.0 are OUR CHOICE.
"""
from __future__ import annotations

import dataclasses

import jax

from hindsight._validation import check_choice, check_static_float
from hindsight.batch import check_batch
from hindsight.methods.forward import context_hidden, distill_term, vocab_rows
from hindsight.methods.method import (TEACHERS, LossConfig, Method,
                                      require_no_state, require_reference, resolve_config,
                                      teacher_model)
from hindsight.objectives import Loss
from hindsight.ops import entropy_from_logprobs, generalized_jsd_from_logprobs, kl_from_logprobs
from hindsight.signals import LOGP_TARGET_FLOOR, pmi_target_from_logprobs

NAME = "opsd_pmi"
CONTEXTS = ("teacher", "probe")
ROLLOUT = "group"
FIELDS = ()


@dataclasses.dataclass(frozen=True)
class OPSDPMIConfig(LossConfig):
    """OPSD-PMI options (spec §5).

    Attributes:
      beta_jsd: generalized-JSD weight between target and student (0.5).
      beta: residual strength of the target (1.0; sweep 0.5, 1, 2).
      clip: ``tanh`` soft-clip scale ``c`` (10).
      floor: log-prob floor of teacher and probe (-50).
      teacher: whose weights run the teacher and probe contexts: ``"self"`` or ``"reference"``.
      target_temperature: temperature of the teacher, probe and base when building ``q`` (1.0,
        spec §5 OUR CHOICE), apart from ``temperature``, the student's (= the sampling
        temperature, which ``logp_old`` is at).
    """
    beta_jsd: float = 0.5
    beta: float = 1.0
    clip: float = 10.0
    floor: float = LOGP_TARGET_FLOOR
    teacher: str = "self"
    target_temperature: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        if not check_static_float("target_temperature", self.target_temperature) > 0:
            raise ValueError(f"`target_temperature` must be > 0, got {self.target_temperature}")
        check_static_float("beta_jsd", self.beta_jsd, low=0.0, high=1.0)
        check_static_float("beta", self.beta, low=0.0)
        check_static_float("clip", self.clip, low=1e-6)
        check_choice("teacher", self.teacher, TEACHERS)

    @property
    def needs_reference(self) -> bool:
        return True

    @property
    def needs_frozen_reference(self) -> bool:
        """The base ``P0`` is the initial policy: an EMA reference would move it."""
        return True


def loss_fn(model, batch, *, config: OPSDPMIConfig | None = None, head=None, reference=None,
            method_state=None, external_teacher=None) -> Loss:
    """OPSD-PMI loss: the ``distill`` term, token-mean JSD(student, purified target).

    Metrics: ``entropy`` (student), ``target_shift`` (mean ``KL(q || P0)``: how far the purified
    evidence moves the target from the base).
    """
    config = resolve_config(NAME, config, OPSDPMIConfig())
    require_no_state(NAME, method_state)
    require_reference(NAME, reference, "the frozen base P0 of the target")
    check_batch(batch, method=NAME, contexts=CONTEXTS, fields=FIELDS)
    teacher = teacher_model(NAME, config.teacher, model, reference, external_teacher)
    sides = {"student": context_hidden(model, batch),
             "teacher": context_hidden(teacher, batch, "teacher", frozen=True),
             "probe": context_hidden(teacher, batch, "probe", frozen=True),
             "base": context_hidden(reference, batch, frozen=True)}

    vocab_mask = None if head is None else head.vocab_mask

    def at(logp, temperature):
        # The head runs at temperature 1; log_softmax(logp / T) = log_softmax(logits / T), the
        # masked vocabulary staying at a large negative value.
        return logp if temperature == 1.0 else jax.nn.log_softmax(logp / temperature)

    def row(logp, _):
        t = config.target_temperature
        base = at(logp["base"], t)
        target = pmi_target_from_logprobs(at(logp["teacher"], t), at(logp["probe"], t), base,
                                          beta=config.beta, clip=config.clip, floor=config.floor,
                                          vocab_mask=vocab_mask)
        student = at(logp["student"], config.temperature)
        sg = jax.lax.stop_gradient
        return {"jsd": generalized_jsd_from_logprobs(student, target, config.beta_jsd),
                "entropy": sg(entropy_from_logprobs(student)),
                "target_shift": sg(kl_from_logprobs(target, base))}

    rows = vocab_rows(row, sides, batch["targets"], batch["mask"], head=head, temperature=1.0)
    return Loss(*distill_term(rows, batch["mask"], loss="jsd"))


METHOD = Method(name=NAME, loss_fn=loss_fn, config=OPSDPMIConfig(), contexts=CONTEXTS,
                rollout=ROLLOUT, fields=FIELDS,
                paper="Purified OPSD (arXiv 2607.02234); formulas spec §5")
