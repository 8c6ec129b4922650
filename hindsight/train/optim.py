"""Optimizer and learning-rate schedule from a config: an optax chain.

``clip_by_global_norm -> optimizer (with its schedule)``. Weight decay (AdamW) applies only to
parameters with at least two dimensions (matrices, embeddings), not to norms and biases: the usual
LLM convention (OUR CHOICE; set ``decay_min_ndim=0`` to decay everything).
"""
from __future__ import annotations

import dataclasses

import jax
import optax

OPTIMIZERS = ("adamw", "adam", "sgd")
SCHEDULES = ("constant", "cosine", "linear")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Optimizer settings; validated on construction (names, ranges, schedule length).

    ``learning_rate`` is the peak rate reached after ``warmup_steps`` of linear warm-up from 0;
    ``cosine``/``linear`` then decay to ``learning_rate * final_lr_ratio`` at ``total_steps``.
    ``max_grad_norm=None`` disables clipping.
    """
    name: str = "adamw"
    learning_rate: float = 1e-6
    schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int | None = None
    final_lr_ratio: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    decay_min_ndim: int = 2
    momentum: float = 0.0
    max_grad_norm: float | None = 1.0

    def __post_init__(self):
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optim.name must be one of {list(OPTIMIZERS)}, got {self.name!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"optim.schedule must be one of {list(SCHEDULES)}, got {self.schedule!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"optim.learning_rate must be > 0, got {self.learning_rate}")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.schedule != "constant":
            if self.total_steps is None or self.total_steps <= self.warmup_steps:
                raise ValueError(f"optim.total_steps must be > optim.warmup_steps="
                                 f"{self.warmup_steps} for schedule={self.schedule!r}, got "
                                 f"{self.total_steps}")
        if not 0.0 <= self.final_lr_ratio <= 1.0:
            raise ValueError(f"optim.final_lr_ratio must be in [0, 1], got {self.final_lr_ratio}")
        for name in ("b1", "b2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"optim.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.weight_decay < 0:
            raise ValueError(f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"optim.max_grad_norm must be > 0 or None, got {self.max_grad_norm}")


def make_schedule(config: OptimConfig) -> optax.Schedule:
    """Step -> learning rate: linear warm-up to the peak, then constant / cosine / linear decay."""
    peak, warm = config.learning_rate, config.warmup_steps
    if config.schedule == "constant":
        decay = optax.constant_schedule(peak)
    else:
        end = peak * config.final_lr_ratio
        steps = config.total_steps - warm
        decay = (optax.cosine_decay_schedule(peak, steps, alpha=config.final_lr_ratio)
                 if config.schedule == "cosine" else optax.linear_schedule(peak, end, steps))
    if warm == 0:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warm), decay], [warm])


def make_optimizer(config: OptimConfig) -> optax.GradientTransformation:
    """The optax chain for ``config`` (clipping first, so the optimizer sees clipped gradients)."""
    lr = make_schedule(config)
    if config.name == "adamw":
        min_ndim = config.decay_min_ndim
        opt = optax.adamw(lr, b1=config.b1, b2=config.b2, eps=config.eps,
                          weight_decay=config.weight_decay,
                          mask=lambda params: jax.tree.map(lambda p: p.ndim >= min_ndim, params))
    elif config.name == "adam":
        opt = optax.adam(lr, b1=config.b1, b2=config.b2, eps=config.eps)
    else:
        opt = optax.sgd(lr, momentum=config.momentum or None)
    if config.max_grad_norm is None:
        return opt
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), opt)
