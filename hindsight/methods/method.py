"""What a method is: a loss function plus what the rollout layer and the train loop must know.

Every method module defines a frozen config dataclass (its spec defaults), ``CONTEXTS`` (the extra
batch contexts its loss reads), ``ROLLOUT`` (the rollout shape it trains on), ``FIELDS`` (the batch
fields it reads besides the policy context and the response), ``loss_fn`` and ``METHOD``, the
:class:`Method` record the registry serves.

Loss signature, the same for every method (what :mod:`hindsight.train.step` calls)::

    loss_fn(model, batch, *, config=None, reference=None, method_state=None)
        -> (sum, count, metrics)

``config`` defaults to the method's defaults; ``reference`` is the frozen/EMA reference model;
``method_state`` is the state of a stateful method (CRAFT's controller) and must be None otherwise.
``metrics`` maps names to ``(sum, count)`` pairs: add pairs over micro-batches, divide once.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from hindsight._validation import check_static_float
from hindsight.methods.forward import context_hidden

ROLLOUTS = ("group", "dynamic", "hdl_tree")
"""``group``: G independent samples per prompt; ``dynamic``: DAPO dynamic sampling (groups with
identical rewards dropped, sampling continues until the batch is full); ``hdl_tree``: HDL's
2 roots x (1 + 4 + 3) continuations per prompt."""


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Options every loss shares.

    Attributes:
      temperature: logits are divided by it before every softmax; must equal the rollout's sampling
        temperature for the policy log-probs to match ``logp_old``.
      chunk_size: rows per LM-head block (None: :func:`hindsight.ops.default_chunk_size`).
    """
    temperature: float = 1.0
    chunk_size: int | None = None

    def __post_init__(self):
        if not check_static_float("temperature", self.temperature) > 0.0:
            raise ValueError(f"`temperature` must be > 0, got {self.temperature}")
        c = self.chunk_size
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
            raise ValueError(f"`chunk_size` must be a positive int or None, got {c!r}")

    @property
    def needs_reference(self) -> bool:
        """Whether the loss needs the ``reference`` model with this configuration."""
        return False


@dataclasses.dataclass(frozen=True)
class Method:
    """A registered method.

    Attributes:
      name: registry key.
      loss_fn: see the module doc.
      config: the default config (spec defaults).
      contexts: extra batch contexts the loss reads (``("teacher",)``, ...).
      rollout: one of ``ROLLOUTS``.
      fields: batch fields read besides the policy context and the response.
      paper: where the method comes from.
      init_state: ``init_state(config) -> state`` for a stateful method, else None.
      update_state: ``update_state(state, metrics, config) -> state``, run once per optimizer step
        with the step's finalized metrics, else None.
    """
    name: str
    loss_fn: Callable
    config: Any
    contexts: tuple[str, ...]
    rollout: str
    fields: tuple[str, ...]
    paper: str
    init_state: Callable | None = None
    update_state: Callable | None = None

    def make_config(self, **overrides):
        """The default config with ``overrides`` replaced (validated by the config itself)."""
        names = {f.name for f in dataclasses.fields(self.config)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(f"method {self.name!r} has no option(s) {unknown}; its options are "
                            f"{sorted(names)}")
        return dataclasses.replace(self.config, **overrides)

    def method_update(self, config=None) -> Callable | None:
        """``method_update(state, metrics) -> state`` for :func:`hindsight.train.make_train_step`
        (None for a stateless method)."""
        if self.update_state is None:
            return None
        config = self.config if config is None else config
        return lambda state, metrics: self.update_state(state, metrics, config)


def resolve_config(name: str, config, default):
    """``config`` (or ``default`` when None), checked to be the method's config class."""
    if config is None:
        return default
    if type(config) is not type(default):
        raise TypeError(f"method {name!r} takes a {type(default).__name__}, got "
                        f"{type(config).__name__}")
    return config


def require_reference(name: str, reference, why: str) -> None:
    if reference is None:
        raise ValueError(f"method {name!r} needs the `reference` model ({why}); create the train "
                         f"state with a reference (StepConfig(reference='frozen' or 'ema'))")


def require_no_state(name: str, method_state) -> None:
    if method_state is not None:
        raise ValueError(f"method {name!r} keeps no state, got method_state of type "
                         f"{type(method_state).__name__}")


TEACHERS = ("self", "reference")
"""Whose weights run a teacher context: the trained params under ``stop_gradient`` (``"self"``), or
the ``reference`` model (a frozen initial policy or an EMA of the params, per the train state)."""


def teacher_model(name: str, teacher: str, model, reference):
    """The model that runs ``name``'s teacher contexts for the config value ``teacher``."""
    if teacher == "self":
        return model
    require_reference(name, reference, "teacher='reference'")
    return reference


def teacher_hidden(name: str, teacher: str, model, reference, batch, context: str = "teacher"):
    """The frozen teacher side ``(hidden [B, T, D], unembed [D, V])``: the batch's ``context``
    run by :func:`teacher_model`'s weights under ``stop_gradient``."""
    return context_hidden(teacher_model(name, teacher, model, reference), batch, context,
                          frozen=True)
