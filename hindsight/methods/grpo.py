"""GRPO — group-relative policy optimisation, as implemented in verl (spec §1.1).

Shao et al., "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models"
(arXiv 2402.03300); loss details from verl (``compute_policy_loss_vanilla``, ``agg_loss``).

Per token ``l = max(-A rho, -A clip(rho, 1 - 0.2, 1 + 0.2))``, dual-clipped at ``-3 A`` for
``A < 0``; advantages ``(R - mean_g R) / (std_g R + 1e-6)`` (unbiased std) are computed by the
rollout layer (``advantage_scale="std"``). Aggregation: ``token-mean`` by default (verl's default,
the spec's §0 convention, and the one under which auxiliary token-mean terms add exactly);
``mode="seq-mean-token-mean"`` gives the original paper's per-sequence mean. KL to the reference
is off by default (verl ``use_kl_loss=false``); ``kl_coef=0.001`` with ``k3`` is verl's value when
on, and needs the ``reference`` model. The KL to the reference is reported as a metric whenever a
reference is given.
"""
from __future__ import annotations

import dataclasses

from hindsight._validation import check_choice, check_static_float
from hindsight.batch import check_batch
from hindsight.methods.method import (Method, require_no_state, require_reference,
                                      resolve_config)
from hindsight.methods.policy_gradient import SurrogateConfig, surrogate_loss
from hindsight.objectives import ESTIMATORS, MODES, Loss

NAME = "grpo"
CONTEXTS = ()
ROLLOUT = "group"
FIELDS = ("logp_old", "advantages")


@dataclasses.dataclass(frozen=True)
class GRPOConfig(SurrogateConfig):
    """GRPO options (spec §1.1 defaults; surrogate and LM-head options in the base classes).

    Attributes:
      mode: aggregation (``hindsight.objectives.MODES``); ``token-mean`` (verl) by default.
      norm: constant denominator, only for ``mode="seq-mean-token-sum-norm"``.
      kl_coef: weight of the KL penalty to the reference (0 = off).
      kl_estimator: ``k3`` (verl ``low_var_kl``), or ``k1``, ``k2``, ``k1+``, ``k3+``.
    """
    mode: str = "token-mean"
    norm: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"

    def __post_init__(self):
        super().__post_init__()
        check_choice("mode", self.mode, MODES)
        check_choice("kl_estimator", self.kl_estimator, ESTIMATORS)
        check_static_float("kl_coef", self.kl_coef, low=0.0)
        if (self.mode == "seq-mean-token-sum-norm") != (self.norm is not None):
            raise ValueError(f"`norm` is required by, and only by, mode='seq-mean-token-sum-norm'; "
                             f"got mode={self.mode!r}, norm={self.norm!r}")

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0.0


def loss_fn(model, batch, *, config: GRPOConfig | None = None, head=None, reference=None,
            method_state=None, counts=None) -> Loss:
    """GRPO loss on a batch (see :mod:`hindsight.methods.method`).

    Terms: ``policy`` (the clipped surrogate, aggregated with ``mode``) and, with ``kl_coef > 0``,
    ``kl`` (weight ``kl_coef``, same aggregation). Metrics: ``entropy``, ``clip_low_frac``,
    ``clip_high_frac``, ``dual_clip_frac``, ``ratio``, ``approx_kl``, and ``kl`` (to the reference)
    when ``reference`` is given and the KL is not a term. ``counts`` (the step's whole-batch term
    counts) lets the loss form its objective position by position
    (:func:`hindsight.methods.policy_gradient.surrogate_loss`).
    """
    config = resolve_config(NAME, config, GRPOConfig())
    require_no_state(NAME, method_state)
    if config.needs_reference:
        require_reference(NAME, reference, f"kl_coef={config.kl_coef}")
    check_batch(batch, method=NAME, contexts=CONTEXTS, fields=FIELDS)
    return surrogate_loss(model, batch, config, head=head, reference=reference, counts=counts,
                          mode=config.mode, norm=config.norm, kl_coef=config.kl_coef,
                          kl_estimator=config.kl_estimator)


METHOD = Method(name=NAME, loss_fn=loss_fn, config=GRPOConfig(), contexts=CONTEXTS,
                rollout=ROLLOUT, fields=FIELDS,
                paper="Shao et al. 2024, DeepSeekMath (arXiv 2402.03300); verl implementation")
