"""β-OPSD — reference-anchored on-policy self-distillation with a return-to-go (spec
``other-methods.md`` §5; "β-OPSD: Deriving with Policy Optimization, Training with
Self-Distillation", arXiv 2607.28582).

The objective ``-KL(pi || p_T) - (beta - 1) KL(pi || pi_ref)`` has the optimum
``pi* ∝ pi_ref^(1 - w) p_T^w``, ``w = 1 / beta``; per position the target is the logit mix
``log p~ = log_softmax((1 - w) z_ref + w z_T)`` (:func:`hindsight.signals.mixture_target`; the
paper's "D+F": ``z_ref`` the current student without the context, under ``stop_gradient``, ``z_T``
the frozen initial model with the privileged context). With ``rho_t = l_S(y_t) - log p~(y_t)`` and
its discounted return-to-go ``G_t = sum_{s >= t} gamma^(s - t) rho_s`` within the row
(:func:`hindsight.signals.return_to_go`), the loss ``mean_t sg(G_t) l_S(y_t)`` is unbiased for the
gradient of ``KL(pi || p~)`` at ``gamma = 1``. ``w`` follows a linear schedule ``w_k = w_s + (w_e -
w_s) k / (K - 1)`` (0.5 -> 0.8 over K = 200, the paper's), ``k`` the rollouts trained on so far
(the method state, checkpointed; one optimizer update per rollout by default, so ``k`` counts the
paper's updates), held at ``w_e`` after. ``w = 1`` is vanilla OPSD.

OUR CHOICE (spec §5): the paper's version (geometric mix, D+F, return-to-go on) is the default;
the released code's arithmetic mix of probabilities is ``mix="arithmetic"``, its frozen reference
anchor ``anchor="reference"`` (F+F) and its return-to-go off ``return_to_go=False``. The mean is a
token mean over the batch (the paper's ``1 / T`` per sequence, then the batch mean, for one row).
"""
from __future__ import annotations

import dataclasses
import jax
import jax.numpy as jnp

from hindsight._validation import check_choice, check_static_float
from hindsight.batch import check_batch
from hindsight.methods.forward import context_hidden, gather, vocab_rows
from hindsight.methods.method import (TEACHERS, LossConfig, Method, StepState, advance_step,
                                      init_step_state, require_reference, require_step_state,
                                      resolve_config, teacher_hidden)
from hindsight.objectives import Loss, aggregate, term
from hindsight.ops import entropy_from_logprobs
from hindsight.signals import mixture_target, return_to_go

NAME = "beta_opsd"
CONTEXTS = ("teacher",)
ROLLOUT = "group"
FIELDS = ()
ANCHORS = ("student", "reference")
MIXES = ("geometric", "arithmetic")


@dataclasses.dataclass(frozen=True)
class BetaOPSDConfig(LossConfig):
    """β-OPSD options (spec §5, the paper's defaults).

    Attributes:
      w_start, w_end, w_steps: the ``w = 1 / beta`` schedule (0.5 -> 0.8 over 200 steps);
        ``w_steps = 1`` keeps ``w_start``.
      gamma: discount of the return-to-go (0.99).
      return_to_go: use ``G_t`` (True) or ``rho_t`` alone (the released code's default).
      mix: ``"geometric"`` (logit mix, the paper) or ``"arithmetic"`` (the code's probabilities).
      anchor: ``z_ref`` from the current ``"student"`` under ``stop_gradient`` (D) or the frozen
        ``"reference"`` on the policy context (F).
      teacher: ``z_T`` from the ``"reference"`` (the frozen initial model, F) or ``"self"`` (D),
        on the teacher context.
    """
    w_start: float = 0.5
    w_end: float = 0.8
    w_steps: int = 200
    gamma: float = 0.99
    return_to_go: bool = True
    mix: str = "geometric"
    anchor: str = "student"
    teacher: str = "reference"

    def __post_init__(self):
        super().__post_init__()
        check_static_float("w_start", self.w_start, low=0.0, high=1.0)
        check_static_float("w_end", self.w_end, low=0.0, high=1.0)
        check_static_float("gamma", self.gamma, low=0.0, high=1.0)
        if isinstance(self.w_steps, bool) or not isinstance(self.w_steps, int) \
                or self.w_steps < 1:
            raise ValueError(f"`w_steps` must be an int >= 1, got {self.w_steps!r}")
        if not isinstance(self.return_to_go, bool):
            raise ValueError(f"`return_to_go` must be a bool, got {self.return_to_go!r}")
        check_choice("mix", self.mix, MIXES)
        check_choice("anchor", self.anchor, ANCHORS)
        check_choice("teacher", self.teacher, TEACHERS)

    @property
    def needs_reference(self) -> bool:
        return self.teacher == "reference" or self.anchor == "reference"

    @property
    def needs_frozen_reference(self) -> bool:
        """The reference is the initial model ("F"): an EMA one would move it."""
        return self.needs_reference

    def w(self, step) -> jax.Array:
        """``w`` at step ``step`` (0-based; may be traced)."""
        if self.w_steps == 1:
            return jnp.float32(self.w_start)
        progress = jnp.clip(jnp.asarray(step, jnp.float32) / (self.w_steps - 1), 0.0, 1.0)
        return jnp.float32(self.w_start) + (self.w_end - self.w_start) * progress


def loss_fn(model, batch, *, config: BetaOPSDConfig | None = None, head=None, reference=None,
            method_state: StepState | None = None, external_teacher=None) -> Loss:
    """β-OPSD loss: the ``distill`` term, token mean of ``sg(G_t) l_S(y_t)``.

    Metrics: ``w`` (this step's), ``rho`` (mean ``l_S - log p~`` at the sampled tokens, a
    sampled estimate of ``KL(pi || p~)``), ``return`` (mean ``G_t``), ``entropy`` (student).
    """
    config = resolve_config(NAME, config, BetaOPSDConfig())
    require_step_state(NAME, method_state)
    if config.needs_reference:
        require_reference(NAME, reference, "the frozen initial model of the target")
    check_batch(batch, method=NAME, contexts=CONTEXTS, fields=FIELDS)
    w = config.w(method_state.step)
    sides = {"student": context_hidden(model, batch),
             "teacher": teacher_hidden(NAME, config.teacher, model, reference, batch,
                                       external=external_teacher)}
    if config.anchor == "reference":
        sides["anchor"] = context_hidden(reference, batch, frozen=True)

    def row(logp, tokens):
        ls = logp["student"]
        sg = jax.lax.stop_gradient
        anchor = logp["anchor"] if "anchor" in logp else sg(ls)
        # log-probs mix as their logits do: log_softmax is shift-invariant
        target = sg(mixture_target(anchor, logp["teacher"], w=w, mix=config.mix))
        lp = gather(ls, tokens)
        return {"logp": lp, "target_logp": gather(target, tokens),
                "entropy": sg(entropy_from_logprobs(ls))}

    rows = vocab_rows(row, sides, batch["targets"], batch["mask"], head=head,
                      temperature=config.temperature)
    mask = batch["mask"]
    m = jnp.asarray(mask) > 0
    rho = jax.lax.stop_gradient(jnp.where(m, rows["logp"] - rows["target_logp"], 0.0))
    g = return_to_go(rho, mask, gamma=config.gamma) if config.return_to_go else rho
    g = jax.lax.stop_gradient(g)
    metrics = {"rho": aggregate(rho, mask), "return": aggregate(g, mask),
               "entropy": aggregate(rows["entropy"], mask),
               "w": (jnp.sum(jnp.where(m, w, 0.0)), jnp.sum(m.astype(jnp.float32)))}
    return Loss({"distill": term(g * rows["logp"], mask)}, metrics)


METHOD = Method(name=NAME, loss_fn=loss_fn, config=BetaOPSDConfig(), contexts=CONTEXTS,
                rollout=ROLLOUT, fields=FIELDS, init_state=init_step_state, update_state=advance_step,
                paper="β-OPSD (arXiv 2607.28582; spec §5)")
