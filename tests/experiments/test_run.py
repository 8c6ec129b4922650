"""The launcher as a user runs it: ``python -m experiments.run --config=configs/<m>.py:variant``
with command-line overrides; a wrong key fails before anything runs."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _launch(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "experiments.run", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_launch_with_overrides_writes_the_run_directory(tmp_path):
    workdir = str(tmp_path / "run")
    out = _launch("--config=configs/grpo.py:tiny", f"--workdir={workdir}", "--noprogress",
                  "--config.train.num_steps=1", "--config.eval.num_examples=2",
                  "--config.train.optim.learning_rate=0.05")
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["final_step"] == 1
    with open(os.path.join(workdir, "config.json")) as f:
        resolved = json.load(f)
    assert resolved["train"]["optim"]["learning_rate"] == 0.05
    assert resolved["model"]["name"] == "tiny-random" and resolved["train"]["num_steps"] == 1
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        lines = [json.loads(x) for x in f]
    assert [x["step"] for x in lines] == [0, 1] and "eval_reward" in lines[0]
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "1"))


def test_wrong_key_and_missing_workdir_fail_fast(tmp_path):
    out = _launch("--config=configs/grpo.py:tiny", f"--workdir={tmp_path}",
                  "--config.train.lrr=1e-5", timeout=120)
    assert out.returncode != 0 and "lrr" in out.stderr
    out = _launch("--config=configs/grpo.py:tiny", timeout=120)
    assert out.returncode != 0 and "workdir" in out.stderr
    out = _launch("--config=configs/grpo.py:nonsense", f"--workdir={tmp_path}", timeout=120)
    assert out.returncode != 0 and "unknown config variant 'nonsense'" in out.stderr
