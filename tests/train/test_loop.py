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
from hindsight.testing import char_model
from hindsight.tasks import Example, Verdict, register, task_names
from hindsight.train.experiment import ConfigError, resolve
from hindsight.train.experiment import EvalSection
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


def documented_tiny(method: str, **train):
    """``configs/<method>.py:tiny`` exactly as documented (task ``even_length``), no evaluation."""
    config = importlib.import_module(f"configs.{method}").get_config("tiny")
    config.eval.num_examples = 0
    config.train.update(train)
    return config


@pytest.mark.parametrize("method", sorted(REGISTRY))
def test_every_method_trains_and_resumes(method, tmp_path):
    """The documented tiny config: mixed rewards, so the first step's gradient is not zero."""
    workdir = str(tmp_path / method)
    out = run(documented_tiny(method, num_steps=2), workdir, progress=False)
    assert out["final_step"] == 2 and not out["interrupted"]
    first = [u for u in _lines(os.path.join(workdir, "updates.jsonl")) if u["step"] == 1]
    assert first and first[0]["grad_norm"] > 0, first
    out = run(documented_tiny(method, num_steps=3), workdir, progress=False)  # resumes at step 2
    assert out["final_step"] == 3
    steps = [r for r in _lines(os.path.join(workdir, "metrics.jsonl")) if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        for k in ("loss", "grad_norm", "reward", "generated_tokens_per_group", "rollout_seconds"):
            assert np.isfinite(r[k]), (k, r)
        assert 0 <= r["rollout_compile_seconds"] <= r["rollout_seconds"], r
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
    """CRAFT (stateful controller, frozen reference) on its documented tiny config (mixed rewards,
    a non-zero gradient every step): 3 straight steps == 2 steps + resume, bit for bit."""
    straight, resumed = str(tmp_path / "a"), str(tmp_path / "b")
    run(documented_tiny("craft", num_steps=3), straight, progress=False)
    run(documented_tiny("craft", num_steps=2), resumed, progress=False)
    run(documented_tiny("craft", num_steps=3), resumed, progress=False)
    a = [r for r in _lines(os.path.join(straight, "metrics.jsonl")) if "loss" in r]
    b = [r for r in _lines(os.path.join(resumed, "metrics.jsonl")) if "loss" in r]
    assert all(r["grad_norm"] > 0 for r in a)
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


def test_training_through_nan_stops_with_the_last_good_checkpoint(tmp_path):
    """An update that would write NaN is not applied; the run stops with NonFiniteError, no
    checkpoint after it, and the launcher exits non-zero."""
    from hindsight.train.experiment import NonFiniteError
    workdir = str(tmp_path / "run")
    config = tiny_config("grpo", num_steps=4, save_every=1)
    config.train.optim.update(learning_rate=1e30, max_grad_norm=None)  # step 1 blows the params up
    with pytest.raises(NonFiniteError, match=r"not finite.*not applied.*last one is step"):
        run(config, workdir, progress=False)
    steps = sorted(int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")))
    updates = _lines(os.path.join(workdir, "updates.jsonl"))
    bad = [u for u in updates if u["nonfinite"]]
    assert len(bad) == 1 and steps and max(steps) < bad[0]["step"]
    for leaf in jax.tree.leaves(_checkpoint_params(workdir, max(steps))):
        assert np.all(np.isfinite(np.asarray(leaf)))


def test_infinite_config_values_are_refused(tmp_path):
    config = tiny_config("grpo")
    config.train.optim.learning_rate = float("inf")
    with pytest.raises(ConfigError, match=r"train.optim.learning_rate must be a finite number"):
        run(config, str(tmp_path / "run"), progress=False)
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("key, value, match", [
    ("rollout.top_p", 0.0, "top_p"),
    ("task.options", {"min_words": 1}, "min_words"),
    ("model.name", "no-such-model", "neither a registry name"),
    ("eval.split", "validation", "eval.split"),
])
def test_bad_values_fail_before_the_run_directory_is_written(tmp_path, key, value, match):
    config = tiny_config("grpo")
    config.task.name = "reverse"
    section, name = key.split(".")
    setattr(getattr(config, section), name, value)
    workdir = tmp_path / "run"
    with pytest.raises(ConfigError, match=match):
        run(config, str(workdir), progress=False)
    assert not workdir.exists()


@pytest.mark.parametrize("at_start, steps", [(True, [0, 1]), (False, [1])])
def test_eval_at_start_decides_the_evaluation_before_the_first_step(tmp_path, at_start, steps):
    config = tiny_config("grpo", num_steps=1)
    config.eval.update(num_examples=2, at_start=at_start)
    out = run(config, str(tmp_path / "run"), progress=False)
    assert [s for s, _ in out["eval_reward"]] == steps
    evals = [r for r in _lines(tmp_path / "run" / "metrics.jsonl") if "eval_reward" in r]
    assert [r["step"] for r in evals] == steps
    with pytest.raises(ValueError, match="eval.at_start must be a bool"):
        EvalSection(at_start=1)


def test_a_finished_run_is_reported_not_overwritten(tmp_path):
    workdir = str(tmp_path / "run")
    run(tiny_config("grpo", num_steps=2), workdir, progress=False)
    files = {f: os.path.getmtime(os.path.join(workdir, f))
             for f in ("summary.json", "metrics.jsonl", "updates.jsonl", "samples.jsonl")}
    with open(os.path.join(workdir, "summary.json")) as f:
        before = json.load(f)
    for steps in (2, 1):  # the same length again, then fewer steps
        out = run(tiny_config("grpo", num_steps=steps), workdir, progress=False)
        assert out["final_step"] == 2 and out["steps"] == before["steps"] == 2
        assert out["loss"]["last"] == before["loss"]["last"]
    assert files == {f: os.path.getmtime(os.path.join(workdir, f)) for f in files}


def test_hdl_tiny_on_a_task_with_long_feedback(tmp_path):
    """``reverse``'s feedback (~70 characters, one token each) is cut to the engine's feedback room
    instead of overflowing the cache at step 1."""
    config = documented_tiny("hdl", num_steps=1)
    config.task.name = "reverse"
    out = run(config, str(tmp_path / "run"), progress=False)
    assert out["final_step"] == 1
    (sample,) = _lines(os.path.join(str(tmp_path / "run"), "samples.jsonl"))
    assert all(len(f) <= 48 for f in [sample["trace"]["feedback"]])
