"""Tasks: prompt sources plus verifiers returning a reward in [0, 1] and textual feedback."""
from hindsight.tasks.base import (SPLITS, SUCCESS_REWARD, Example, Task, Verdict, get_task, register, reward_range,
                                  seeded_subset, task_names)
from hindsight.tasks import code, synthetic  # noqa: F401  (register the code and synthetic tasks)
from hindsight.tasks.code import HumanEval, verify_program
from hindsight.tasks import dataset, math  # noqa: F401  (register the dataset and math_word tasks)
from hindsight.tasks import episodic  # noqa: F401  (registers the episode tasks)
from hindsight.tasks.dataset import DatasetTask
from hindsight.tasks.episodic import EpisodeTask, ScienceWorldTask, SearchQATask, TextGameTask
from hindsight.tasks.math import MathWord, verify_choice, verify_math
from hindsight.tasks.sandbox import Limits, run_python
from hindsight.tasks.synthetic import Arithmetic, CountLetters, ReverseWords, SortNumbers

__all__ = ["SPLITS", "SUCCESS_REWARD", "Arithmetic", "CountLetters", "DatasetTask", "EpisodeTask", "Example",
           "HumanEval", "Limits", "ScienceWorldTask", "SearchQATask", "TextGameTask",
           "MathWord", "ReverseWords", "SortNumbers", "Task", "Verdict", "get_task", "register",
           "reward_range", "run_python", "seeded_subset", "task_names", "verify_choice",
           "verify_math", "verify_program"]
