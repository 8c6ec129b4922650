"""What a method is: a loss function plus what the rollout layer and the train loop must know.

Every method module defines a frozen config dataclass (its spec defaults), ``CONTEXTS`` (the extra
batch contexts its loss reads), ``ROLLOUT`` (the rollout shape it trains on), ``FIELDS`` (the batch
fields it reads besides the policy context and the response), ``loss_fn`` and ``METHOD``, the
:class:`Method` record the registry serves.

Loss signature, the same for every method (what :mod:`hindsight.train.step` calls)::

    loss_fn(model, batch, *, config=None, head=None, reference=None, method_state=None)
        -> hindsight.objectives.Loss(terms={name: Term(sum, count, weight)}, metrics={...})

Methods that read a teacher context also take ``external_teacher=None`` (the frozen external
teacher model, for ``teacher="external"``; the train step passes it to the losses that accept it).

``config`` defaults to the method's defaults; ``head`` is the :class:`~hindsight.methods.LMHead`
(backend, block size, vocabulary mask; default the fused backend); ``reference`` is the
frozen/EMA reference model; ``method_state`` is the state of a stateful method (CRAFT's
controller) and must be None otherwise. Each term is a ``(sum, count)`` pair with a weight; the
objective is ``sum_k weight_k * sum_k / count_k`` once pairs are added over micro-batches and
devices (:mod:`hindsight.objectives.terms`). ``metrics`` maps names to ``(sum, count)`` pairs.

A registry record is configured for one experiment with :meth:`Method.configure`: options given
explicitly, then the options that follow the rollout (the loss temperature, a group size, a
response-length normaliser) derived from it, so a command-line override of the rollout reaches
them.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax.numpy as jnp

from hindsight._validation import check_static_float
from hindsight.batch import context_key
from hindsight.methods.forward import context_hidden

ROLLOUTS = ("group", "dynamic", "hdl_tree", "completions", "gkd", "recoverability")


@dataclasses.dataclass(frozen=True)
class RolloutShape:
    """What a method's derived options follow (an experiment's ``rollout`` section):
    ``group_size`` (rows per prompt; None for HDL trees, whose size is the method's),
    ``max_new_tokens`` (the response cap ``T``) and ``temperature`` (the sampling temperature)."""
    group_size: int | None = None
    max_new_tokens: int = 64
    temperature: float = 1.0
"""``group``: G independent samples per prompt; ``dynamic``: DAPO dynamic sampling (groups with
identical rewards dropped, sampling continues until the batch is full); ``hdl_tree``: HDL's
2 roots x (1 + 4 + 3) continuations per prompt; ``completions``: each example's own completion,
nothing sampled (supervised fine-tuning); ``gkd``: one row per prompt, the student's sample with
probability ``lmbda``, else the example's completion or the teacher's sample (TRL's GKD);
``recoverability``: G samples per prompt, then teacher branches from failing rows' error states
and one supervision row per replayed state (counterfactual recoverability)."""


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Options every loss shares.

    Attributes:
      temperature: logits are divided by it before every softmax; must equal the rollout's sampling
        temperature for the policy log-probs to match ``logp_old`` (in an experiment it follows
        ``rollout.temperature``).
    """
    temperature: float = 1.0

    def __post_init__(self):
        if not check_static_float("temperature", self.temperature) > 0.0:
            raise ValueError(f"`temperature` must be > 0, got {self.temperature}")

    @property
    def needs_reference(self) -> bool:
        """Whether the loss needs the ``reference`` model with this configuration."""
        return False

    @property
    def needs_frozen_reference(self) -> bool:
        """Whether that reference must stay the initial policy (an EMA one is refused)."""
        return False


@dataclasses.dataclass(frozen=True)
class Method:
    """A registered method, or one configured for an experiment (:meth:`configure`).

    Attributes:
      name: registry key.
      loss_fn: see the module doc.
      config: the config (the registry's: spec defaults; a configured record's: resolved).
      contexts: extra batch contexts the loss reads (``("teacher",)``, ...).
      rollout: one of ``ROLLOUTS``.
      fields: batch fields read besides the policy context and the response.
      paper: where the method comes from.
      init_state: ``init_state(config) -> state`` for a stateful method, else None.
      update_state: ``update_state(state, metrics, config) -> state``, run once per rollout (after
        its optimizer steps) with the mean of those steps' finalized metrics, else None.
      couples_rows: the loss reads other rows of a group (CRAFT's siblings), so every micro-batch
        must hold whole groups (:func:`hindsight.train.check_layout`).
      shape_rewards: ``shape_rewards(rewards [B], lengths [B], config) -> [B]``, applied by the
        rollout layer before the advantages (DAPO's overlong penalty), else None.
      derive: ``derive(rollout) -> {option: value}`` for the options that follow the rollout
        section (``group_size``, ``max_new_tokens``, ``temperature``) unless set explicitly; the
        loss temperature follows ``rollout.temperature`` for every method that has one.
      group_size: rows per prompt of a configured record (None in the registry).
      prepare: the name of a preparation run once per run before training, with the frozen
        initial policy (:data:`hindsight.rollout.prepare.PREPARATIONS`: Neuron-OPSD's
        ``neuron_selection``), or None. It returns the task the run trains on (e.g. the selected
        examples, carrying what the method's teacher-context parts read); its result is saved
        in the run directory, so a resumed run reloads it instead of redoing it.
      extra_rows: ``extra_rows(config) -> int``, rows the rollout adds to each group after its
        ``rollout.group_size`` samples (counterfactual recoverability's supervision rows): a
        configured record's ``group_size`` counts them; None: none.
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
    couples_rows: bool = False
    shape_rewards: Callable | None = None
    derive: Callable | None = None
    group_size: int | None = None
    prepare: str | None = None
    extra_rows: Callable | None = None

    @property
    def samples_per_group(self) -> int | None:
        """Rows the rollout samples per prompt: :attr:`group_size` less the :attr:`extra_rows`."""
        if self.group_size is None or self.extra_rows is None:
            return self.group_size
        return self.group_size - self.extra_rows(self.config)

    def make_config(self, **overrides):
        """The default config with ``overrides`` replaced (validated by the config itself)."""
        names = self.option_names()
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(f"method {self.name!r} has no option(s) {unknown}; its options are "
                            f"{sorted(names)}")
        return dataclasses.replace(self.config, **overrides)

    def option_names(self) -> set[str]:
        return {f.name for f in dataclasses.fields(self.config)}

    def derived_options(self, rollout: RolloutShape) -> dict:
        """The options that follow ``rollout`` (a :class:`RolloutShape`, or anything with its
        fields, such as the experiment's rollout section), with their values for it."""
        out = {}
        if "temperature" in self.option_names():
            out["temperature"] = float(rollout.temperature)
        if self.derive is not None:
            out.update(self.derive(rollout))
        return out

    def configure(self, options: dict | None = None, *,
                  rollout: RolloutShape = RolloutShape()) -> "Method":
        """This method configured for one experiment: ``options`` (explicit values; a None value
        of a derived option means "follow the rollout"), then :meth:`derived_options` for the
        derived options not given; ``group_size`` set from the config (HDL trees) or the rollout
        (plus the method's :attr:`extra_rows`).

        Raises:
          TypeError for an unknown option; ValueError for a bad value, or a group size or loss
          temperature that disagrees with the rollout's.
        """
        options = {k: tuple(v) if isinstance(v, list) else v for k, v in (options or {}).items()}
        derived = self.derived_options(rollout)
        for name, value in derived.items():
            if options.get(name) is None:
                options[name] = value
        config = self.make_config(**options)
        check_temperature(config, rollout.temperature, "rollout.temperature")
        if self.rollout == "hdl_tree":
            size = config.group_size
            if rollout.group_size not in (None, size):
                raise ValueError(f"rollout.group_size={rollout.group_size} but an HDL tree has "
                                 f"{size} rows; set rollout.group_size=None")
        else:
            size = rollout.group_size
            if size is None:
                raise ValueError(f"rollout.group_size must be set for method {self.name!r}")
            if getattr(config, "group_size", size) != size:
                raise ValueError(f"method_config.group_size={config.group_size} differs from "
                                 f"rollout.group_size={size}: the loss would split the batch into "
                                 f"other groups than the rollout sampled")
            if self.extra_rows is not None:
                size += self.extra_rows(config)
        return dataclasses.replace(self, config=config, group_size=size)

    def update(self, state, metrics: dict):
        """One state update at a rollout boundary (:attr:`update_state` with this config)."""
        return self.update_state(state, metrics, self.config)


def check_temperature(config, sampling_temperature: float, where: str) -> None:
    """Raise unless a loss temperature (if the config has one) equals the sampling temperature:
    ``logp_old`` is the policy's log-prob at the sampling temperature, the ratio's numerator the
    loss's."""
    temperature = getattr(config, "temperature", None)
    if temperature is not None and temperature != sampling_temperature:
        raise ValueError(f"method_config.temperature={temperature} differs from {where}="
                         f"{sampling_temperature}: logp_old would not match the policy log-probs")


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


TEACHERS = ("self", "reference", "external")
"""Whose weights run a teacher context: the trained params under ``stop_gradient`` (``"self"``),
the ``reference`` model (a frozen initial policy or an EMA of the params, per the train state), or
an ``"external"`` teacher (another checkpoint, ``teacher.model.name``, loaded beside the policy and
frozen; the loss gets it as ``external_teacher``)."""


def teacher_model(name: str, teacher: str, model, reference, external=None):
    """The model that runs ``name``'s teacher contexts for the config value ``teacher``."""
    if teacher == "self":
        return model
    if teacher == "external":
        if external is None:
            raise ValueError(f"method {name!r} with teacher='external' needs the external teacher "
                             f"model: pass external_teacher= (an experiment loads it from "
                             f"teacher.model.name)")
        return external
    require_reference(name, reference, "teacher='reference'")
    return reference


def teacher_hidden(name: str, teacher: str, model, reference, batch, context: str = "teacher", *,
                   row_masked: bool = False, external=None):
    """The frozen teacher side ``(hidden [B, T, D], unembed [D, V])``: the batch's ``context``
    run by :func:`teacher_model`'s weights under ``stop_gradient``.

    ``row_masked``: the caller leaves out the rows whose ``{context}_row_mask`` is 0
    (:func:`hindsight.methods.forward.context_mask`); a method that does not (its context exists
    for every row) refuses a batch that carries one, rather than train on placeholders."""
    if not row_masked and context_key(context, "row_mask") in batch:
        raise ValueError(f"method {name!r} reads the {context!r} context of every row, but the "
                         f"batch carries {context_key(context, 'row_mask')!r} (rows without one); "
                         f"only methods with a `teacher_context` recipe leave such rows out")
    return context_hidden(teacher_model(name, teacher, model, reference, external), batch,
                          context, frozen=True)


class StepState(NamedTuple):
    """The state of a method with a schedule (RLSD's ``lam``, β-OPSD's ``w``): rollouts trained
    on so far (int32 scalar), checkpointed with the train state, so a resumed run continues the
    schedule exactly."""
    step: Any


def init_step_state(config) -> StepState:
    return StepState(step=jnp.zeros((), jnp.int32))


def advance_step(state: StepState, metrics: dict, config) -> StepState:
    """One rollout trained on: the schedule advances a step (``update_state``)."""
    return StepState(step=state.step + 1)


def require_step_state(name: str, method_state) -> None:
    if not isinstance(method_state, StepState):
        raise ValueError(f"method {name!r} needs its state (its schedule's step): pass "
                         f"method_state=init_state(config), got {type(method_state).__name__}")


def require_row_advantages(name: str, batch) -> None:
    """Raise unless ``batch["advantages"]`` is per row (``[B]``): the method modulates it."""
    if jnp.ndim(batch["advantages"]) != 1:
        raise ValueError(f"method {name!r} modulates a per-row advantage: batch['advantages'] "
                         f"must be [B], got shape {jnp.shape(batch['advantages'])}")
