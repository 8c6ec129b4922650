"""OPSD — on-policy self-distillation with a privileged teacher context (spec §1.3).

Zhao et al., OPSD (code: siyan-zhao/OPSD, ``generalized_jsd_loss``); the same network is the
teacher, conditioned on the problem plus its reference solution, and scores the student's own
sampled response with no gradient.

Loss: the full-vocabulary generalized JSD (TRL convention, ``beta = 0.5``:
``0.5 KL(T || M) + 0.5 KL(S || M)``, ``M = (T + S) / 2``; 0 = ``KL(T || S)``, 1 = ``KL(S || T)``)
per response token, token-mean. Defaults from OPSD's run script: loss temperature 1.1 (logits / 1.1
before the softmax, as in sampling: the rollout must sample at the same temperature) and a fixed
teacher = the initial policy (``teacher="reference"`` with a frozen reference; an EMA reference is
OPSD's other option; ``teacher="self"`` uses the current params under ``stop_gradient``).
"""
from __future__ import annotations

import dataclasses

import jax

from hindsight._validation import check_choice, check_static_float
from hindsight.batch import check_batch
from hindsight.methods.forward import context_hidden, distill_term, gather, vocab_rows
from hindsight.methods.method import (TEACHERS, LossConfig, Method,
                                      require_no_state, resolve_config, teacher_hidden)
from hindsight.objectives import Loss
from hindsight.ops import entropy_from_logprobs, generalized_jsd_from_logprobs

NAME = "opsd"
CONTEXTS = ("teacher",)
ROLLOUT = "group"
FIELDS = ()


@dataclasses.dataclass(frozen=True)
class OPSDConfig(LossConfig):
    """OPSD options (spec §1.3).

    Attributes:
      beta: generalized-JSD weight in ``[0, 1]`` (0.5).
      temperature: loss (and sampling) temperature (1.1, OPSD's run script).
      teacher: ``"reference"`` (fixed initial policy or EMA, per the train state) or ``"self"``.
    """
    beta: float = 0.5
    temperature: float = 1.1
    teacher: str = "reference"

    def __post_init__(self):
        super().__post_init__()
        check_static_float("beta", self.beta, low=0.0, high=1.0)
        check_choice("teacher", self.teacher, TEACHERS)

    @property
    def needs_reference(self) -> bool:
        return self.teacher == "reference"


def loss_fn(model, batch, *, config: OPSDConfig | None = None, head=None, reference=None,
            method_state=None) -> Loss:
    """OPSD loss: the ``distill`` term, token-mean generalized JSD(student, teacher context).

    Metrics: ``entropy`` (student), ``teacher_gap`` (mean ``logp_T - logp_S`` at the sampled
    tokens: the negated sampled estimate of ``KL(S || T)``).
    """
    config = resolve_config(NAME, config, OPSDConfig())
    require_no_state(NAME, method_state)
    check_batch(batch, method=NAME, contexts=CONTEXTS, fields=FIELDS)
    sides = {"student": context_hidden(model, batch),
             "teacher": teacher_hidden(NAME, config.teacher, model, reference, batch)}

    def row(logp, tokens):
        ls, lt = logp["student"], logp["teacher"]
        sg = jax.lax.stop_gradient
        return {"jsd": generalized_jsd_from_logprobs(ls, lt, config.beta),
                "entropy": sg(entropy_from_logprobs(ls)),
                "teacher_gap": sg(gather(lt, tokens) - gather(ls, tokens))}

    rows = vocab_rows(row, sides, batch["targets"], batch["mask"], head=head,
                      temperature=config.temperature)
    return Loss(*distill_term(rows, batch["mask"], loss="jsd"))


METHOD = Method(name=NAME, loss_fn=loss_fn, config=OPSDConfig(), contexts=CONTEXTS,
                rollout=ROLLOUT, fields=FIELDS,
                paper="OPSD, on-policy self-distillation (siyan-zhao/OPSD)")
