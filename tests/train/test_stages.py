"""Multi-stage experiments: SFT then OPSD warm-started from it, resumed in the middle of the
second stage; a stage's warm start is the previous stage's final params; BIRD's multi-stage config
(``configs/bird.py``) end to end and resumed; the multi-stage config's errors."""
import json
import os
import shutil

import jax
import numpy as np
import pytest

import configs.bird
import configs.opsd
import configs.sft
from hindsight.testing import char_model
from hindsight.train.experiment import ConfigError, ModelSection
from hindsight.train.loop import trained_policy, warm_start
from hindsight.train.mesh import make_mesh
from hindsight.train.experiment import MeshConfig
from hindsight.train.stages import run_stages, stage_dirs
from tests.train.helpers import step_records, trained_params


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


def _bird(opsd_steps=3):
    """``configs/bird.py:tiny`` sized for a test: 2 SFT steps, ``opsd_steps`` OPSD steps with a
    checkpoint after each, no evaluation."""
    config = configs.bird.get_config("tiny")
    config.stages.sft.train.update(num_steps=2, save_every=2)
    config.stages.opsd.train.update(num_steps=opsd_steps, save_every=1)
    for name in config.stage_order:
        config.stages[name].eval.num_examples = 0
    return config


@pytest.mark.slow
def test_bird_runs_both_stages_and_resumes_in_the_middle_of_the_second(tmp_path):
    """``configs/bird.py``: SFT on the policy's filtered concise samples, then OPSD with the
    concise teacher warm-started from it, from one multi-stage config; the same config run again
    after an interruption one step into OPSD equals the uninterrupted run (losses, final params)."""
    full_dir, cut_dir = str(tmp_path / "full"), str(tmp_path / "cut")
    run_stages(_bird(), full_dir, progress=False)
    sft_dir, opsd_dir = stage_dirs(_bird(), full_dir)
    assert [os.path.basename(d) for d in (sft_dir, opsd_dir)] == ["stage0-sft", "stage1-opsd"]
    with open(os.path.join(sft_dir, "config.json")) as f:
        sft = json.load(f)
    with open(os.path.join(opsd_dir, "config.json")) as f:
        opsd = json.load(f)
    assert sft["method_config"]["completions"] == "policy"
    assert sft["method_config"]["sample_context"] == ["concise"]
    assert sft["method_config"]["temperature"] == 1.0  # derived, resolved
    assert opsd["method_config"]["teacher_context"] == ["concise"]
    assert opsd["method_config"]["beta"] == 1.0 and opsd["train"]["reference"] == "ema"
    assert opsd["model"]["init_from"] == sft_dir
    with open(os.path.join(sft_dir, "metrics.jsonl")) as f:
        records = [json.loads(x) for x in f]
    assert all({"kept_fraction", "kept_length", "sampled_length"} <= set(r) for r in records)
    assert any(r["count/sft"] > 0 and r["kept_fraction"] > 0 for r in records)  # stage 1 trained

    # the interrupted experiment: its SFT stage is the same run (copied, not trained again), its
    # OPSD stage stopped after one step, then the same config again
    shutil.copytree(sft_dir, os.path.join(cut_dir, "stage0-sft"))
    first = run_stages(_bird(opsd_steps=1), cut_dir, progress=False)
    assert [s["final_step"] for s in first] == [2, 1]
    again = run_stages(_bird(), cut_dir, progress=False)
    assert [s["final_step"] for s in again] == [2, 3]
    cut_opsd = stage_dirs(_bird(), cut_dir)[1]
    losses = lambda d: [(r["step"], r["loss"]) for r in step_records(d)]
    assert losses(cut_opsd) == losses(opsd_dir)
    (step, got), (_, want) = trained_params(cut_opsd), trained_params(opsd_dir)
    assert step == 3
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_multi_stage_config_errors_name_the_key_before_anything_trains(tmp_path):
    workdir = str(tmp_path / "never")

    def refused(config, match):
        with pytest.raises(ConfigError, match=match):
            run_stages(config, workdir, progress=False)
        assert not os.path.exists(workdir)

    config = _bird()
    config.stages.opsd.train.unlock()
    config.stages.opsd.train.nope = 1
    refused(config, r"stages.opsd: unknown config key\(s\) \['train.nope'\]")
    config = _bird()
    config.stages.opsd.model.scan_layers = False
    refused(config, r"stages.opsd: model.scan_layers=False but the stage it starts from trains "
                    r"model.scan_layers=True")
    config = _bird()
    config.stages.opsd.method_config.teacher_context = ("concise", "nonesuch")
    refused(config, "stages.opsd: .*unknown context part 'nonesuch'")
    config = _bird()
    config.stages.sft.method_config.sample_context = ("successful_peer",)
    refused(config, r"stages.sft: .*sample_context.*\['successful_peer'\]")
    config = _bird()
    config.unlock()
    config.epochs = 2
    refused(config, r"unknown key\(s\) \['epochs'\] in a multi-stage config")
    for order, match in ((("sft", "opsdd"), r"stage_order names \['opsdd'\]"),
                         (("sft",), r"stages \['stages.opsd'\] are not in stage_order"),
                         (("sft", "sft", "opsd"), r"lists \['sft'\] more than once"),
                         ((), "must list the stage names")):
        config = _bird()
        config.stage_order = order
        refused(config, match)
    refused({"stages": {}, "stage_order": ()}, "must map stage names")


@pytest.mark.parametrize("variant", ["tiny", "smollm2-math"])
def test_bird_variants_resolve_and_pass_preflight(variant, tmp_path):
    """Both stages of each documented BIRD variant resolve and pass the launcher's pre-flight
    (model, task, sampling, context recipes), the second warm-started from the first."""
    from hindsight.train.stages import preflight_stages
    (sft, sft_dir), (opsd, opsd_dir) = preflight_stages(configs.bird.get_config(variant),
                                                         str(tmp_path))
    assert sft["model"]["name"] == opsd["model"]["name"]
    assert opsd["model"]["init_from"] == sft_dir and sft["model"]["init_from"] is None
    assert sft["rollout"]["group_size"] == 1 and sft["method_config"]["num_samples"] == 4
