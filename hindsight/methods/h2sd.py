"""H²SD — hybrid hindsight self-distillation: the teacher context is routed by correctness
(spec ``other-methods.md`` §13; arXiv 2607.18955; verified at summary level only).

Verified: for a **success** the teacher sees the confirmed-correct response and a rephrasing
instruction, and its per-token probabilities modulate the advantage's **magnitude** only
(RLSD-style), never its direction; for a **failure** the teacher is conditioned on a reference
hint (key reasoning steps + verified answer) and the student minimises the **reverse KL** to it.
One ``teacher`` context per row carries both routes (recipe ``("own_success|hint",)``,
:mod:`hindsight.rollout.contexts`: a row whose reward is >= 0.5 gets its own answer, the others
the hint). OUR CHOICE (spec §13): the γ weighting and the support,

    L = L_PG(success: A clip(exp(sign(A) (l_T - l_S)), 1 - eps_w, 1 + eps_w); failure: A)
        + gamma * L_RKL(failures),   eps_w = 0.2, gamma = 1.0,

``L_RKL`` the reverse KL over the student's top-100 ids + tail (SDPO's, §6), token mean over the
failure rows' tokens (:func:`hindsight.objectives.h2sd_advantages`). Two named terms, ``policy``
(token mean) and ``distill``. Teacher: the current policy under ``stop_gradient``
(``teacher="self"``) or the reference model.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from hindsight._validation import check_static_float
from hindsight.batch import check_batch
from hindsight.methods.distill import TeacherSurrogateConfig, teacher_policy_rows
from hindsight.methods.forward import context_mask
from hindsight.methods.method import (Method, require_no_state, require_row_advantages,
                                      resolve_config)
from hindsight.methods.policy_gradient import surrogate_terms
from hindsight.objectives import Loss, aggregate, h2sd_advantages, term
from hindsight.tasks import SUCCESS_REWARD

NAME = "h2sd"
CONTEXTS = ("teacher",)
ROLLOUT = "group"
FIELDS = ("logp_old", "advantages", "rewards")


@dataclasses.dataclass(frozen=True)
class H2SDConfig(TeacherSurrogateConfig):
    """H²SD options on top of GRPO's surrogate (spec §13, OUR CHOICE).

    Attributes:
      eps_w: the success rows' weight clip (0.2).
      gamma: weight of the failure rows' reverse KL (1.0).
      top_k, tail, teacher: as :class:`~hindsight.methods.distill.TeacherSurrogateConfig`.
      teacher_context: the routed recipe (``("own_success|hint",)``).
    """
    eps_w: float = 0.2
    gamma: float = 1.0
    teacher_context: tuple = ("own_success|hint",)

    def __post_init__(self):
        super().__post_init__()
        check_static_float("eps_w", self.eps_w, low=0.0, high=1.0)
        check_static_float("gamma", self.gamma, low=0.0)


def loss_fn(model, batch, *, config: H2SDConfig | None = None, head=None, reference=None,
            method_state=None, external_teacher=None) -> Loss:
    """H²SD loss: ``policy`` (the routed advantages in GRPO's surrogate) and ``distill`` (the
    failure rows' reverse KL, weight ``gamma``).

    Metrics: GRPO's plus ``reverse_kl`` (failure rows, unweighted), ``success_rows`` (fraction of
    rows routed to the success context) and ``advantage_scale`` (mean ``A_hat / A`` over the
    success rows' tokens with ``A != 0``).
    """
    config = resolve_config(NAME, config, H2SDConfig())
    require_no_state(NAME, method_state)
    check_batch(batch, method=NAME, contexts=CONTEXTS, fields=FIELDS)
    require_row_advantages(NAME, batch)
    rows = teacher_policy_rows(NAME, model, batch, config, head=head, reference=reference,
                               external_teacher=external_teacher)
    mask = context_mask(batch, "teacher")
    success = jnp.asarray(batch["rewards"], jnp.float32) >= SUCCESS_REWARD
    # a success without a context (a custom recipe) keeps its plain advantage
    scaled_rows = success & (jnp.asarray(mask) > 0).any(axis=-1)
    advantages, rkl_weight = h2sd_advantages(batch["advantages"], rows["teacher_logp"],
                                             rows["logp"], batch["mask"], scaled_rows,
                                             eps_w=config.eps_w,
                                             gamma=config.gamma)
    terms, metrics = surrogate_terms(rows, {**batch, "advantages": advantages}, config)
    failed = jnp.where(success[:, None], jnp.zeros((), jnp.asarray(mask).dtype), mask)
    # rkl_weight is gamma on the failure rows' live tokens and 0 elsewhere: the term's sum is
    # gamma * sum_fail RKL, its count the failure rows' tokens.
    terms["distill"] = term(rkl_weight * rows["reverse_kl"], failed)
    metrics["reverse_kl"] = aggregate(jax.lax.stop_gradient(rows["reverse_kl"]), failed)
    b = jnp.shape(success)[0]
    metrics["success_rows"] = (jnp.sum(success.astype(jnp.float32)), jnp.float32(b))
    a = jnp.asarray(batch["advantages"], jnp.float32)[:, None]
    scaled = (jnp.asarray(mask) > 0) & success[:, None] & (a != 0)
    metrics["advantage_scale"] = aggregate(
        jnp.where(scaled, advantages / jnp.where(scaled, a, 1.0), 0.0), scaled)
    return Loss(terms, metrics)


METHOD = Method(name=NAME, loss_fn=loss_fn, config=H2SDConfig(), contexts=CONTEXTS,
                rollout=ROLLOUT, fields=FIELDS,
                paper="H²SD, hybrid hindsight self-distillation (arXiv 2607.18955; spec §13)")
