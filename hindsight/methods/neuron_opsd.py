"""Neuron-OPSD — neuron-aware data selection for annotation-free self-distillation (spec
``other-methods.md`` §8; arXiv 2607.02460).

Before training (once per run, the preparation ``neuron_selection``,
:mod:`hindsight.rollout.neuron_selection`): the frozen initial policy answers every pool item
zero-shot; each answer's neuron set ``N(x)`` (the neurons that push its tokens hardest,
:mod:`hindsight.signals.neurons`) gives the consensus ``s(x) = |N(x)|``; the run trains on the
bottom ``select_fraction`` (20%) of the pool by ``s``, and each of those items' teacher context is
its ``num_shots`` (10) nearest pool items in Jaccard distance between neuron sets, as few-shot
demonstrations (question + the frozen policy's own zero-shot answer: no label is used anywhere).

Training (OPD, eqs 7-10): the student samples on its own; the teacher is an EMA of the student
(``teacher="reference"`` with ``train.reference="ema"``, ``train.ema_decay = 1 - tau = 0.99``, which
``configs/neuron_opsd.py`` sets: ``theta_bar <- (1 - tau) theta_bar + tau theta``) reading the
question after the demonstrations (recipe ``("few_shot",)``); the loss is the reverse KL
``KL(pi_theta || pi_theta_bar)`` over the full vocabulary at every response token, token mean
(both OUR CHOICE, the spec's), gradient to the student only. A row whose example carries no
demonstrations (not from the selection) has no teacher context and leaves the term.
"""
from __future__ import annotations

import dataclasses

import jax

from hindsight._validation import check_choice, check_static_float
from hindsight.batch import check_batch
from hindsight.methods.distill import check_teacher_context
from hindsight.methods.forward import (context_hidden, context_mask, context_rows, distill_term,
                                       gather, vocab_rows)
from hindsight.methods.method import (TEACHERS, LossConfig, Method, require_no_state,
                                      resolve_config, teacher_hidden)
from hindsight.objectives import Loss
from hindsight.ops import entropy_from_logprobs, kl_from_logprobs

NAME = "neuron_opsd"
CONTEXTS = ("teacher",)
ROLLOUT = "group"
FIELDS = ()
ZERO_SHOT = ("greedy", "rollout")


@dataclasses.dataclass(frozen=True)
class NeuronOPSDConfig(LossConfig):
    """Neuron-OPSD options (spec §8).

    Attributes:
      teacher: ``"reference"`` (the EMA teacher), ``"self"`` or ``"external"``.
      teacher_context: the teacher-context recipe (``("few_shot",)``).
      neurons_per_layer: ``(token, neuron)`` pairs kept per layer and chunk (2000).
      num_neurons: neurons kept per chunk over all layers, ``K`` (5000).
      chunk_tokens: response tokens per chunk (16, OUR CHOICE: the spec names chunks, not
        their size; :mod:`hindsight.signals.neurons`).
      select_fraction: share of the pool trained on, the smallest ``s(x)`` (0.2).
      num_shots: demonstrations per teacher context, ``K`` (10).
      pool_size: examples drawn as the pool (256, OUR CHOICE; a fixed-list task's whole train
        split when it holds fewer; repeated questions kept once).
      zero_shot: the pool's responses: ``"greedy"`` (OUR CHOICE) or ``"rollout"`` (sampled at
        the rollout's settings).
    """
    teacher: str = "reference"
    teacher_context: tuple = ("few_shot",)
    neurons_per_layer: int = 2000
    num_neurons: int = 5000
    chunk_tokens: int = 16
    select_fraction: float = 0.2
    num_shots: int = 10
    pool_size: int = 256
    zero_shot: str = "greedy"

    def __post_init__(self):
        super().__post_init__()
        check_choice("teacher", self.teacher, TEACHERS)
        check_choice("zero_shot", self.zero_shot, ZERO_SHOT)
        object.__setattr__(self, "teacher_context", check_teacher_context(self.teacher_context))
        for name in ("neurons_per_layer", "num_neurons", "chunk_tokens", "num_shots", "pool_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive int, got {value!r}")
        if not check_static_float("select_fraction", self.select_fraction, high=1.0) > 0:
            raise ValueError(f"`select_fraction` must be in (0, 1], got {self.select_fraction}")

    @property
    def needs_reference(self) -> bool:
        return self.teacher == "reference"


def loss_fn(model, batch, *, config: NeuronOPSDConfig | None = None, head=None, reference=None,
            method_state=None, external_teacher=None) -> Loss:
    """Neuron-OPSD loss: the ``distill`` term, token mean of the full-vocabulary
    ``KL(student || teacher)`` over the tokens of rows with a teacher context.

    Metrics: ``entropy`` (student), ``teacher_gap`` (mean ``l_T - l_S`` at the sampled tokens),
    ``context_rows`` (fraction of rows with a context).
    """
    config = resolve_config(NAME, config, NeuronOPSDConfig())
    require_no_state(NAME, method_state)
    check_batch(batch, method=NAME, contexts=CONTEXTS, fields=FIELDS)
    sides = {"student": context_hidden(model, batch),
             "teacher": teacher_hidden(NAME, config.teacher, model, reference, batch,
                                       row_masked=True, external=external_teacher)}
    mask = context_mask(batch, "teacher")

    def row(logp, tokens):
        ls, lt = logp["student"], logp["teacher"]
        sg = jax.lax.stop_gradient
        return {"reverse_kl": kl_from_logprobs(ls, lt), "entropy": sg(entropy_from_logprobs(ls)),
                "teacher_gap": sg(gather(lt, tokens) - gather(ls, tokens))}

    rows = vocab_rows(row, sides, batch["targets"], mask, head=head,
                      temperature=config.temperature)
    terms, metrics = distill_term(rows, mask, loss="reverse_kl")
    metrics["context_rows"] = context_rows(batch, "teacher")
    return Loss(terms, metrics)


METHOD = Method(name=NAME, loss_fn=loss_fn, config=NeuronOPSDConfig(), contexts=CONTEXTS,
                rollout=ROLLOUT, fields=FIELDS, prepare="neuron_selection",
                paper="Neuron-OPSD, neuron-aware data selection for annotation-free "
                      "self-distillation (arXiv 2607.02460; spec §8)")
