"""CRAFT — counterfactual credit from free sibling rollouts, with a controller and KL
polarisation (spec §4).

CRAFT (arXiv 2606.29476; abstract-level verification). Three independently switchable pillars on
top of the baseline, which is GRPO plus SDAR's gated distillation (``sg(g) (sg(logp_T) - logp_S)``,
``g = sigmoid(beta_gate * D)``, ``D = sg(logp_T - logp_S)``) and a k3 KL to the reference, at fixed
weights ``lambda_0 = 0.01``, ``mu_0 = 0.001``:

1. ``cti``: Counterfactual Token Importance replaces the gate by a signed credit ``c`` from the
   ``G - 1`` siblings of each rollout (self-normalised importance weights ``softmax(D / tau)``,
   leave-one-out advantage change, centred asymmetric sigmoid); ``L_cti = -token_mean(c D logp_S)``.
2. ``controller``: ``(lambda, mu)`` follow an EMA of the credit activity (``method_state``, a
   :class:`hindsight.signals.ControllerState`, updated once per optimizer step by
   :func:`update_state` once per rollout, from the ``credit_activity`` metric averaged over the
   rollout's optimizer steps).
3. ``polarise``: the KL to the reference is mode-seeking (reverse k3) where ``c > theta_KL`` and
   mode-covering (forward estimator) where ``c < -theta_KL``.

``L = L_GRPO + lambda * L_distill + mu * token_mean(KL)``: three named terms, ``policy``,
``distill`` (weight ``lambda``) and ``kl`` (weight ``mu``), each a token mean. Switches are static flags that swap in
the baseline term (never a multiplication by 0), so all three off reproduces the baseline bit for
bit. All formulas and defaults beyond the pillar structure are OUR CHOICE (spec §4).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from hindsight._validation import check_choice, check_static_float, shape_of
from hindsight.batch import check_batch
from hindsight.methods.method import (TEACHERS, Method, require_reference,
                                      resolve_config, teacher_hidden)
from hindsight.methods.policy_gradient import SurrogateConfig, policy_rows, surrogate_terms
from hindsight.objectives import Loss, Term, aggregate
from hindsight.signals import (ControllerState, controller_init, controller_update,
                               counterfactual_credit_from_gap, craft_loss_terms)

NAME = "craft"
CONTEXTS = ("teacher",)
ROLLOUT = "group"
FIELDS = ("logp_old", "advantages")


@dataclasses.dataclass(frozen=True)
class CRAFTConfig(SurrogateConfig):
    """CRAFT options (spec §4 defaults, OUR CHOICE) on top of GRPO's surrogate.

    Attributes:
      group_size: ``G``, rows per prompt (contiguous); the credit compares siblings (8, SDPO's;
        in an experiment it follows ``rollout.group_size``).
      teacher: ``"self"`` (same params, stop-gradient) or ``"reference"``.
      cti, controller, polarise: the pillar switches (static).
      beta_gate: sharpness of the baseline SDAR gate (5).
      lambda_0, mu_0: baseline distillation and KL weights (0.01, 0.001).
      theta_kl: credit threshold of the activity and of the polarisation (0.1).
      neg_mode: ``"forward"`` (mode-covering) or ``"negate"`` (``-k3``, [BRIEF]).
      neutral: KL in ``|c| <= theta_kl``: ``"reverse"`` or ``"zero"``.
      kl_clip: clip of the reverse k3 (10, verl); None = off.
      forward_kl_clip: clip of the polarised forward-KL estimator (10); None = off.
      tau, k, kappa_pos, kappa_neg, g_min: credit options
        (:func:`hindsight.signals.counterfactual_credit_from_gap`).
      eta, rho_target, k_up, k_down: controller options
        (:func:`hindsight.signals.controller_update`).
    """
    group_size: int = 8
    teacher: str = "self"
    cti: bool = True
    controller: bool = True
    polarise: bool = True
    beta_gate: float = 5.0
    lambda_0: float = 0.01
    mu_0: float = 0.001
    theta_kl: float = 0.1
    neg_mode: str = "forward"
    neutral: str = "reverse"
    kl_clip: float | None = 10.0
    forward_kl_clip: float | None = 10.0
    tau: float = 1.0
    k: float = 2.0
    kappa_pos: float = 1.0
    kappa_neg: float = 0.5
    g_min: int = 2
    eta: float = 0.1
    rho_target: float = 0.5
    k_up: float = 1.0
    k_down: float = 2.0

    def __post_init__(self):
        super().__post_init__()
        g = self.group_size
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise ValueError(f"`group_size` must be a positive int, got {g!r}")
        for name in ("cti", "controller", "polarise"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"`{name}` must be a bool (a static pillar switch), got "
                                 f"{getattr(self, name)!r}")
        check_choice("teacher", self.teacher, TEACHERS)
        check_choice("neg_mode", self.neg_mode, ("forward", "negate"))
        check_choice("neutral", self.neutral, ("reverse", "zero"))
        for name in ("lambda_0", "mu_0", "theta_kl", "eta"):
            check_static_float(name, getattr(self, name), low=0.0)
        if not self.tau > 0:
            raise ValueError(f"`tau` must be > 0, got {self.tau}")

    @property
    def needs_reference(self) -> bool:
        return True

    def credit_options(self) -> dict:
        return dict(tau=self.tau, k=self.k, kappa_pos=self.kappa_pos, kappa_neg=self.kappa_neg,
                    g_min=self.g_min)


def init_state(config: CRAFTConfig) -> ControllerState:
    """Initial controller state (``e = rho_target``, ``lambda = lambda_0``, ``mu = mu_0``)."""
    return controller_init(rho_target=config.rho_target, lambda_0=config.lambda_0,
                           mu_0=config.mu_0)


def update_state(state: ControllerState, metrics: dict, config: CRAFTConfig) -> ControllerState:
    """One controller step from the step's finalized ``credit_activity`` metric (unchanged when the
    controller is off)."""
    if not config.controller:
        return state
    return controller_update(state, metrics["credit_activity"], eta=config.eta,
                             rho_target=config.rho_target, lambda_0=config.lambda_0,
                             mu_0=config.mu_0, k_up=config.k_up, k_down=config.k_down)


def derive(rollout) -> dict:
    """The sibling credit compares the rows of one sampled group: ``group_size`` follows the
    rollout's."""
    return {"group_size": rollout.group_size}


def loss_fn(model, batch, *, config: CRAFTConfig | None = None, head=None, reference=None,
            method_state: ControllerState | None = None, external_teacher=None) -> Loss:
    """CRAFT loss (needs ``reference`` for the KL term): terms ``policy``, ``distill``
    (``L_distill``: CTI or the baseline gated term; weight ``lambda``) and ``kl`` (the, possibly
    polarised, KL to the reference; weight ``mu``), all token means.

    Metrics: GRPO's (:func:`hindsight.methods.grpo.loss_fn`, ``kl`` being the plain k3),
    ``teacher_gap`` and, when the credit is computed, ``credit_mean``, ``credit_abs`` and
    ``credit_activity`` (fraction ``|c| > theta_kl``, the controller's input).
    """
    config = resolve_config(NAME, config, CRAFTConfig())
    require_reference(NAME, reference, "the KL term to the reference policy")
    if config.controller and method_state is None:
        raise ValueError(f"method {NAME!r} with controller=True needs `method_state` (a "
                         f"ControllerState from init_state(config))")
    b, _ = check_batch(batch, method=NAME, contexts=CONTEXTS, fields=FIELDS)
    if shape_of(batch["advantages"]) != (b,):
        raise ValueError(f"method {NAME!r} needs per-sequence advantages [B]=({b},) for the "
                         f"sibling credit, got shape {shape_of(batch['advantages'])}")
    if b % config.group_size:
        raise ValueError(f"method {NAME!r}: group_size={config.group_size} does not divide the "
                         f"batch size B={b}")
    teacher = teacher_hidden(NAME, config.teacher, model, reference, batch,
                             external=external_teacher)
    rows = policy_rows(model, batch, config, head=head, reference=reference, teacher=teacher)
    terms, metrics = surrogate_terms(rows, batch, config)
    mask, advantages = batch["mask"], batch["advantages"]
    gap = jax.lax.stop_gradient(rows["teacher_logp"] - rows["logp"])
    _, count, parts = craft_loss_terms(
        rows["logp"], rows["ref_logp"], gap, mask, advantages, config.group_size, method_state,
        cti=config.cti, controller=config.controller, polarise=config.polarise,
        beta_gate=config.beta_gate, lambda_0=config.lambda_0, mu_0=config.mu_0,
        theta_kl=config.theta_kl, neg_mode=config.neg_mode, neutral=config.neutral,
        kl_clip=config.kl_clip, forward_kl_clip=config.forward_kl_clip,
        **config.credit_options())
    terms["distill"] = Term(sum=parts["distill_sum"], count=count, weight=parts["lambda"])
    terms["kl"] = Term(sum=parts["kl_sum"], count=count, weight=parts["mu"])
    metrics["teacher_gap"] = aggregate(gap, mask)
    if "active_sum" in parts:
        credit = counterfactual_credit_from_gap(gap, mask, advantages, config.group_size,
                                                **config.credit_options())
        metrics["credit_activity"] = (parts["active_sum"], count)
        metrics["credit_mean"] = aggregate(credit, mask)
        metrics["credit_abs"] = aggregate(jnp.abs(credit), mask)
    return Loss(terms, metrics)


METHOD = Method(name=NAME, loss_fn=loss_fn, config=CRAFTConfig(), contexts=CONTEXTS,
                rollout=ROLLOUT, fields=FIELDS, init_state=init_state, update_state=update_state,
                couples_rows=True, derive=derive,
                paper="CRAFT (arXiv 2606.29476); formulas spec §4 (OUR CHOICE)")
