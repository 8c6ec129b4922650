"""SDPO — self-distillation policy optimisation: the policy, reprompted with a successful peer's
answer (or the verifier's feedback), is the teacher of its own samples (spec ``other-methods.md``
§6; Hübotter et al., arXiv 2601.20802, lasgroup/SDPO ``compute_self_distillation_loss``).

Teacher context (recipe ``("successful_peer|feedback",)``, :mod:`hindsight.rollout.contexts`): the
question, "Correct solution:" and the first *other* row of the group with reward >= 0.5 (thinking
stripped; SDPO's ``dont_reprompt_on_self_success``), else the feedback on the row's own failed
attempt, then the instruction to solve the question; a row with neither is masked out
(``teacher_row_mask``, SDPO's ``self_distillation_mask``).

Loss (``loss_mode=sdpo`` replaces the policy-gradient term): per response token the generalized
JSD ``alpha KL(T || M) + (1 - alpha) KL(S || M)``, ``M = (1 - alpha) S + alpha T`` (``alpha = 0.5``)
over the student's top-100 ids with a tail bucket ``log(1 - sum_k p)`` on each side (nothing
renormalised), times the detached importance weight ``min(exp(clip(l_S - l_old, +-20)), 2)``,
token mean over the tokens of rows with a context. Teacher: an EMA of the policy at rate 0.05
(``teacher="reference"`` with ``train.reference="ema"``, ``train.ema_decay=0.95``, which
``configs/sdpo.py`` sets). ``divergence="full"`` (full vocabulary) and ``"sampled"`` (the
sampled-token reverse KL, ``alpha = 1``) are SDPO's other modes.
"""
from __future__ import annotations

import dataclasses

import jax

from hindsight._validation import check_choice
from hindsight.batch import check_batch
from hindsight.methods.distill import (TokenDivergence, check_teacher_context,
                                       weighted_distill_term)
from hindsight.methods.forward import (context_hidden, context_mask, context_rows, gather,
                                       vocab_rows)
from hindsight.methods.method import (TEACHERS, LossConfig, Method, require_no_state,
                                      resolve_config, teacher_hidden)
from hindsight.objectives import Loss, aggregate
from hindsight.ops import entropy_from_logprobs

NAME = "sdpo"
CONTEXTS = ("teacher",)
ROLLOUT = "group"
FIELDS = ("logp_old",)


@dataclasses.dataclass(frozen=True)
class SDPOConfig(LossConfig):
    """SDPO options (spec §6, lasgroup/SDPO defaults).

    Attributes:
      divergence, alpha, top_k, tail: the per-token divergence (:class:`TokenDivergence`:
        ``"topk"``, 0.5, 100, True).
      is_clip: cap of the detached importance weight (2.0); None = no weight.
      teacher: ``"reference"`` (the EMA teacher; the run keeps an EMA reference) or ``"self"``.
      teacher_context: the teacher-context recipe (``("successful_peer|feedback",)``).
    """
    divergence: str = "topk"
    alpha: float = 0.5
    top_k: int = 100
    tail: bool = True
    is_clip: float | None = 2.0
    teacher: str = "reference"
    teacher_context: tuple = ("successful_peer|feedback",)

    def __post_init__(self):
        super().__post_init__()
        self.token_divergence  # validates divergence, alpha, top_k, tail
        if self.is_clip is not None and not float(self.is_clip) > 0:
            raise ValueError(f"`is_clip` must be > 0 (or None), got {self.is_clip}")
        check_choice("teacher", self.teacher, TEACHERS)
        object.__setattr__(self, "teacher_context", check_teacher_context(self.teacher_context))

    @property
    def token_divergence(self) -> TokenDivergence:
        return TokenDivergence(divergence=self.divergence, alpha=self.alpha, top_k=self.top_k,
                               tail=self.tail)

    @property
    def needs_reference(self) -> bool:
        return self.teacher == "reference"


def loss_fn(model, batch, *, config: SDPOConfig | None = None, head=None, reference=None,
            method_state=None, external_teacher=None) -> Loss:
    """SDPO loss: the ``distill`` term, the token mean of ``w * D`` over rows with a context.

    Metrics: ``divergence`` (unweighted ``D``), ``entropy`` (student), ``teacher_gap`` (mean
    ``l_T - l_S`` at the sampled tokens), ``context_rows`` (fraction of rows with a context) and,
    with ``is_clip``, ``is_weight`` / ``is_clip_frac``.
    """
    config = resolve_config(NAME, config, SDPOConfig())
    require_no_state(NAME, method_state)
    check_batch(batch, method=NAME, contexts=CONTEXTS, fields=FIELDS)
    sides = {"student": context_hidden(model, batch),
             "teacher": teacher_hidden(NAME, config.teacher, model, reference, batch,
                                       row_masked=True, external=external_teacher)}
    divergence = config.token_divergence
    mask = context_mask(batch, "teacher")

    def row(logp, tokens):
        ls, lt = logp["student"], logp["teacher"]
        sg = jax.lax.stop_gradient
        return {"divergence": divergence(ls, lt, tokens), "logp": sg(gather(ls, tokens)),
                "entropy": sg(entropy_from_logprobs(ls)),
                "teacher_gap": sg(gather(lt, tokens) - gather(ls, tokens))}

    rows = vocab_rows(row, sides, batch["targets"], mask, head=head,
                      temperature=config.temperature)
    metrics = {name: aggregate(jax.lax.stop_gradient(rows[name]), mask)
               for name in ("divergence", "entropy", "teacher_gap")}
    metrics["context_rows"] = context_rows(batch, "teacher")
    distill, is_metrics = weighted_distill_term(rows["divergence"], rows["logp"],
                                                batch["logp_old"], mask, is_clip=config.is_clip)
    return Loss({"distill": distill}, {**metrics, **is_metrics})


METHOD = Method(name=NAME, loss_fn=loss_fn, config=SDPOConfig(), contexts=CONTEXTS,
                rollout=ROLLOUT, fields=FIELDS,
                paper="SDPO, self-distillation policy optimisation (arXiv 2601.20802; spec §6)")
