"""The per-token teacher-matching pieces the self-distillation methods share (SDPO, HSD, H2SD,
DemoPSD): the divergence at one position (top-k + tail, full vocabulary, or the sampled token),
SDPO's detached importance weight, and the config of a surrogate with a reverse-KL teacher term.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from hindsight._validation import check_choice, check_static_float
from hindsight.methods.forward import distill_term, gather, vocab_rows
from hindsight.methods.method import TEACHERS, teacher_hidden
from hindsight.methods.policy_gradient import SurrogateConfig, policy_rows
from hindsight.objectives import aggregate, term
from hindsight.objectives.aggregation import as_mask
from hindsight.objectives.kl_estimators import LOG_RATIO_CLIP
from hindsight.ops import (entropy_from_logprobs, generalized_jsd_from_logprobs,
                          topk_divergence_from_logprobs)

DIVERGENCES = ("topk", "full", "sampled")
"""``topk``: generalized JSD over the student's top-k ids (+ tail bucket, SDPO's default);
``full``: over the whole vocabulary; ``sampled``: SDPO's sampled-token reverse KL,
``sg(l_S - l_T) l_S`` at the sampled token (its gradient is the reverse KL's single-sample one)."""


def check_teacher_context(recipe) -> tuple:
    """``recipe`` as a tuple of non-empty part names (alternatives joined by ``|``); ValueError
    naming ``teacher_context`` otherwise. The names are checked against the part registry by
    the rollout layer before anything runs (:func:`hindsight.rollout.collect.check_contexts`):
    parts may be registered after a config is made."""
    recipe = tuple(recipe) if isinstance(recipe, list) else recipe
    if not isinstance(recipe, tuple) or not recipe or not all(
            isinstance(item, str) and all(item.split("|")) for item in recipe):
        raise ValueError(f"`teacher_context` must be a non-empty tuple of context part names "
                         f"(alternatives joined by '|'), got {recipe!r}")
    return recipe


@dataclasses.dataclass(frozen=True)
class TokenDivergence:
    """How a teacher is matched at one position (SDPO's ``distillation_*`` options).

    Attributes:
      divergence: one of :data:`DIVERGENCES`.
      alpha: generalized-JSD weight (TRL / SDPO convention: 0 = ``KL(T || S)``, 1 = ``KL(S || T)``).
      top_k: explicit entries of ``topk`` (100). A vocabulary of at most ``top_k`` entries uses
        ``V - 1`` of them: with the tail bucket (the last entry itself) that is the full
        distribution exactly; renormalised (``tail=False``) the least likely entry is dropped.
      tail: ``topk`` appends the tail bucket (True, SDPO) or renormalises over the k entries
        (False, OPSD's ``top_k_loss``).
      support: whose top-k ids: ``"student"`` (SDPO) or ``"teacher"`` (OPSD).
    """
    divergence: str = "topk"
    alpha: float = 0.5
    top_k: int = 100
    tail: bool = True
    support: str = "student"

    def __post_init__(self):
        check_choice("divergence", self.divergence, DIVERGENCES)
        check_choice("support", self.support, ("student", "teacher"))
        check_static_float("alpha", self.alpha, low=0.0, high=1.0)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
            raise ValueError(f"`top_k` must be a positive int, got {self.top_k!r}")
        if not isinstance(self.tail, bool):
            raise ValueError(f"`tail` must be a bool, got {self.tail!r}")
        if self.divergence == "sampled" and self.alpha != 1.0:
            raise ValueError(f"divergence='sampled' is the reverse KL: it needs alpha=1.0, got "
                             f"alpha={self.alpha}")

    def __call__(self, student_logp, teacher_logp, tokens) -> jax.Array:
        """The divergence at each of ``C`` positions from log-softmaxes ``[C, V]`` and the sampled
        ``tokens [C]``; the gradient flows through ``student_logp`` only when the teacher's is
        stopped by the caller."""
        if self.divergence == "sampled":
            ls = gather(student_logp, tokens)
            return jax.lax.stop_gradient(ls - gather(teacher_logp, tokens)) * ls
        if self.divergence == "full":
            return generalized_jsd_from_logprobs(student_logp, teacher_logp, self.alpha)
        k = min(self.top_k, student_logp.shape[-1] - 1)
        return topk_divergence_from_logprobs(student_logp, teacher_logp, self.alpha, k=k,
                                             support=self.support, tail=self.tail)


def importance_weight(logp, logp_old, mask, is_clip: float) -> tuple[jax.Array, dict]:
    """SDPO's detached importance weight ``min(exp(clip(sg(l_S) - l_old, +-20)), is_clip)``
    ``[B, T]`` (1 at masked positions), for tokens sampled by an older policy; metrics
    ``is_weight`` and ``is_clip_frac``."""
    m = as_mask(mask)
    # Select before exp: padding may hold any log-prob.
    log_ratio = jnp.where(m, jax.lax.stop_gradient(logp) - jnp.asarray(logp_old, jnp.float32),
                          0.0)
    ratio = jnp.exp(jnp.clip(log_ratio, -LOG_RATIO_CLIP, LOG_RATIO_CLIP))
    weight = jnp.minimum(ratio, is_clip)
    return weight, {"is_weight": aggregate(weight, mask),
                    "is_clip_frac": aggregate((ratio > is_clip).astype(jnp.float32), mask)}


def weighted_distill_term(per_token, logp, logp_old, mask, *, is_clip: float | None):
    """``(Term, metrics)``: the token-mean ``distill`` term of ``per_token [B, T]``, each token
    weighted by :func:`importance_weight` when ``is_clip`` is set (SDPO, DemoPSD)."""
    if is_clip is None:
        return term(per_token, mask), {}
    weight, metrics = importance_weight(logp, logp_old, mask, is_clip)
    return term(weight * per_token, mask), metrics


@dataclasses.dataclass(frozen=True)
class TeacherSurrogateConfig(SurrogateConfig):
    """GRPO's surrogate plus a reverse KL to a teacher context over the student's top-k + tail
    (the options HSD and H2SD share).

    Attributes:
      top_k, tail: the reverse KL's support (student top-100 + tail bucket).
      teacher: ``"self"`` (current params, stop-gradient) or ``"reference"``.
      teacher_context: the teacher-context recipe (each method sets its own default).
    """
    top_k: int = 100
    tail: bool = True
    teacher: str = "self"
    teacher_context: tuple = ("reference",)

    def __post_init__(self):
        super().__post_init__()
        self.token_divergence  # validates top_k, tail
        check_choice("teacher", self.teacher, TEACHERS)
        object.__setattr__(self, "teacher_context", check_teacher_context(self.teacher_context))

    @property
    def token_divergence(self) -> TokenDivergence:
        return TokenDivergence(divergence="topk", alpha=1.0, top_k=self.top_k, tail=self.tail)

    @property
    def needs_reference(self) -> bool:
        return self.teacher == "reference"


def teacher_policy_rows(name: str, model, batch, config: TeacherSurrogateConfig, *, head=None,
                        reference=None, external_teacher=None) -> dict:
    """:func:`~hindsight.methods.policy_gradient.policy_rows` with the teacher context (rows
    without one allowed: the caller masks them) and ``reverse_kl [B, T]``, the top-k + tail
    ``KL(policy || teacher)`` of ``config``, from the same LM-head pass."""
    teacher = teacher_hidden(name, config.teacher, model, reference, batch, row_masked=True,
                             external=external_teacher)
    divergence = config.token_divergence
    return policy_rows(model, batch, config, head=head, reference=reference, teacher=teacher,
                       extra=lambda logp, tokens: {
                           "reverse_kl": divergence(logp["policy"], logp["teacher"], tokens)})


def divergence_loss(sides, batch, divergence: TokenDivergence, *, head=None,
                    temperature: float = 1.0, token_clip: float | None = None, mask=None):
    """``(terms, metrics)`` of a distillation-only loss over ``sides["student"]`` and
    ``sides["teacher"]``: the token-mean ``distill`` term of ``divergence`` per position (capped
    at ``token_clip`` when set; metric ``jsd``), and the metrics ``entropy`` (student) and
    ``teacher_gap`` (mean ``l_T - l_S`` at the row's tokens), over ``mask [B, T]`` (default
    ``batch["mask"]``; OPSD clears the rows without a teacher context). OPSD's and GKD's loss."""
    def row(logp, tokens):
        ls, lt = logp["student"], logp["teacher"]
        sg = jax.lax.stop_gradient
        d = divergence(ls, lt, tokens)
        if token_clip is not None:
            d = jnp.minimum(d, token_clip)
        return {"jsd": d, "entropy": sg(entropy_from_logprobs(ls)),
                "teacher_gap": sg(gather(lt, tokens) - gather(ls, tokens))}

    mask = batch["mask"] if mask is None else mask
    rows = vocab_rows(row, sides, batch["targets"], mask, head=head, temperature=temperature)
    return distill_term(rows, mask, loss="jsd")
