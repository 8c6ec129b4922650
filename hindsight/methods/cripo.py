"""CriPO — criterion-conditioned credit: a teacher shown what a correct answer must satisfy
injects its distribution where it matters most and flips the sign of a failed rollout's tokens it
localises (spec ``other-methods.md`` §14).

**No paper was found under this name: every formula, default and wording here is OUR CHOICE**,
built from the seed's summary (spec §14):

1. per token the forward KL ``FKL_t = KL(pi_T(. | x, c, y_<t) || pi_S)`` over the full vocabulary,
   ``c`` the criterion context (recipe ``("criteria",)``, :mod:`hindsight.rollout.contexts`: "every
   step follows from the previous one and the final answer equals ...", OUR CHOICE of wording);
2. per row the contribution filter keeps the smallest set of tokens, largest ``FKL`` first, whose
   share of the row's total reaches 95% (:func:`hindsight.signals.contribution_filter`);
3. ``L_inj = sum keep FKL / sum keep`` (the gradient flows to the student);
4. localisation ``loc_t = [l_T(c)(y_t) - l_T(no c)(y_t) > 0] and [argmax pi_T(. | no c) != y_t]``
   (:func:`hindsight.objectives.localise`; the plain teacher is the teacher's weights on the
   policy context);
5. on rows with ``A < 0`` the localised tokens get ``A_t = +tau_flip`` (0.1), the others keep
   ``A`` (:func:`hindsight.objectives.flip_at`);
6. ``L = L_PG(A_t) + lam_inj L_inj``, ``lam_inj = 0.1``: terms ``policy`` (GRPO's clipped
   surrogate, token mean) and ``distill`` (token mean over the kept tokens).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from hindsight._validation import check_choice, check_static_float
from hindsight.batch import check_batch
from hindsight.methods.distill import check_teacher_context
from hindsight.methods.forward import context_hidden, context_mask, gather, vocab_rows
from hindsight.methods.method import (TEACHERS, Method, require_no_state, require_row_advantages,
                                      resolve_config, teacher_hidden, teacher_model)
from hindsight.methods.policy_gradient import SurrogateConfig, surrogate_terms
from hindsight.objectives import Loss, aggregate, flip_at, localise, term
from hindsight.ops import entropy_from_logprobs, kl_from_logprobs
from hindsight.signals import contribution_filter

NAME = "cripo"
CONTEXTS = ("teacher",)
ROLLOUT = "group"
FIELDS = ("logp_old", "advantages")


@dataclasses.dataclass(frozen=True)
class CriPOConfig(SurrogateConfig):
    """CriPO options (spec §14, all OUR CHOICE).

    Attributes:
      lam_inj: weight of the injection term (0.1).
      share: the contribution filter's share of a row's forward KL (0.95).
      tau_flip: the advantage of localised tokens of failed rows (0.1).
      teacher: ``"self"`` (current params, stop-gradient) or ``"reference"``; runs both the
        criterion context and the plain one.
      teacher_context: the criterion recipe (``("criteria",)``).
    """
    lam_inj: float = 0.1
    share: float = 0.95
    tau_flip: float = 0.1
    teacher: str = "self"
    teacher_context: tuple = ("criteria",)

    def __post_init__(self):
        super().__post_init__()
        check_static_float("lam_inj", self.lam_inj, low=0.0)
        check_static_float("share", self.share, low=0.0, high=1.0)
        check_static_float("tau_flip", self.tau_flip)
        check_choice("teacher", self.teacher, TEACHERS)
        object.__setattr__(self, "teacher_context", check_teacher_context(self.teacher_context))

    @property
    def needs_reference(self) -> bool:
        return self.teacher == "reference"


def loss_fn(model, batch, *, config: CriPOConfig | None = None, head=None, reference=None,
            method_state=None, external_teacher=None) -> Loss:
    """CriPO loss: ``policy`` (the flipped advantages in GRPO's surrogate) and ``distill``
    (``lam_inj`` x the forward KL over the kept tokens).

    Metrics: GRPO's plus ``forward_kl`` (every token), ``kept_frac`` (tokens the filter keeps) and
    ``flip_frac`` (tokens of ``A < 0`` rows flipped to ``+tau_flip``).
    """
    config = resolve_config(NAME, config, CriPOConfig())
    require_no_state(NAME, method_state)
    check_batch(batch, method=NAME, contexts=CONTEXTS, fields=FIELDS)
    require_row_advantages(NAME, batch)
    sides = {"policy": context_hidden(model, batch),
             "criterion": teacher_hidden(NAME, config.teacher, model, reference, batch,
                                         row_masked=True, external=external_teacher)}
    if config.teacher != "self":  # the plain teacher: the teacher's weights, no criterion
        plain = teacher_model(NAME, config.teacher, model, reference, external_teacher)
        sides["plain"] = context_hidden(plain, batch, frozen=True)

    def row(logp, tokens):
        ls, lc = logp["policy"], logp["criterion"]
        lp = logp["plain"] if "plain" in logp else jax.lax.stop_gradient(ls)
        sg = jax.lax.stop_gradient
        return {"logp": gather(ls, tokens), "forward_kl": kl_from_logprobs(lc, ls),
                "criterion_logp": sg(gather(lc, tokens)), "plain_logp": sg(gather(lp, tokens)),
                "plain_disagrees": (jnp.argmax(lp, axis=-1) != tokens).astype(jnp.float32),
                "entropy": sg(entropy_from_logprobs(ls))}

    mask = batch["mask"]
    rows = vocab_rows(row, sides, batch["targets"], mask, head=head,
                      temperature=config.temperature)
    have = context_mask(batch, "teacher")
    # a row without a criterion context (a custom recipe) keeps its plain advantage
    loc = localise(rows["criterion_logp"], rows["plain_logp"], rows["plain_disagrees"] > 0) & (
        jnp.asarray(have) > 0)
    advantages = flip_at(batch["advantages"], loc, mask, tau_flip=config.tau_flip)
    terms, metrics = surrogate_terms(rows, {**batch, "advantages": advantages}, config)
    keep = contribution_filter(jax.lax.stop_gradient(rows["forward_kl"]), have,
                               share=config.share)
    terms["distill"] = term(rows["forward_kl"], keep, weight=config.lam_inj)
    m = jnp.asarray(mask) > 0
    negative = m & (jnp.asarray(batch["advantages"], jnp.float32) < 0)[:, None]
    metrics["forward_kl"] = aggregate(jax.lax.stop_gradient(rows["forward_kl"]), mask)
    metrics["kept_frac"] = aggregate(keep, mask)
    metrics["flip_frac"] = aggregate((loc & negative).astype(jnp.float32), negative)
    return Loss(terms, metrics)


METHOD = Method(name=NAME, loss_fn=loss_fn, config=CriPOConfig(), contexts=CONTEXTS,
                rollout=ROLLOUT, fields=FIELDS,
                paper="CriPO (paper not located; spec §14, OUR CHOICE throughout)")
