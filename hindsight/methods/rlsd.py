"""RLSD — self-distilled RLVR: the teacher sets each token's magnitude, the reward its direction
(spec ``other-methods.md`` §2; Self-Distilled RLVR, arXiv 2604.03128).

The teacher is the policy itself (stop-gradient, ``teacher="self"``, or the reference model) read
under the privileged ``teacher`` context (question + reference answer). Per token,
``Delta_t = sg(l_T - l_S)`` at the sampled token, ``w_t = exp(sign(A) Delta_t)`` and the GRPO
advantage ``A`` of the row becomes ``A ((1 - lam) + lam clip(w_t, 1 - eps_w, 1 + eps_w))``
(:func:`hindsight.objectives.rlsd_advantages`) inside the clipped surrogate; there is no
distillation term, so the gradient flows through the policy term only. ``lam`` follows a schedule
over training steps (OUR CHOICE, SDAR's reimplementation: ``lam_0 = 0.5`` decaying linearly to 0
over ``lam_steps = 50`` steps, "gradually transitioning to uniform"): the step is the method's
state (:class:`~hindsight.methods.method.StepState`, advanced once per rollout, checkpointed with the train state), so a
resumed run continues the schedule exactly.
"""
from __future__ import annotations

import dataclasses
import jax
import jax.numpy as jnp

from hindsight._validation import check_choice, check_static_float
from hindsight.batch import check_batch
from hindsight.methods.method import (TEACHERS, Method, StepState, advance_step, init_step_state,
                                      require_row_advantages, require_step_state, resolve_config,
                                      teacher_hidden)
from hindsight.methods.policy_gradient import SurrogateConfig, policy_rows, surrogate_terms
from hindsight.objectives import Loss, aggregate, rlsd_advantages

NAME = "rlsd"
CONTEXTS = ("teacher",)
ROLLOUT = "group"
FIELDS = ("logp_old", "advantages")


@dataclasses.dataclass(frozen=True)
class RLSDConfig(SurrogateConfig):
    """RLSD options on top of GRPO's surrogate (spec §2).

    Attributes:
      eps_w: the weight clip, ``w in [1 - eps_w, 1 + eps_w]`` (0.2, every implementation read).
      lam_0: the interpolation weight at step 0 (0.5, SDAR's reimplementation; 1.0 is eq 15).
      lam_steps: steps over which ``lam`` decays linearly from ``lam_0`` to 0 (50); 0 keeps
        ``lam = lam_0`` for the whole run.
      teacher: ``"self"`` (same params, stop-gradient) or ``"reference"``.
    """
    eps_w: float = 0.2
    lam_0: float = 0.5
    lam_steps: int = 50
    teacher: str = "self"

    def __post_init__(self):
        super().__post_init__()
        check_static_float("eps_w", self.eps_w, low=0.0, high=1.0)
        check_static_float("lam_0", self.lam_0, low=0.0, high=1.0)
        if isinstance(self.lam_steps, bool) or not isinstance(self.lam_steps, int) \
                or self.lam_steps < 0:
            raise ValueError(f"`lam_steps` must be an int >= 0, got {self.lam_steps!r}")
        check_choice("teacher", self.teacher, TEACHERS)

    @property
    def needs_reference(self) -> bool:
        return self.teacher == "reference"

    def lam(self, step) -> jax.Array:
        """``lam`` at training step ``step`` (0-based; may be traced)."""
        if self.lam_steps == 0:
            return jnp.float32(self.lam_0)
        progress = jnp.asarray(step, jnp.float32) / self.lam_steps
        return jnp.float32(self.lam_0) * jnp.clip(1.0 - progress, 0.0, 1.0)


def loss_fn(model, batch, *, config: RLSDConfig | None = None, head=None, reference=None,
            method_state: StepState | None = None, external_teacher=None) -> Loss:
    """The GRPO surrogate with RLSD's per-token advantages: one term, ``policy`` (token mean).

    Metrics: GRPO's plus ``lam`` (this step's), ``teacher_gap`` (mean ``l_T - l_S``) and
    ``advantage_scale`` (mean ``A_hat / A`` over tokens of rows with ``A != 0``).
    """
    config = resolve_config(NAME, config, RLSDConfig())
    require_step_state(NAME, method_state)
    check_batch(batch, method=NAME, contexts=CONTEXTS, fields=FIELDS)
    require_row_advantages(NAME, batch)
    teacher = teacher_hidden(NAME, config.teacher, model, reference, batch,
                             external=external_teacher)
    rows = policy_rows(model, batch, config, head=head, reference=reference, teacher=teacher)
    mask = batch["mask"]
    lam = config.lam(method_state.step)
    advantages = rlsd_advantages(batch["advantages"], rows["teacher_logp"], rows["logp"], mask,
                                 eps_w=config.eps_w, lam=lam)
    terms, metrics = surrogate_terms(rows, {**batch, "advantages": advantages}, config)
    a = jnp.asarray(batch["advantages"], jnp.float32)[:, None]
    signed = (jnp.asarray(mask) > 0) & (a != 0)
    metrics["lam"] = (jnp.sum(jnp.where(signed, lam, 0.0)), jnp.sum(signed.astype(jnp.float32)))
    metrics["advantage_scale"] = aggregate(
        jnp.where(signed, advantages / jnp.where(signed, a, 1.0), 0.0), signed)
    metrics["teacher_gap"] = aggregate(
        jax.lax.stop_gradient(rows["teacher_logp"] - rows["logp"]), mask)
    return Loss(terms, metrics)


METHOD = Method(name=NAME, loss_fn=loss_fn, config=RLSDConfig(), contexts=CONTEXTS,
                rollout=ROLLOUT, fields=FIELDS, init_state=init_step_state, update_state=advance_step,
                paper="Self-Distilled RLVR (RLSD), arXiv 2604.03128 (spec §2)")
