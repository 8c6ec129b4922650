"""Tasks: prompt sources plus verifiers returning a reward in [0, 1] and textual feedback."""
from hindsight.tasks.base import SPLITS, Example, Task, Verdict, get_task, register, task_names
from hindsight.tasks import synthetic  # noqa: F401  (registers the synthetic tasks)
from hindsight.tasks.synthetic import Arithmetic, CountLetters, ReverseWords, SortNumbers

__all__ = ["SPLITS", "Arithmetic", "CountLetters", "Example", "ReverseWords", "SortNumbers", "Task",
           "Verdict", "get_task", "register", "task_names"]
