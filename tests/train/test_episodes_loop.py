"""Episodes through the training loop: ``configs/grpo.py:tiny-textgame`` trains and evaluates on
the test environment (turns_per_episode in the metrics, the rendered episode in the samples), and
a method the episode rollout cannot serve is refused before the run directory is touched."""
import importlib
import json
import os

import pytest

from hindsight.train.experiment import ConfigError, resolve
from hindsight.train.loop import preflight, run


def test_grpo_trains_on_textgame_episodes(tmp_path):
    config = importlib.import_module("configs.grpo").get_config("tiny-textgame")
    config.train.update(num_steps=1, save_every=1)
    config.eval.update(num_examples=2, every=1)
    summary = run(config, str(tmp_path / "run"), progress=False)
    assert summary["final_step"] == 1
    with open(tmp_path / "run" / "metrics.jsonl", encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    step = next(r for r in records if "loss" in r)
    assert step["turns_per_episode"] == 3.0 and step["env_wait_seconds"] >= 0.0
    assert 0 < step["count/policy"] < 4 * config.rollout.episode_tokens
    assert any("eval_reward" in r for r in records)
    with open(tmp_path / "run" / "samples.jsonl", encoding="utf-8") as f:
        sample = json.loads(f.readline())
    assert "[turn 0]" in sample["texts"][0] and "[observation]" in sample["texts"][0]


@pytest.mark.parametrize("method", ["opsd", "dapo"])
def test_methods_episodes_cannot_serve_are_refused(method, tmp_path):
    config = importlib.import_module(f"configs.{method}").get_config("tiny-textgame")
    with pytest.raises(ConfigError, match="played as episodes"):
        preflight(resolve(config))


def test_episode_tokens_must_exceed_a_turn():
    config = importlib.import_module("configs.grpo").get_config("tiny-textgame")
    config.rollout.episode_tokens = config.rollout.max_new_tokens
    with pytest.raises(ConfigError, match="rollout.episode_tokens"):
        preflight(resolve(config))


@pytest.mark.parametrize("variant", ["smollm2-scienceworld", "smollm2-search_qa"])
def test_smollm2_episode_variants_pass_preflight(variant):
    config = importlib.import_module("configs.grpo").get_config(variant)
    xp = resolve(config)
    task, sampling = preflight(xp)
    assert task.name == variant.split("-", 1)[1] and sampling.max_new_tokens == 48
    assert xp.config.rollout.episode_tokens > sampling.max_new_tokens


def test_hdl_trains_on_textgame_episode_trees(tmp_path):
    config = importlib.import_module("configs.hdl").get_config("tiny-textgame")
    config.train.update(num_steps=1, save_every=1)
    summary = run(config, str(tmp_path / "run"), progress=False)
    assert summary["final_step"] == 1
    with open(tmp_path / "run" / "metrics.jsonl", encoding="utf-8") as f:
        step = next(r for r in map(json.loads, f) if "loss" in r)
    assert step["turns_per_episode"] == 3.0 and step["count/policy"] > 0
    with open(tmp_path / "run" / "samples.jsonl", encoding="utf-8") as f:
        sample = json.loads(f.readline())
    # a continuation's rendering marks where it left its root
    assert any("[branch]" in text for text in sample["texts"]) and sample["branch_positions"]
