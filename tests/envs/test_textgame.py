"""The test environment and its task: the gold path wins, invalid actions change nothing."""
import pytest

from hindsight.envs import make_env
from hindsight.tasks import get_task

SETUP = {"rooms": ["hall", "kitchen", "garden"], "key": 1, "chest": 2}


def test_gold_path_wins_and_snapshots_restore():
    env = make_env("textgame", max_steps=8)
    assert env.reset(SETUP).startswith("You are in the hall.")
    rewards = [env.step(a).reward for a in ("go kitchen", "take key")]
    state = env.snapshot()
    last = env.step("go garden")
    win = env.step("Open  Chest.")
    assert rewards == [0.0, 0.5] and win.done and win.reward == 0.5 and win.info["score"] == 100
    env.restore(state)
    assert env.step("go garden").observation == last.observation


def test_invalid_actions_and_the_step_limit():
    env = make_env("textgame", max_steps=2)
    env.reset(SETUP)
    bad = env.step("fly away")
    assert not bad.done and bad.reward == 0.0 and "not a valid action" in bad.observation
    assert "go kitchen" in bad.info["valid"]
    end = env.step("")
    assert end.done and "out of moves" in end.observation
    assert end.info["feedback"] == "did not find the key in 2 moves"
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("look")
    with pytest.raises(ValueError, match="max_steps"):
        make_env("textgame", max_steps=0)
    with pytest.raises(ValueError, match="unknown environment"):
        make_env("nope")


def test_task_examples_are_seeded_disjoint_and_parse_actions():
    task = get_task("textgame")
    train = task.examples(split="train", count=20, seed=0)
    assert train == task.examples(split="train", count=20, seed=0)
    test = task.examples(split="test", count=5, seed=0)
    assert not {e.data for e in train} & {e.data for e in test}
    setup = task.setup(train[0])
    assert make_env("textgame").reset(setup).startswith(f"You are in the {setup['rooms'][0]}.")
    assert task.parse_action("<action>look</action> then <action> go hall </action>") == "go hall"
    assert task.parse_action("<action>take key") == "take key"
    assert task.parse_action("\n go hall.\nthen more") == "go hall"
    assert task.parse_action("  \n") == ""
    with pytest.raises(TypeError, match="played as episodes"):
        task.verify(train[0], "x")
