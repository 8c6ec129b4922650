"""Optimizer and learning-rate schedule from a config: an optax chain.

``clip_by_global_norm -> optimizer (with its schedule)``. Weight decay (AdamW) applies only to
parameters with at least two dimensions (matrices, embeddings), not to norms and biases: the usual
LLM convention (OUR CHOICE; set ``decay_min_ndim=0`` to decay everything).

Low-precision parameters (``model.param_dtype="bfloat16"``) get a float32 master copy in the
optimizer state (:func:`with_master_weights`, around the whole chain): clipping, moments and
updates run on the master, and the params are the master rounded to bfloat16 after every update.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

OPTIMIZERS = ("adamw", "adam", "sgd")
SCHEDULES = ("constant", "cosine", "linear")
STATE_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Optimizer settings; validated on construction (names, ranges, schedule length).

    ``learning_rate`` is the peak rate reached after ``warmup_steps`` of linear warm-up from 0;
    ``cosine``/``linear`` then decay to ``learning_rate * final_lr_ratio`` at ``total_steps``.
    ``max_grad_norm=None`` disables clipping.

    ``mu_dtype``: storage dtype of the first moment (Adam's ``mu``, SGD's momentum trace; optax's
    ``mu_dtype``): ``"bfloat16"`` halves it. Adam's second moment stays float32 (OUR CHOICE):
    with ``b2=0.999`` each update moves it by 0.1% of its value, below bfloat16's half-ulp
    (0.2-0.4%), so a bfloat16 ``nu`` would stop following the gradients after a few hundred
    updates. ``master_weights``: with ``model.param_dtype="bfloat16"``, keep a float32 master
    copy of the params in the optimizer state (:func:`with_master_weights`); False adds the
    updates to the bfloat16 params directly, where any update below 2^-9 of a weight rounds away
    (at a learning rate of 1e-6, nearly all of them). Ignored for float32 params.
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
    mu_dtype: str = "float32"
    master_weights: bool = True

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
        if self.mu_dtype not in STATE_DTYPES:
            raise ValueError(f"train.optim.mu_dtype must be one of {list(STATE_DTYPES)}, got "
                             f"{self.mu_dtype!r}")
        if not isinstance(self.master_weights, bool):
            raise ValueError(f"train.optim.master_weights must be a bool, got "
                             f"{self.master_weights!r}")


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


class MasterState(NamedTuple):
    """:func:`with_master_weights`' state: ``master`` (the params in the master dtype, the values
    the updates are applied to; the train state shards each leaf like its parameter) and
    ``inner`` (the wrapped transformation's state, built on the master)."""
    master: Any
    inner: Any


def with_master_weights(inner: optax.GradientTransformation, *,
                        dtype=jnp.float32) -> optax.GradientTransformation:
    """Run ``inner`` on a ``dtype`` master copy of the params kept in the optimizer state.

    ``update(grads, state, params)`` casts the gradients to ``dtype``, updates the master with
    ``inner``, and returns ``master_new - params`` in ``dtype``: ``optax.apply_updates`` adds it in
    ``dtype`` and rounds the sum to the params' dtype, so the params become the new master rounded
    (no rounding error accumulates in them: each update starts again from the master).
    """
    dtype = jnp.dtype(dtype)

    def init(params):
        master = jax.tree.map(lambda p: jnp.asarray(p, dtype), params)
        return MasterState(master=master, inner=inner.init(master))

    def update(grads, state, params=None):
        if params is None:
            raise ValueError("with_master_weights needs the params: update(grads, state, params)")
        grads = jax.tree.map(lambda g: g.astype(dtype), grads)
        updates, inner_state = inner.update(grads, state.inner, state.master)
        master = optax.apply_updates(state.master, updates)
        delta = jax.tree.map(lambda m, p: m - p.astype(dtype), master, params)
        return delta, MasterState(master=master, inner=inner_state)

    return optax.GradientTransformation(init, update)


def make_optimizer(config: OptimConfig, *,
                   param_dtype: str = "float32") -> optax.GradientTransformation:
    """The optax chain for ``config`` (clipping first, so the optimizer sees clipped gradients),
    on a float32 master copy (:func:`with_master_weights`) when ``param_dtype`` (the params'
    storage dtype, ``model.param_dtype``) is not float32 and ``config.master_weights``."""
    lr = make_schedule(config)
    mu_dtype = jnp.dtype(config.mu_dtype)
    if config.name == "adamw":
        min_ndim = config.decay_min_ndim
        opt = optax.adamw(lr, b1=config.b1, b2=config.b2, eps=config.eps, mu_dtype=mu_dtype,
                          weight_decay=config.weight_decay,
                          mask=lambda params: jax.tree.map(lambda p: p.ndim >= min_ndim, params))
    elif config.name == "adam":
        opt = optax.adam(lr, b1=config.b1, b2=config.b2, eps=config.eps, mu_dtype=mu_dtype)
    else:
        opt = optax.sgd(lr, momentum=config.momentum or None, accumulator_dtype=mu_dtype)
    if config.max_grad_norm is not None:
        opt = optax.chain(optax.clip_by_global_norm(config.max_grad_norm), opt)
    if jnp.dtype(param_dtype) != jnp.float32 and config.master_weights:
        opt = with_master_weights(opt, dtype=jnp.float32)
    return opt
