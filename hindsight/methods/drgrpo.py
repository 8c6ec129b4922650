"""Dr.GRPO — GRPO done right: no length or difficulty bias (spec §1.1 aggregation modes).

Liu et al., "Understanding R1-Zero-Like Training: A Critical Perspective" (arXiv 2503.20783).

Two changes to GRPO: advantages are not divided by the group's reward std (``advantage_scale =
"none"``, applied by the rollout layer: ``A = R - mean_g R``), and each sequence's token *sum* is
divided by a constant instead of its own length (``seq-mean-token-sum-norm``), the constant being
the maximum response length. The surrogate keeps verl's clip (0.2 / 0.2, dual clip 3); no KL.
"""
from __future__ import annotations

import dataclasses

from hindsight.batch import check_batch
from hindsight.methods.method import Method, require_no_state, resolve_config
from hindsight.methods.policy_gradient import SurrogateConfig, surrogate_loss
from hindsight.objectives import Loss

NAME = "drgrpo"
CONTEXTS = ()
ROLLOUT = "group"
FIELDS = ("logp_old", "advantages")


@dataclasses.dataclass(frozen=True)
class DrGRPOConfig(SurrogateConfig):
    """Dr.GRPO options.

    Attributes:
      advantage_scale: ``"none"`` (the rollout layer's advantages are not std-scaled).
      max_response_length: the constant denominator of each sequence's token sum (in an
        experiment: ``rollout.max_new_tokens``); None uses the batch's response width ``T`` (the rollout pads responses to its generation cap, so ``T`` is
        the maximum response length and is the same for every micro-batch).
    """
    advantage_scale: str = "none"
    max_response_length: int | None = None

    def __post_init__(self):
        super().__post_init__()
        n = self.max_response_length
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"`max_response_length` must be a positive int or None, got {n!r}")


def loss_fn(model, batch, *, config: DrGRPOConfig | None = None, head=None, reference=None,
            method_state=None, counts=None) -> Loss:
    """Dr.GRPO loss: the ``policy`` term in ``seq-mean-token-sum-norm`` (its count is the number
    of non-empty sequences, its sums are divided by ``max_response_length``).

    Metrics as :func:`hindsight.methods.grpo.loss_fn`; ``kl`` uses the same aggregation as the
    policy term, ``entropy`` and the clip statistics are token means.
    """
    config = resolve_config(NAME, config, DrGRPOConfig())
    require_no_state(NAME, method_state)
    _, length = check_batch(batch, method=NAME, contexts=CONTEXTS, fields=FIELDS)
    norm = config.max_response_length or length
    return surrogate_loss(model, batch, config, head=head, reference=reference, counts=counts,
                          mode="seq-mean-token-sum-norm", norm=float(norm))


def derive(rollout) -> dict:
    """The normaliser is the rollout's response cap."""
    return {"max_response_length": int(rollout.max_new_tokens)}


METHOD = Method(name=NAME, loss_fn=loss_fn, config=DrGRPOConfig(), contexts=CONTEXTS,
                rollout=ROLLOUT, fields=FIELDS, derive=derive,
                paper="Liu et al. 2025, Understanding R1-Zero-Like Training (arXiv 2503.20783)")
