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

Options (spec §1.3): ``divergence="topk"`` is OPSD's ``top_k_loss`` (the teacher's top-k ids,
both distributions renormalised over the k entries; ``top_k_tail=True`` keeps a tail bucket
instead, SDPO's form); ``divergence="sampled"`` is the sampled-token alternative
``-token_mean(sg(l_T - l_S) l_S)`` at the sampled tokens (``beta`` unused); ``token_clip`` caps
each token's divergence, ``min(D_t, token_clip)`` (the repo's ``jsd_token_clip``, 0.05 in its run
scripts, absent from the paper; the repo clamps each vocabulary term before the sum, which is no
longer a divergence: here the token's total is capped, as the spec states it).

The teacher's context is the recipe ``teacher_context`` (:mod:`hindsight.rollout.contexts`):
OPSD's question + reference answer by default; BIRD's stage 2 reads question + the concise
instruction (``("concise",)``, ``configs/bird.py``). Rows a recipe gives no context are left out
of the term (their ``teacher_row_mask`` is 0).
"""
from __future__ import annotations

import dataclasses

from hindsight._validation import check_choice, check_static_float
from hindsight.batch import check_batch
from hindsight.methods.distill import TokenDivergence, check_teacher_context, divergence_loss
from hindsight.methods.forward import context_hidden, context_mask
from hindsight.methods.method import (TEACHERS, LossConfig, Method,
                                      require_no_state, resolve_config, teacher_hidden)
from hindsight.objectives import Loss

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
      divergence: ``"full"`` (the default), ``"topk"`` or ``"sampled"`` (see the module doc).
      top_k, top_k_tail: the ``topk`` support (100 teacher ids, renormalised).
      token_clip: cap of each token's divergence (None: off).
      teacher_context: the teacher-context recipe (``("reference",)``).
    """
    beta: float = 0.5
    temperature: float = 1.1
    teacher: str = "reference"
    divergence: str = "full"
    top_k: int = 100
    top_k_tail: bool = False
    token_clip: float | None = None
    teacher_context: tuple = ("reference",)

    def __post_init__(self):
        super().__post_init__()
        check_static_float("beta", self.beta, low=0.0, high=1.0)
        check_choice("teacher", self.teacher, TEACHERS)
        object.__setattr__(self, "teacher_context", check_teacher_context(self.teacher_context))
        self.token_divergence  # validates divergence, top_k, top_k_tail
        if self.token_clip is not None and not check_static_float("token_clip",
                                                                  self.token_clip) > 0:
            raise ValueError(f"`token_clip` must be > 0 (or None), got {self.token_clip}")
        if self.token_clip is not None and self.divergence == "sampled":
            raise ValueError("`token_clip` caps a divergence; divergence='sampled' is a surrogate "
                             "whose value is no divergence (capping it would stop the gradient of "
                             "exactly the tokens the teacher prefers)")

    @property
    def token_divergence(self) -> TokenDivergence:
        return TokenDivergence(divergence=self.divergence,
                               alpha=1.0 if self.divergence == "sampled" else self.beta,
                               top_k=self.top_k, tail=self.top_k_tail, support="teacher")

    @property
    def needs_reference(self) -> bool:
        return self.teacher == "reference"


def loss_fn(model, batch, *, config: OPSDConfig | None = None, head=None, reference=None,
            method_state=None, external_teacher=None) -> Loss:
    """OPSD loss: the ``distill`` term, token-mean generalized JSD(student, teacher context)
    (or the configured divergence), the metric ``jsd`` being that per-token value.

    Metrics: ``entropy`` (student), ``teacher_gap`` (mean ``logp_T - logp_S`` at the sampled
    tokens: the negated sampled estimate of ``KL(S || T)``).
    """
    config = resolve_config(NAME, config, OPSDConfig())
    require_no_state(NAME, method_state)
    check_batch(batch, method=NAME, contexts=CONTEXTS, fields=FIELDS)
    sides = {"student": context_hidden(model, batch),
             "teacher": teacher_hidden(NAME, config.teacher, model, reference, batch,
                                       row_masked=True, external=external_teacher)}

    return Loss(*divergence_loss(sides, batch, config.token_divergence, head=head,
                                 temperature=config.temperature, token_clip=config.token_clip,
                                 mask=context_mask(batch, "teacher")))

METHOD = Method(name=NAME, loss_fn=loss_fn, config=OPSDConfig(), contexts=CONTEXTS,
                rollout=ROLLOUT, fields=FIELDS,
                paper="OPSD, on-policy self-distillation (siyan-zhao/OPSD)")
