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
import re

from hindsight.envs import EnvSpec
from hindsight.envs.textgame import ROOMS
from hindsight.tasks.base import Example, Verdict, draw_examples, register


class EpisodeTask:
    """Base of the episode tasks.

    Attributes:
      name: the registry name.
      env: the environment every episode runs in.
      stop_strings: strings that end a turn (besides the tokenizer's end of turn).
      action_tag: the tag an action is written in.
      reward_range: the range of an episode's return.
    """
    name: str
    env: EnvSpec
    stop_strings: tuple[str, ...] = ("</action>",)
    action_tag: str = "action"
    reward_range = (0.0, 1.0)

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
        last tag counts, as a turn cut by its token cap leaves it), stripped; ``""`` when the turn
        has none, which the environment answers as an invalid action."""
        tag = re.escape(self.action_tag)
        found = re.findall(rf"<{tag}>(.*?)(?:</{tag}>|$)", text, flags=re.S)
        return found[-1].strip() if found else ""

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
