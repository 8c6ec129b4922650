"""Preparations: work a method does once per run, before its first step, with the frozen initial
policy (Neuron-OPSD's data selection), and the task view the run then trains on.

A method names one in its record (:attr:`hindsight.methods.Method.prepare`); the training loop
calls :func:`prepare_task` once, after loading the policy. The first time, the preparation's
``compute`` runs and its result (JSON-able) is written to ``<workdir>/prepare/<name>.json``; a
resumed run reads that file instead, so the work is not redone and the run trains on exactly the
same examples. ``apply`` turns the result into the task the run trains on, typically a
:class:`TrainSubset`: the selected training examples, each carrying in
:attr:`~hindsight.tasks.Example.extras` what the method's teacher-context parts read.

    @PREPARATIONS.register("my_selection")
    def my_selection():
        return Preparation(compute=..., apply=...)
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence

import jax

from hindsight import storage
from hindsight._registry import Registry
from hindsight.rollout.collect import RolloutConfig
from hindsight.sampling import SamplingParams
from hindsight.tasks import Example, seeded_subset

PREPARATIONS = Registry("preparation")
"""Preparations by name, each registered as a factory of its :class:`Preparation`."""


@dataclasses.dataclass(frozen=True)
class PrepareInputs:
    """What a preparation reads besides the task, the policy and the method config.

    Attributes:
      seed: the run's seed (pools and keys derive from it).
      sampling: the rollout's sampling parameters (``max_new_tokens``, temperature, ...).
      rollout: engine slots, chunk steps and the contexts' wording.
      prompts_per_step: prompts of a training step (a selection must keep at least as many).
    """
    seed: int
    sampling: SamplingParams
    rollout: RolloutConfig = RolloutConfig()
    prompts_per_step: int = 1


@dataclasses.dataclass(frozen=True)
class Preparation:
    """A registered preparation.

    Attributes:
      compute: ``compute(task, model, tokenizer, *, config, inputs: PrepareInputs) -> dict`` (a
        JSON-able result, everything ``apply`` needs), run once per run.
      apply: ``apply(task, result, *, config, inputs: PrepareInputs) -> task``: the task the run
        trains on, a pure function of the result (the same on a fresh and a resumed run).
    """
    compute: Callable
    apply: Callable


class TrainSubset:
    """``task`` whose training examples are ``examples`` (a fixed list, read in epochs by the
    loop: :func:`hindsight.train.loop.train_examples`); evaluation splits, verification and every
    other attribute are the task's own."""

    def __init__(self, task, examples: Sequence[Example]):
        if not examples:
            raise ValueError(f"a training subset of task {task.name!r} needs at least one example")
        self.task, self._train = task, list(examples)

    @property
    def name(self) -> str:
        return self.task.name

    def split_examples(self, split: str) -> list[Example]:
        if split == "train":
            return list(self._train)
        return self.task.split_examples(split)

    def examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        if split == "train":
            return seeded_subset(self._train, split=split, count=count, seed=seed,
                                 where=f"the training subset of task {self.task.name!r}")
        return self.task.examples(split=split, count=count, seed=seed)

    def verify(self, example: Example, response: str):
        return self.task.verify(example, response)

    def __getattr__(self, name: str):
        # reward_range, branch_mask, ...: whatever else the task offers (`task` itself is
        # looked up here only before __init__ set it, e.g. while unpickling)
        if name == "task":
            raise AttributeError(name)
        return getattr(self.task, name)


def check_preparation(method) -> None:
    """Raise ValueError if ``method.prepare`` names no registered preparation."""
    if method.prepare is not None:
        PREPARATIONS.get(method.prepare)


def result_path(workdir: str, name: str):
    """Where preparation ``name``'s result of the run in ``workdir`` is kept (an ``epath.Path``)."""
    return storage.run_path(workdir) / "prepare" / f"{name}.json"


def prepare_task(method, task, model, tokenizer, *, inputs: PrepareInputs,
                 workdir: str | None = None):
    """The task ``method`` trains on: ``task`` itself for a method without a preparation; else
    its preparation's ``apply`` to the result saved in ``workdir`` or, when there is none yet (or
    no ``workdir``), to a freshly computed one, then saved (by the primary process).

    Args:
      method: a configured :class:`~hindsight.methods.Method`.
      task, model, tokenizer: the run's task and its frozen initial policy.
      inputs: :class:`PrepareInputs`.
      workdir: the run directory (None: nothing saved or read).
    """
    if method.prepare is None:
        return task
    prep = PREPARATIONS.get(method.prepare)()
    path = None if workdir is None else result_path(workdir, method.prepare)
    if path is not None and path.exists():
        result = storage.read_json(path)
    else:
        result = prep.compute(task, model, tokenizer, config=method.config, inputs=inputs)
        # the same round trip a resumed run makes, so both apply exactly the same values
        result = json.loads(json.dumps(result))
        if path is not None and jax.process_index() == 0:
            storage.write_json(path, result)  # whole or nothing: a killed run leaves no partial file
    return prep.apply(task, result, config=method.config, inputs=inputs)
