"""What a task is: prompts from a seeded generator plus a verifier that returns a reward and feedback.

The hindsight context of HDL and the privileged contexts of self-distillation need *words* about what
went wrong, not just a number, so every verdict carries a short textual feedback.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Protocol

SPLITS = ("train", "test")


@dataclasses.dataclass(frozen=True)
class Example:
    """One problem: the user message, the reference answer (for privileged contexts) and task data."""
    prompt: str
    answer: str
    data: tuple = ()


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Verifier output: ``reward`` in [0, 1] and a one-line ``feedback`` for the hindsight context."""
    reward: float
    feedback: str
    extracted: str | None = None


class Task(Protocol):
    name: str

    def examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        """``count`` examples of ``split`` ("train" or "test", disjoint), deterministic in ``seed``."""

    def verify(self, example: Example, response: str) -> Verdict:
        """Score a model response to ``example``."""


_REGISTRY: dict[str, Callable[[], Task]] = {}


def register(name: str):
    """Class decorator adding a task factory to the registry under ``name``."""
    def deco(cls):
        if name in _REGISTRY:
            raise ValueError(f"task {name!r} is already registered")
        _REGISTRY[name] = cls
        return cls
    return deco


def get_task(name: str, **kwargs) -> Task:
    """Instantiate a registered task; unknown names list what is available."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown task {name!r}; available: {sorted(_REGISTRY)}")
    return _REGISTRY[name](**kwargs)


def task_names() -> list[str]:
    return sorted(_REGISTRY)
