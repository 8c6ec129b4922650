"""ScienceWorld (Wang et al., 2022) through the ``scienceworld`` package: a text simulator of
elementary-science tasks (boil water, find a living thing, ...), one JVM per environment (about
190 MB, created in about 1.3 s; a step takes 0.03-0.13 s).

``setup``: ``{"task": name, "variation": index}``. The first observation is the task
description, what the agent sees, and the action templates (``open OBJ``, ``go to LOC``, ...),
as ScienceWorld's own agents are prompted; an action the game does not know answers with
ScienceWorld's message and up to :data:`VALID_SHOWN` of the valid actions. Reward: the gain of
the game's score, clipped below at 0, over 100, so the episode's return is its best-reached score
over 100, in [0, 1] (some tasks start with a few points, which the first step's reward includes; a
failed task, score -100, adds nothing). ``info``: ``score``, ``feedback`` (for HDL's
hindsight context: the score, whether the task was completed), ``valid`` (the valid actions).
"""
from __future__ import annotations

from hindsight.envs.base import Step, register_env

VALID_SHOWN = 30
"""Valid actions listed after an invalid one (ScienceWorld lists hundreds in a room)."""


def gold_path(task: str, variation: int, simplifications: str = "easy") -> list[str]:
    """The simulator's gold action sequence for ``(task, variation)`` (starts a JVM)."""
    from scienceworld import ScienceWorldEnv
    env = ScienceWorldEnv("", envStepLimit=100)
    try:
        env.load(task, variation, simplifications, generateGoldPath=True)
        return list(env.get_gold_action_sequence())
    finally:
        env.close()


@register_env("scienceworld")
class ScienceWorld:
    """One ScienceWorld JVM, reloaded for each episode's ``(task, variation)``.

    Args:
      step_limit: the simulator's own step limit (``envStepLimit``).
      simplifications: ScienceWorld's simplification string (default ``"easy"``: teleporting,
        open doors, no electrical action, self-watering pots, as the CPU-sized setting).
    """

    deterministic = True

    def __init__(self, *, step_limit: int = 100, simplifications: str = "easy"):
        from scienceworld import ScienceWorldEnv  # imported in the worker only
        self.env = ScienceWorldEnv("", envStepLimit=int(step_limit))
        self.simplifications = simplifications
        self.loaded = None
        self.score = 0.0

    def reset(self, setup: dict) -> str:
        task, variation = str(setup["task"]), int(setup["variation"])
        if (task, variation) != self.loaded:
            names = self.env.get_task_names()
            if task not in names:
                raise ValueError(f"unknown ScienceWorld task {task!r}; tasks: {names}")
            self.env.load(task, variation, self.simplifications, generateGoldPath=False)
            self.loaded = (task, variation)
        obs, info = self.env.reset()
        self.score = 0.0
        templates = ", ".join(sorted(self.env.get_possible_actions()))
        return (f"Task: {self.env.get_task_description().strip()}\n\n{info['look'].strip()}\n\n"
                f"Actions take the forms: {templates}.")

    def step(self, action: str) -> Step:
        obs, _, done, info = self.env.step(action.strip() or "look around")
        score = float(info["score"])
        reward = (max(score, 0.0) - max(self.score, 0.0)) / 100.0
        self.score = max(self.score, score)
        valid = list(info.get("valid", []))
        text = obs.strip()
        if text.startswith("No known action matches"):
            text += " Valid actions include: " + ", ".join(valid[:VALID_SHOWN]) + "."
        won = score >= 100
        feedback = ("completed the task" if won else
                    "failed the task" if score < 0 else f"score {max(score, 0):g} of 100")
        return Step(text, max(reward, 0.0), bool(done), {"score": score, "feedback": feedback,
                                                         "valid": valid})

    def close(self) -> None:
        self.env.close()
