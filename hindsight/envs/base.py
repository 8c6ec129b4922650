"""What an environment is: ``reset(example) -> observation``, ``step(action) -> Step``, and how a
tree method gets back to a state inside an episode (``snapshot`` / ``restore``, or the replay of an
action prefix, which every deterministic environment supports).

Environments are plain Python objects that import nothing heavy (no JAX, no task registry): they
run in worker processes (:class:`hindsight.envs.pool.EnvPool`), created there from an
:class:`EnvSpec` (a registered name and keyword options: data, not code), and an episode starts
from a ``setup`` dict of plain data (the episode task's :meth:`env_setup` of an example, e.g.
``{"task": "boil", "variation": 3}``), so nothing but JSON-like values crosses into a worker.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Protocol

from hindsight._registry import Registry



@dataclasses.dataclass(frozen=True)
class Step:
    """What one environment step returns.

    Attributes:
      observation: the text shown to the policy as the next user turn.
      reward: this step's reward (an episode's return is their sum; the ScienceWorld score is
        reported as rewards that add up to the final score / 100).
      done: the episode is over (goal reached, failed, or the environment's own step limit).
      info: JSON-serialisable extras: ``feedback`` (a short verdict for hindsight contexts),
        ``valid`` (valid actions, where the environment lists them), ``score``.
    """
    observation: str
    reward: float = 0.0
    done: bool = False
    info: dict = dataclasses.field(default_factory=dict)


class Env(Protocol):
    """An environment instance, owned by one episode at a time.

    Optional: ``snapshot() -> state`` (picklable) and ``restore(state)``; without them the pool
    returns to a state by replaying the episode's action prefix after ``reset``, which needs
    ``deterministic = True``.
    """
    deterministic: bool

    def reset(self, setup: dict) -> str:
        """Start the episode described by ``setup``; returns the first observation."""

    def step(self, action: str) -> Step:
        """Apply one action (the parsed action text; an unparseable turn arrives as ``""``)."""

    def close(self) -> None:
        """Release the environment's resources (processes, files)."""


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """A registered environment ``name`` and the JSON-able keyword ``options`` of its factory (plain
    data, so it crosses into the worker processes and into ``config.json``). ``module``: a module
    the worker imports first, which registers ``name`` (an environment of your own, outside
    :mod:`hindsight.envs`)."""
    name: str
    options: tuple = ()   # (key, value) pairs, hashable
    module: str | None = None

    @classmethod
    def of(cls, name: str, *, module: str | None = None, **options) -> "EnvSpec":
        return cls(name, tuple(sorted(options.items())), module)

    def make(self) -> Env:
        if self.module:
            importlib.import_module(self.module)
        return make_env(self.name, **dict(self.options))


_ENVS = Registry("environment")


def register_env(name: str):
    """Class decorator adding an environment factory to the registry under ``name``."""
    return _ENVS.register(name)


def make_env(name: str, **options) -> Env:
    """Instantiate a registered environment; unknown names list what is available."""
    return _ENVS.make(name, **options)


def env_names() -> list[str]:
    return _ENVS.names()
