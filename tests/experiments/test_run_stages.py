"""A multi-stage config from the launcher: ``python -m experiments.run --config=configs/bird.py:tiny``
runs both stages in one command, ``--config.stages.<name>.<key>`` reaches each stage, an unknown
stage key fails before anything runs."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _launch(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "experiments.run", "--config=configs/bird.py:tiny",
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # a fresh interpreter compiling two stages: ~20-40 s on 2 cores
def test_bird_runs_both_stages_from_one_command(tmp_path):
    workdir = str(tmp_path / "bird")
    out = _launch(f"--workdir={workdir}", "--noprogress", "--config.stages.sft.train.num_steps=1",
                  "--config.stages.opsd.train.num_steps=2", "--config.stages.sft.eval.num_examples=0",
                  "--config.stages.opsd.eval.num_examples=0")
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["workdir"] == workdir
    assert [s["final_step"] for s in report["stages"]] == [1, 2]
    dirs = [os.path.join(workdir, d) for d in ("stage0-sft", "stage1-opsd")]
    assert [s["workdir"] for s in report["stages"]] == dirs
    resolved = []
    for d in dirs:
        with open(os.path.join(d, "config.json")) as f:
            resolved.append(json.load(f))
    assert [c["train"]["num_steps"] for c in resolved] == [1, 2]
    assert resolved[1]["model"]["init_from"] == dirs[0]
    assert resolved[1]["method_config"]["temperature"] == resolved[1]["rollout"]["temperature"]


def test_an_unknown_stage_key_is_refused(tmp_path):
    out = _launch(f"--workdir={tmp_path / 'never'}", "--config.stages.opsd.train.num_stepz=2",
                  timeout=120)
    assert out.returncode == 2
    assert "unknown key 'stages.opsd.train.num_stepz'" in out.stderr
    assert "did you mean 'stages.opsd.train.num_steps'" in out.stderr
    out = _launch(f"--workdir={tmp_path / 'never'}", "--config.stage_order=('sft',)", timeout=120)
    assert out.returncode == 2 and "stages ['stages.opsd'] are not in stage_order" in out.stderr
    assert not os.path.exists(tmp_path / "never")
