"""Episode tasks: examples played over many turns in an environment (:mod:`hindsight.envs`).

An episode task is a task (it is in the task registry and draws seeded, disjoint train / test
examples) whose reward comes from the environment instead of a verifier: the policy's first turn
is the task's instructions followed by the environment's first observation, each turn ends at an
action stop string (``</action>``) or the end of the assistant's turn, the action inside the last
``<action>...</action>`` is sent to the environment, and its observation comes back as the next user
turn. :func:`hindsight.rollout.episodes.sample_episodes` runs them.
"""
from __future__ import annotations

import json
import os
import re

import numpy as np

from hindsight.envs import EnvSpec
from hindsight.envs.textgame import ROOMS
from hindsight._validation import check_choice
from hindsight.tasks.base import (Example, Verdict, draw_examples, in_test_split, register,
                                  seeded_subset)


class EpisodeTask:
    """Base of the episode tasks.

    Attributes:
      name: the registry name.
      env: the environment every episode runs in.
      stop_strings: strings that end a turn (besides the tokenizer's end of turn).
      action_tag: the tag an action is written in.
      reward_range: the range of an episode's return.
      searches: the task's turns hold search queries (:meth:`search_mask`).
    """
    name: str
    env: EnvSpec
    stop_strings: tuple[str, ...] = ("</action>",)
    action_tag: str = "action"
    reward_range = (0.0, 1.0)
    searches = False

    def setup(self, example: Example) -> dict:
        """The environment's ``reset`` argument for ``example`` (plain data)."""
        return json.loads(example.field("setup"))

    def first_turn(self, example: Example, observation: str) -> str:
        """The policy's first user turn: the instructions, then the first observation."""
        return f"{example.prompt}\n\n{observation}"

    def observation_turn(self, observation: str) -> str:
        """The user turn showing an observation after an action."""
        return observation

    def parse_action(self, text: str) -> str:
        """The action of a turn: the content of its last ``<action>...</action>`` (an unclosed
        last tag counts, as a turn cut by its token cap leaves it), stripped; without a tag, the
        turn's first non-empty line without its final period (small models often answer with a
        bare action); the environment answers anything it does not know as an invalid action."""
        tag = re.escape(self.action_tag)
        found = re.findall(rf"<{tag}>(.*?)(?:</{tag}>|$)", text, flags=re.S)
        if found:
            return found[-1].strip()
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines[0].rstrip(".") if lines else ""

    def search_mask(self, tokenizer, ids) -> np.ndarray | None:
        """``[n]`` bool marking the search-query tokens of an action turn (the batch's
        ``search_mask``, spec ``s_t``), or None for a task without searches."""
        return None

    def verify(self, example: Example, response: str) -> Verdict:
        raise TypeError(f"task {self.name!r} is played as episodes: its reward comes from the "
                        f"environment (hindsight.rollout.episodes), not from verifying one response")


INSTRUCTIONS = ("You are playing a text adventure. Goal: {goal}\n"
                "Each turn, choose one of the valid actions and write it as "
                "<action>ACTION</action>, for example <action>look</action>.")


@register("textgame")
class TextGameTask(EpisodeTask):
    """The tiny key-and-chest game (:class:`hindsight.envs.textgame.TextGame`): 3-4 rooms on a
    corridor, the key and the chest in rooms drawn with the seed. Writes no files, starts no JVM:
    the runner's tests and the ``tiny-textgame`` configs."""
    name = "textgame"

    def __init__(self, *, max_steps: int = 8, min_rooms: int = 3, max_rooms: int = 4):
        if not 2 <= min_rooms <= max_rooms <= len(ROOMS):
            raise ValueError(f"need 2 <= min_rooms <= max_rooms <= {len(ROOMS)}, got "
                             f"{min_rooms}, {max_rooms}")
        self.env = EnvSpec.of("textgame", max_steps=max_steps)
        self.min_rooms, self.max_rooms = min_rooms, max_rooms

    def examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        def make(rng):
            rooms = rng.sample(ROOMS, rng.randint(self.min_rooms, self.max_rooms))
            setup = {"rooms": rooms, "key": rng.randrange(1, len(rooms)),
                     "chest": rng.randrange(len(rooms))}
            text = json.dumps(setup, sort_keys=True)
            goal = "find the key, then open the chest with it."
            return text, Example(prompt=INSTRUCTIONS.format(goal=goal), answer="",
                                 data=(("setup", text),))
        return draw_examples(make, split=split, count=count, seed=seed)


SCIENCEWORLD_TASKS = ("find-non-living-thing", "find-living-thing", "find-animal", "find-plant",
                      "lifespan-longest-lived", "lifespan-shortest-lived",
                      "lifespan-longest-lived-then-shortest-lived",
                      "chemistry-mix-paint-secondary-color")
"""The CPU-sized subset: the ScienceWorld tasks whose gold paths take at most 10 actions (5-10,
with the ``easy`` simplifications; ``boil``, the README's example elsewhere, takes 39)."""

SCIENCEWORLD_INSTRUCTIONS = (
    "You are an agent in ScienceWorld, a text simulation of a house and its surroundings. "
    "Complete the task below. Each turn, write exactly one action as <action>ACTION</action>, "
    "for example <action>look around</action> or <action>go to kitchen</action>.")


@register("scienceworld")
class ScienceWorldTask(EpisodeTask):
    """ScienceWorld episodes (:class:`hindsight.envs.scienceworld.ScienceWorld`) on ``tasks``
    (default :data:`SCIENCEWORLD_TASKS`), train / test examples from the simulator's own train /
    test variations of each task (read once from a short-lived JVM), drawn with the seed."""
    name = "scienceworld"

    def __init__(self, *, tasks: tuple = SCIENCEWORLD_TASKS, step_limit: int = 100,
                 simplifications: str = "easy"):
        if isinstance(tasks, str) or not tasks:
            raise ValueError(f"`tasks` must be a non-empty list of ScienceWorld task names, got {tasks!r}")
        self.tasks = tuple(tasks)
        self.env = EnvSpec.of("scienceworld", step_limit=step_limit, simplifications=simplifications)
        self._variations = None

    def variations(self) -> dict:
        """``{split: [(task, variation), ...]}`` from the simulator (``test`` = its test split)."""
        if self._variations is None:
            from scienceworld import ScienceWorldEnv
            env = ScienceWorldEnv("", envStepLimit=10)
            try:
                known = env.get_task_names()
                out = {"train": [], "test": []}
                for task in self.tasks:
                    if task not in known:
                        raise ValueError(f"unknown ScienceWorld task {task!r}; tasks: {known}")
                    env.load(task, 0, "", generateGoldPath=False)
                    out["train"] += [(task, v) for v in env.get_variations_train()]
                    out["test"] += [(task, v) for v in env.get_variations_test()]
            finally:
                env.close()
            self._variations = out
        return self._variations

    def examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        check_choice("split", split, ("train", "test"))
        items = [Example(prompt=SCIENCEWORLD_INSTRUCTIONS, answer="",
                         data=(("setup", json.dumps({"task": t, "variation": v})),))
                 for t, v in self.variations()[split]]
        return seeded_subset(items, split=split, count=count, seed=seed, where=self.name)


SEARCH_INSTRUCTIONS = (
    "Answer the question. You can search a document collection: write <search>query</search> "
    "and the results come back as <information>...</information>. Search as often as you need, "
    "then give a short final answer as <answer>answer</answer>.")


@register("search_qa")
class SearchQATask(EpisodeTask):
    """Search-augmented QA (:class:`hindsight.envs.search.Search`): questions from a JSONL or
    Parquet file of ``question`` + ``answers`` (a list, or one string), a BM25 index over
    ``corpus``; the shipped files (24 passages, 20 questions, some needing two searches) are the
    defaults. A held-out fifth of the questions (a hash of the question) is the test split.
    :meth:`search_mask` marks the tokens of search queries (the batch's ``search_mask``)."""
    name = "search_qa"
    stop_strings = ("</search>", "</answer>")
    searches = True

    def __init__(self, *, path: str | None = None, corpus: str | None = None, top_k: int = 3,
                 reward: str = "em"):
        from hindsight._records import read_records
        from hindsight.envs.search import CORPUS, DATA
        self.path = path or os.path.join(DATA, "search_qa.jsonl")
        self.env = EnvSpec.of("search", corpus=corpus or CORPUS, top_k=top_k, reward=reward)
        self.items = {"train": [], "test": []}
        for where, record in read_records(self.path):
            question = record.get("question") if isinstance(record, dict) else None
            answers = record.get("answers", record.get("answer")) if isinstance(record, dict) else None
            answers = [answers] if isinstance(answers, str) else answers
            if not isinstance(question, str) or not question.strip():
                raise ValueError(f"{where}: field 'question' must be a non-empty string")
            if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
                raise ValueError(f"{where}: field 'answers' must be a string or a list of strings")
            setup = json.dumps({"question": question, "answers": answers})
            example = Example(prompt=SEARCH_INSTRUCTIONS, answer=answers[0], data=(("setup", setup),))
            self.items["test" if in_test_split(question) else "train"].append(example)

    def examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        check_choice("split", split, ("train", "test"))
        return seeded_subset(self.items[split], split=split, count=count, seed=seed, where=self.path)

    def parse_action(self, text: str) -> str:
        """``"answer:<text>"`` or ``"search:<query>"`` from the tag that closes last (an unclosed
        last tag counts), ``""`` for neither."""
        found = [(m.start(), kind, m.group(1)) for kind in ("search", "answer")
                 for m in re.finditer(rf"<{kind}>(.*?)(?:</{kind}>|$)", text, flags=re.S)]
        if not found:
            return ""
        _, kind, body = max(found)
        return f"{kind}:{body.strip()}"

    def search_mask(self, tokenizer, ids) -> np.ndarray:
        """``[n]`` bool: the tokens of ``ids`` whose text overlaps a ``<search>`` query (``s_t``)."""
        ids = [int(i) for i in ids]
        ends = [len(tokenizer.decode(ids[:i + 1], skip_special_tokens=True)) for i in range(len(ids))]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        spans = [m.span(1) for m in re.finditer(r"<search>(.*?)(?:</search>|$)", text, flags=re.S)]
        starts = [0] + ends[:-1]
        return np.array([any(s < e_tok and s_tok < e for s, e in spans)
                         for s_tok, e_tok in zip(starts, ends)], bool)
