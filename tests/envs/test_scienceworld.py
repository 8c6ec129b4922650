"""ScienceWorld through the pool (a JVM per worker): the gold path scores 100 and ends the episode,
an invalid action is answered with valid ones, the task draws the simulator's own splits."""
import time

import pytest

pytest.importorskip("scienceworld")

from hindsight.envs import EnvPool, EnvSpec  # noqa: E402
from hindsight.envs.scienceworld import gold_path  # noqa: E402
from hindsight.tasks import get_task  # noqa: E402


def _reply(pool, limit=120.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = pool.poll(1.0)
        if got:
            (reply,) = got
            assert reply.ok, reply.message
            return reply.step
    raise AssertionError("no reply")


def test_gold_path_scores_100_and_invalid_actions_list_valid_ones():
    task = get_task("scienceworld", tasks=("find-non-living-thing",))
    (example,) = task.examples(split="train", count=1, seed=0)
    setup = task.setup(example)
    assert setup["task"] == "find-non-living-thing"
    gold = gold_path(setup["task"], setup["variation"])
    with EnvPool(task.env, workers=1, step_timeout=60.0, reset_timeout=120.0) as pool:
        pool.reset("e", setup)
        first = _reply(pool)
        assert first.observation.startswith("Task: ") and "Actions take the forms:" in first.observation
        pool.step("e", "fly to the moon")
        bad = _reply(pool)
        assert "Valid actions include:" in bad.observation and not bad.done
        total = bad.reward  # the points the task starts with
        for action in gold:
            pool.step("e", action)
            step = _reply(pool)
            total += step.reward
        assert step.done and step.info["score"] == 100 and step.info["feedback"] == "completed the task"
        assert abs(total - 1.0) < 1e-9
        # the same worker's JVM serves the next episode from a fresh reset
        pool.release("e")
        pool.reset("f", setup)
        assert _reply(pool).observation == first.observation and pool.stats["workers"] == 1
    test = {e.data for e in task.examples(split="test", count=5, seed=0)}
    assert not test & {e.data for e in task.examples(split="train", count=20, seed=0)}
