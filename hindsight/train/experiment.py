"""An experiment's configuration: the schema the launcher reads from ``configs/<method>.py``.

A config file's ``get_config()`` returns a nested ``ml_collections.ConfigDict`` (or plain dicts);
:func:`experiment_config` turns it into the frozen :class:`ExperimentConfig`, rejecting every
unknown key by its dotted name and validating values before anything is loaded or compiled::

    method            registry name ("grpo", "hdl", ...)
    method_config     overrides of the method's config dataclass (its fields; spec defaults)
    model.*           embedded model name or path, dtype, layer scan, remat
    task.*            task registry name and its constructor options
    rollout.*         prompts per step, group size, sampling parameters, engine slots
    train.*           steps, micro-batches, reference copy, optimizer, mesh, checkpoints
    eval.*            held-out reward: how often, how many examples, temperature
    seed              every random draw of the run derives from it

The sections are small frozen dataclasses; their fields and defaults are the documentation.
"""
from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Mapping

from hindsight._validation import check_choice
from hindsight.train.mesh import MeshConfig
from hindsight.train.optim import OptimConfig

DTYPES = ("float32", "bfloat16")
REFERENCE_CHOICES = ("auto", "none", "frozen", "ema")


class ConfigError(ValueError):
    """A bad experiment config or run directory: raised before anything is loaded or compiled."""


def _positive_int(where: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{where} must be a positive int, got {v!r}")


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """``name``: a registry name (``hindsight.models.load``), an HF folder, a ``.gguf`` path, or
    ``"tiny-random"`` (a 2-layer random decoder over a 128-id character tokenizer, for tests).
    ``dtype``: activation dtype (parameters stay float32). ``remat``: rematerialise each layer in
    the backward pass (the train step's activation memory drops to one layer's)."""
    name: str = "smollm2-135m-instruct"
    dtype: str = "float32"
    scan_layers: bool = True
    remat: bool = True

    def __post_init__(self):
        check_choice("model.dtype", self.dtype, DTYPES)


@dataclasses.dataclass(frozen=True)
class TaskSection:
    """``name``: a :func:`hindsight.tasks.get_task` name; ``options``: its keyword arguments."""
    name: str = "reverse"
    options: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RolloutSection:
    """What one training step samples.

    ``prompts_per_step``: ``P`` groups per step; ``group_size``: ``G`` rows per prompt (HDL: its
    tree size, ``num_roots * (1 + sum(counts))``, is used and this must equal it or be None).
    ``max_new_tokens`` is the response width ``T``; ``temperature`` must equal the method's loss
    temperature (checked). ``slots``: engine slot batch (None: ``min(rows, 64)``).
    ``reflection_max_tokens`` / ``hindsight_reflection_tokens``: HDL's reflection caps.
    """
    prompts_per_step: int = 2
    group_size: int | None = 16
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    slots: int | None = None
    chunk_steps: int = 16
    reflection_max_tokens: int = 256
    hindsight_reflection_tokens: int = 256

    def __post_init__(self):
        for name in ("prompts_per_step", "max_new_tokens", "chunk_steps",
                     "reflection_max_tokens", "hindsight_reflection_tokens"):
            _positive_int(f"rollout.{name}", getattr(self, name))
        for name in ("group_size", "slots"):
            if getattr(self, name) is not None:
                _positive_int(f"rollout.{name}", getattr(self, name))


@dataclasses.dataclass(frozen=True)
class TrainSection:
    """``num_steps``: optimizer steps (one rollout each). ``reference``: ``"auto"`` keeps a frozen
    copy of the initial params when the method's config needs one and none otherwise; ``"none"``,
    ``"frozen"``, ``"ema"`` (decay ``ema_decay``) force it. ``optim`` and ``mesh`` are
    :class:`~hindsight.train.OptimConfig` and :class:`~hindsight.train.MeshConfig`. Checkpoints every ``save_every`` steps
    (and at the end, and on Ctrl-C), the newest ``max_to_keep`` kept."""
    num_steps: int = 10
    num_microbatches: int = 1
    reference: str = "auto"
    ema_decay: float = 0.99
    optim: OptimConfig = OptimConfig()
    mesh: MeshConfig = MeshConfig()
    save_every: int = 10
    max_to_keep: int = 2

    def __post_init__(self):
        for name in ("num_steps", "num_microbatches", "save_every", "max_to_keep"):
            _positive_int(f"train.{name}", getattr(self, name))
        check_choice("train.reference", self.reference, REFERENCE_CHOICES)


@dataclasses.dataclass(frozen=True)
class EvalSection:
    """Held-out reward: ``num_examples`` of the task's ``split`` split, one sample each at
    ``temperature`` (0 = greedy), before the first step and every ``every`` steps after it
    (0: only before the first and after the last step)."""
    every: int = 0
    num_examples: int = 16
    temperature: float = 0.0
    split: str = "test"

    def __post_init__(self):
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 0:
            raise ValueError(f"eval.every must be an int >= 0, got {self.every!r}")
        if self.num_examples != 0:
            _positive_int("eval.num_examples", self.num_examples)


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    method: str = "grpo"
    method_config: dict = dataclasses.field(default_factory=dict)
    model: ModelSection = ModelSection()
    task: TaskSection = TaskSection()
    rollout: RolloutSection = RolloutSection()
    train: TrainSection = TrainSection()
    eval: EvalSection = EvalSection()
    seed: int = 0
    num_sample_texts: int = 4

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# Keys a resumed run may change: they do not alter the state, the data or the updates.
RESUMABLE_KEYS = ("train.num_steps", "train.save_every", "train.max_to_keep", "eval.every",
                  "eval.num_examples", "num_sample_texts")


def _plain(value):
    """ConfigDict / FrozenConfigDict / tuple -> plain dicts and lists (JSON-able)."""
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _build(cls, values: Mapping, prefix: str):
    """Construct dataclass ``cls`` from ``values``, recursing into dataclass-typed fields."""
    if not isinstance(values, Mapping):
        raise TypeError(f"config section {prefix.rstrip('.') or '<root>'!r} must be a dict, got "
                        f"{type(values).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"unknown config key(s) {[prefix + u for u in unknown]}; valid keys "
                         f"here: {[prefix + f for f in fields]}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in values.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, value, f"{prefix}{name}.")
        else:
            kwargs[name] = value
    return cls(**kwargs)


def experiment_config(config) -> ExperimentConfig:
    """Validate a config (ConfigDict or nested dicts) into an :class:`ExperimentConfig`.

    Raises:
      ConfigError naming the dotted key for an unknown key or a bad value, an unknown method or
      task name (listing the registered ones), or a method option its config does not have.
    """
    try:
        return _experiment_config(config)
    except ConfigError:
        raise
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(e.args[0] if e.args else str(e)) from e


def _experiment_config(config) -> ExperimentConfig:
    from hindsight.methods import get_method
    from hindsight.tasks import task_names

    values = _plain(config)
    exp = _build(ExperimentConfig, values, "")
    method = get_method(exp.method)
    method_config(exp)  # unknown or invalid method options fail here
    if exp.task.name not in task_names():
        raise KeyError(f"unknown task {exp.task.name!r} (task.name); registered tasks: "
                       f"{task_names()}")
    if method.rollout == "hdl_tree":
        size = method_config(exp).group_size
        if exp.rollout.group_size not in (None, size):
            raise ValueError(f"rollout.group_size={exp.rollout.group_size} but an HDL tree has "
                             f"{size} rows; set rollout.group_size=None")
    elif exp.rollout.group_size is None:
        raise ValueError(f"rollout.group_size must be set for method {exp.method!r}")
    elif getattr(method_config(exp), "group_size", exp.rollout.group_size) != \
            exp.rollout.group_size:
        raise ValueError(f"method_config.group_size={method_config(exp).group_size} differs from "
                         f"rollout.group_size={exp.rollout.group_size}: the loss would split the "
                         f"batch into other groups than the rollout sampled")
    return exp


def method_config(exp: ExperimentConfig):
    """The method's config dataclass with ``exp.method_config`` applied; list values become
    tuples (config files and JSON hold lists, the dataclasses tuples). The loss temperature
    follows ``rollout.temperature`` unless set explicitly (they must agree)."""
    from hindsight.methods import get_method

    method = get_method(exp.method)
    overrides = {k: tuple(v) if isinstance(v, list) else v for k, v in exp.method_config.items()}
    fields = {f.name for f in dataclasses.fields(method.config)}
    if "temperature" in fields:
        overrides.setdefault("temperature", exp.rollout.temperature)
    try:
        return method.make_config(**overrides)
    except TypeError as e:
        raise TypeError(f"method_config: {e}") from None


def group_size(exp: ExperimentConfig) -> int:
    """Rows per prompt: the HDL tree size or ``rollout.group_size``."""
    from hindsight.methods import get_method

    if get_method(exp.method).rollout == "hdl_tree":
        return method_config(exp).group_size
    return exp.rollout.group_size


def flatten(d: Mapping, prefix: str = "") -> dict:
    """Nested dict -> ``{"a.b.c": value}``."""
    out = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and v and k != "options" and k != "method_config":
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_differences(saved: Mapping, current: Mapping) -> list[str]:
    """Dotted keys whose values differ between two resolved configs (``RESUMABLE_KEYS`` ignored),
    compared as JSON so tuples and lists are equal."""
    a, b = flatten(saved), flatten(current)
    norm = lambda v: json.dumps(v, sort_keys=True)
    keys = sorted((set(a) | set(b)) - set(RESUMABLE_KEYS))
    return [k for k in keys if norm(a.get(k)) != norm(b.get(k))]
