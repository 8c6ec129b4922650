"""Shared pieces of every experiment config: the full key set with defaults, and the variants.

A method's file is ``get_config(variant)`` = :func:`experiment` (every key of
:class:`hindsight.train.experiment.ExperimentConfig`, ``method_config`` filled with the method's
spec defaults, so any key can be overridden from the command line) + the method's own settings +
one of :data:`VARIANTS`::

    python -m experiments.run --config=configs/hdl.py:smollm2-reverse --config.train.num_steps=5

Variants (the part after ``:``):
  * ``smollm2-<task>`` (default ``smollm2-reverse``): SmolLM2-135M-Instruct on a synthetic task,
    the documented longer run (tens of steps; held-out reward every 10 steps).
  * ``demo``: what ``make demo`` runs per method: a few steps, minutes on 2 CPU cores.
  * ``tiny``: the 2-layer random ``tiny-random`` model, seconds per step (tests, smoke runs).
"""
from __future__ import annotations

import dataclasses
import types
import typing

import ml_collections
from ml_collections import config_dict

from hindsight.methods import get_method
from hindsight.train.experiment import ExperimentConfig

VARIANTS = ("smollm2-<task>", "demo", "tiny")
DEFAULT_VARIANT = "smollm2-reverse"


def _optional_type(hint):
    """``int | None`` -> ``int`` (for a typed placeholder), else None."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return None


def _as_config(obj) -> ml_collections.ConfigDict:
    """A dataclass instance -> ConfigDict; ``None`` fields become typed placeholders so they can
    be set from the command line."""
    hints = typing.get_type_hints(type(obj))
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out[f.name] = _as_config(value)
        elif value is None and _optional_type(hints[f.name]) is not None:
            out[f.name] = config_dict.placeholder(_optional_type(hints[f.name]))
        else:
            out[f.name] = value
    return ml_collections.ConfigDict(out)


def experiment(method: str) -> ml_collections.ConfigDict:
    """Every key with its default for ``method``; the method's loss temperature becomes the
    rollout temperature (they must agree, so it is set in one place)."""
    m = get_method(method)
    config = _as_config(ExperimentConfig(method=method))
    options = _as_config(m.config).to_dict()
    config.rollout.temperature = options.pop("temperature")
    config.method_config = ml_collections.ConfigDict(options)
    return config


def apply_variant(config: ml_collections.ConfigDict,
                  variant: str | None) -> ml_collections.ConfigDict:
    """Set the model / task / sizes of ``variant`` (see the module doc)."""
    variant = variant or DEFAULT_VARIANT
    hdl = get_method(config.method).rollout == "hdl_tree"
    if variant == "tiny":
        config.model.name = "tiny-random"
        config.task.name = "reverse"
        config.rollout.update(prompts_per_step=2, max_new_tokens=24, slots=16,
                              reflection_max_tokens=16, hindsight_reflection_tokens=16)
        if not hdl:
            config.rollout.group_size = 4
        config.train.update(num_steps=3, save_every=2)
        config.train.optim.update(name="sgd", learning_rate=0.1)
        config.eval.update(num_examples=4, every=0)
        if hdl:
            config.method_config.update(tail_guard=2, min_gap_floor=2)
    elif variant == "demo":
        config.task.name = "reverse"
        config.rollout.update(prompts_per_step=2, max_new_tokens=64, slots=32,
                              reflection_max_tokens=32, hindsight_reflection_tokens=32)
        config.train.update(num_steps=4, save_every=4)
        config.train.optim.update(learning_rate=1e-5)
        config.eval.update(num_examples=16, every=0)
    elif variant.startswith("smollm2-"):
        config.task.name = variant[len("smollm2-"):]
        config.rollout.update(prompts_per_step=4, max_new_tokens=96, slots=64,
                              reflection_max_tokens=64, hindsight_reflection_tokens=64)
        config.train.update(num_steps=40, save_every=10)
        config.train.optim.update(learning_rate=5e-6)
        config.eval.update(num_examples=32, every=10)
    else:
        raise ValueError(f"unknown config variant {variant!r}; known: {list(VARIANTS)}")
    if hdl:
        config.rollout.group_size = None
    return config


def method_file(method: str, variant: str | None) -> ml_collections.ConfigDict:
    """The start of every ``configs/<method>.py``: the method's keys, then the variant."""
    return apply_variant(experiment(method), variant)
