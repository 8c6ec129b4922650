"""The RL loop end to end on the tiny random model: every registered method trains 3 steps (finite
loss and gradients, params change, metrics written) and resumes from its checkpoint; resume equals
an uninterrupted run; Ctrl-C leaves a resumable checkpoint; bad configs and foreign run
directories fail before anything is loaded."""
from __future__ import annotations

import importlib
import json
import os
import signal

import jax
import numpy as np
import pytest

from hindsight.methods import REGISTRY
from hindsight.methods.testing import char_model
from hindsight.tasks import Example, Verdict, register, task_names
from hindsight.train.experiment import ConfigError, resolve
from hindsight.train.loop import run
from hindsight.train.state import split_model

PARITY = "test-parity"


class ParityTask:
    """Reward 1 when the response has an even number of characters: stateless, deterministic and
    mixed for a random model, so every group has a non-zero advantage somewhere."""
    name = PARITY
    interrupt_after: int | None = None  # send SIGINT to this process after that many verify calls
    calls = 0

    def examples(self, *, split: str, count: int, seed: int):
        return [Example(prompt=f"{split} {seed} {i}: say something", answer="even")
                for i in range(count)]

    def verify(self, example, response: str) -> Verdict:
        ParityTask.calls += 1
        if ParityTask.interrupt_after is not None and ParityTask.calls == ParityTask.interrupt_after:
            os.kill(os.getpid(), signal.SIGINT)
        even = len(response) % 2 == 0
        return Verdict(float(even), "verified correct" if even else
                       f"expected an even length, got {len(response)} characters")


if PARITY not in task_names():
    register(PARITY)(ParityTask)


def tiny_config(method: str, **train):
    config = importlib.import_module(f"configs.{method}").get_config("tiny")
    config.task.name = PARITY
    config.eval.num_examples = 0
    config.train.update(train)
    return config


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _checkpoint_params(workdir: str, step: int):
    import orbax.checkpoint as ocp
    path = os.path.join(workdir, "checkpoints", str(step), "state")
    return ocp.StandardCheckpointer().restore(path)["params"]


@pytest.mark.parametrize("method", sorted(REGISTRY))
def test_every_method_trains_and_resumes(method, tmp_path):
    workdir = str(tmp_path / method)
    out = run(tiny_config(method, num_steps=2), workdir, progress=False)
    assert out["final_step"] == 2 and not out["interrupted"]
    out = run(tiny_config(method, num_steps=3), workdir, progress=False)  # resumes at step 2
    assert out["final_step"] == 3
    steps = [r for r in _lines(os.path.join(workdir, "metrics.jsonl")) if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        for k in ("loss", "grad_norm", "reward", "generated_tokens_per_group", "rollout_seconds"):
            assert np.isfinite(r[k]), (k, r)
    assert any(r["grad_norm"] > 0 for r in steps)
    assert len(_lines(os.path.join(workdir, "samples.jsonl"))) == 3
    assert os.path.exists(os.path.join(workdir, "summary.json"))
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(workdir))
    _, initial = split_model(char_model(0))
    final = _checkpoint_params(workdir, 3)
    moved = [float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in
             zip(jax.tree.leaves(initial), jax.tree.leaves(final))]
    assert max(moved) > 0


def test_resume_equals_uninterrupted_run(tmp_path):
    """CRAFT (stateful controller, frozen reference): 3 straight steps == 2 steps + resume."""
    straight, resumed = str(tmp_path / "a"), str(tmp_path / "b")
    run(tiny_config("craft", num_steps=3), straight, progress=False)
    run(tiny_config("craft", num_steps=2), resumed, progress=False)
    run(tiny_config("craft", num_steps=3), resumed, progress=False)
    a = [r for r in _lines(os.path.join(straight, "metrics.jsonl")) if "loss" in r]
    b = [r for r in _lines(os.path.join(resumed, "metrics.jsonl")) if "loss" in r]
    for key in ("loss", "reward", "grad_norm", "generated_tokens_per_group"):
        assert [r[key] for r in a] == [r[key] for r in b], key
    for x, y in zip(jax.tree.leaves(_checkpoint_params(straight, 3)),
                    jax.tree.leaves(_checkpoint_params(resumed, 3))):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_ctrl_c_leaves_a_resumable_checkpoint(tmp_path):
    workdir = str(tmp_path / "run")
    config = tiny_config("grpo", num_steps=3, save_every=100)
    rows = config.rollout.prompts_per_step * config.rollout.group_size
    ParityTask.calls, ParityTask.interrupt_after = 0, rows + 1  # during step 2's rollout
    try:
        out = run(config, workdir, progress=False)
    finally:
        ParityTask.interrupt_after = None
    assert out["interrupted"] and out["final_step"] == 1
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["1"]
    out = run(config, workdir, progress=False)
    assert out["final_step"] == 3 and not out["interrupted"]


def test_bad_configs_fail_before_loading(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.lrr"):
        resolve({"method": "grpo", "train": {"lrr": 1.0}})
    with pytest.raises(ConfigError, match="unknown method 'nope'"):
        resolve({"method": "nope"})
    with pytest.raises(ConfigError, match="unknown task 'nope'"):
        resolve({"method": "grpo", "task": {"name": "nope"}})
    with pytest.raises(ConfigError, match="no option"):
        resolve({"method": "grpo", "method_config": {"lamda": 1.0}})
    with pytest.raises(ConfigError, match="rollout.group_size"):
        resolve({"method": "hdl", "rollout": {"group_size": 8}})
    with pytest.raises(ConfigError, match="differs from rollout.group_size"):
        resolve({"method": "craft", "rollout": {"group_size": 4},
                 "method_config": {"group_size": 8}})


def test_foreign_run_directory_is_refused(tmp_path):
    workdir = str(tmp_path / "run")
    os.makedirs(workdir)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(resolve(tiny_config("grpo")).config.to_dict(), f)
    with pytest.raises(ConfigError, match=r"another config.*'method'"):
        run(tiny_config("hdl"), workdir, progress=False)
    with pytest.raises(ConfigError, match=r"train\.optim\.learning_rate"):
        config = tiny_config("grpo")
        config.train.optim.learning_rate = 0.5
        run(config, workdir, progress=False)


@pytest.mark.parametrize("method", sorted(REGISTRY))
@pytest.mark.parametrize("variant", ["tiny", "demo", "smollm2-reverse", "smollm2-sort_numbers"])
def test_config_files_are_valid(method, variant):
    config = importlib.import_module(f"configs.{method}").get_config(variant)
    exp = resolve(config).config
    assert exp.method == method
