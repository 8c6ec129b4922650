"""Multi-stage experiments: SFT then OPSD warm-started from it, resumed in the middle of the
second stage; a stage's warm start is the previous stage's final params."""
import json
import os

import jax
import numpy as np
import pytest

import configs.opsd
import configs.sft
from hindsight.testing import char_model
from hindsight.train.experiment import ConfigError, ModelSection
from hindsight.train.loop import trained_policy, warm_start
from hindsight.train.mesh import make_mesh
from hindsight.train.experiment import MeshConfig
from hindsight.train.stages import run_stages, stage_dirs


def _stages(second_steps):
    sft = configs.sft.get_config("tiny")
    sft.train.update(num_steps=2, save_every=2)
    opsd = configs.opsd.get_config("tiny")
    opsd.train.update(num_steps=second_steps, save_every=1)
    return [sft, opsd]


def _lines(path):
    with open(path) as f:
        return sum(1 for _ in f)


def test_sft_then_opsd_resumes_in_the_second_stage(tmp_path):
    workdir = str(tmp_path)
    first = run_stages(_stages(1), workdir, progress=False)
    assert [s["final_step"] for s in first] == [2, 1]
    sft_dir, opsd_dir = stage_dirs(_stages(1), workdir)
    with open(os.path.join(opsd_dir, "config.json")) as f:
        assert json.load(f)["model"]["init_from"] == sft_dir
    sft_metrics = _lines(os.path.join(sft_dir, "metrics.jsonl"))
    again = run_stages(_stages(3), workdir, progress=False)  # the second stage goes on
    assert [s["final_step"] for s in again] == [2, 3]
    assert _lines(os.path.join(sft_dir, "metrics.jsonl")) == sft_metrics  # not retrained

    # the warm start is the first stage's final policy
    trained, _, step = trained_policy(sft_dir)
    assert step == 2
    started = warm_start(char_model(0), ModelSection(name="tiny-random", init_from=sft_dir),
                         make_mesh(MeshConfig()))
    from flax import nnx
    for a, b in zip(jax.tree.leaves(nnx.state(started, nnx.Param)),
                    jax.tree.leaves(nnx.state(trained, nnx.Param))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    fresh = jax.tree.leaves(nnx.state(char_model(0), nnx.Param))
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(fresh, jax.tree.leaves(nnx.state(trained, nnx.Param))))


def test_warm_start_errors(tmp_path):
    with pytest.raises(ConfigError, match="holds no run"):
        warm_start(char_model(0), ModelSection(name="tiny-random", init_from=str(tmp_path)),
                   make_mesh(MeshConfig()))
    with pytest.raises(ConfigError, match="at least one stage"):
        run_stages([], str(tmp_path))
