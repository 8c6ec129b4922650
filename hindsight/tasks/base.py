"""What a task is: prompts from a seeded generator plus a verifier that returns a reward and feedback.

The hindsight context of HDL and the privileged contexts of self-distillation need *words* about what
went wrong, not just a number, so every verdict carries a short textual feedback.
"""
from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Sequence
from typing import Protocol

from hindsight._registry import Registry
from hindsight._validation import check_choice

SPLITS = ("train", "test")


@dataclasses.dataclass(frozen=True)
class Example:
    """One problem: the user message, the reference answer (for privileged contexts) and task data.

    ``data`` is a tuple: the synthetic tasks keep their items in it; record-backed tasks (files,
    HumanEval) keep ``(field, value)`` pairs, read back with :meth:`field`. ``extras`` holds
    ``(name, value)`` pairs a method's preparation attached (:mod:`hindsight.rollout.prepare`:
    Neuron-OPSD's ``few_shot`` demonstrations), read by teacher-context parts with :meth:`extra`;
    verifiers ignore them."""
    prompt: str
    answer: str
    data: tuple = ()
    extras: tuple = ()

    def extra(self, name: str, default=None):
        """The value of ``(name, value)`` in ``extras``, or ``default``."""
        for key, value in self.extras:
            if key == name:
                return value
        return default

    def field(self, name: str):
        """The value of ``(name, value)`` in ``data`` (record-backed tasks); KeyError names it."""
        for item in self.data:
            if isinstance(item, tuple) and len(item) == 2 and item[0] == name:
                return item[1]
        raise KeyError(f"example has no field {name!r} in its data")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Verifier output: ``reward`` in [0, 1] and a one-line ``feedback`` for the hindsight context."""
    reward: float
    feedback: str
    extracted: str | None = None


DEFAULT_REWARD_RANGE = (0.0, 1.0)
SUCCESS_REWARD = 0.5
"""A response succeeded when its reward is at least this (SDPO's ``success_reward_threshold``):
the successful-peer teacher contexts and H2SD's routing read it."""


class Task(Protocol):
    """A task. Optional attributes: ``reward_range`` (``(low, high)``, default
    :data:`DEFAULT_REWARD_RANGE`: rewards outside it are an error) and, for tasks backed by a fixed
    list of problems, ``split_examples(split) -> list[Example]`` (every problem of ``split`` in
    file order; the training loop then draws steps' prompts from it in epochs, see
    :func:`hindsight.train.loop.train_examples`), and ``branch_mask(example, pieces) ->
    list[bool]`` (per response token, its decoded text in ``pieces``: whether HDL may branch there;
    the math tasks forbid the final answer, :func:`hindsight.tasks.math.branch_mask_before_answer`).
    """
    name: str

    def examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        """``count`` examples of ``split`` ("train" or "test", disjoint), deterministic in ``seed``."""

    def verify(self, example: Example, response: str) -> Verdict:
        """Score a model response to ``example``."""


def reward_range(task) -> tuple[float, float]:
    """``task.reward_range`` or the default ``(0, 1)``."""
    low, high = getattr(task, "reward_range", DEFAULT_REWARD_RANGE)
    return float(low), float(high)


def seeded_subset(items: Sequence[Example], *, split: str, count: int, seed: int,
                  where: str) -> list[Example]:
    """``count`` of ``items`` in a seeded order (the first ``count`` of a permutation drawn from
    ``seed``): what ``examples()`` returns for a record-backed task. ``where`` names the task in
    errors."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"`count` must be a non-negative int, got {count!r}")
    if count > len(items):
        raise ValueError(f"{where}: asked for {count} {split} examples but the split holds "
                         f"{len(items)}")
    order = random.Random(f"{seed}:{split}").sample(range(len(items)), len(items))
    return [items[i] for i in order[:count]]


def in_test_split(canonical: str) -> bool:
    """Whether a generated item belongs to the ``test`` split: a stable hash of its canonical form
    is 0 mod 5, so the splits are disjoint whatever the seeds."""
    return int(hashlib.sha256(canonical.encode()).hexdigest(), 16) % 5 == 0


def draw_examples(make, *, split: str, count: int, seed: int, max_tries_per_item: int = 1000) -> list[Example]:
    """Draw ``count`` examples of ``split`` from ``make(rng) -> (canonical, Example)``."""
    check_choice("split", split, SPLITS)
    if not isinstance(count, int) or count < 0:
        raise ValueError(f"`count` must be a non-negative int, got {count!r}")
    rng = random.Random(f"{seed}:{split}")
    out = []
    for _ in range(count * max_tries_per_item):
        if len(out) == count:
            break
        canonical, example = make(rng)
        if in_test_split(canonical) == (split == "test"):
            out.append(example)
    if len(out) < count:
        raise ValueError(f"could only draw {len(out)} of {count} {split} examples; the item space is too small")
    return out


_TASKS = Registry("task")


def register(name: str):
    """Class decorator adding a task factory to the registry under ``name``."""
    return _TASKS.register(name)


def get_task(name: str, **kwargs) -> Task:
    """Instantiate a registered task; unknown names list what is available."""
    return _TASKS.make(name, **kwargs)


def task_names() -> list[str]:
    return _TASKS.names()
