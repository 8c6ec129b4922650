"""SEED's multi-stage config (``configs/seed_stages.py``): stage 1 SFT on the policy's own useful
skills, then the ``seed`` method warm-started from it, from one config; resumed in the middle of
the second stage it equals the uninterrupted run; its documented variants pass pre-flight."""
import json
import os
import shutil

import numpy as np
import pytest

import configs.seed_stages
from hindsight.train.stages import preflight_stages, run_stages, stage_dirs
from tests.train.helpers import step_records, trained_params


def _seed(seed_steps=2):
    """``configs/seed_stages.py:tiny`` sized for a test: 2 SFT steps, ``seed_steps`` SEED steps
    with a checkpoint after each, no evaluation. Stage 1 also keeps skills cut at their cap: the
    random model almost never ends one (its end-of-sequence id is 1 of 128, the cap 16)."""
    config = configs.seed_stages.get_config("tiny")
    config.stages.sft.method_config.finished_only = False
    config.stages.sft.train.update(num_steps=2, save_every=2)
    config.stages.seed.train.update(num_steps=seed_steps, save_every=1)
    for name in config.stage_order:
        config.stages[name].eval.num_examples = 0
    return config


@pytest.mark.slow
def test_seed_runs_both_stages_and_resumes_in_the_middle_of_the_second(tmp_path):
    full_dir, cut_dir = str(tmp_path / "full"), str(tmp_path / "cut")
    run_stages(_seed(), full_dir, progress=False)
    sft_dir, seed_dir = stage_dirs(_seed(), full_dir)
    assert [os.path.basename(d) for d in (sft_dir, seed_dir)] == ["stage0-sft", "stage1-seed"]
    with open(os.path.join(sft_dir, "config.json")) as f:
        sft = json.load(f)
    with open(os.path.join(seed_dir, "config.json")) as f:
        seed = json.load(f)
    assert (sft["method_config"]["completions"], sft["method_config"]["generated_part"],
            sft["method_config"]["select"]) == ("generated", "skill", "useful")
    assert sft["rollout"]["generated_max_tokens"] == seed["rollout"]["generated_max_tokens"]
    assert seed["method_config"]["teacher_context"] == ["skill"]
    assert seed["model"]["init_from"] == sft_dir
    records = step_records(sft_dir)
    assert all({"kept_fraction", "sampled_length", "sampled_reward"} <= set(r) for r in records)
    assert any(r["count/sft"] > 0 for r in records)  # stage 1 trained on kept skills
    records = step_records(seed_dir)
    assert all(np.isfinite(r["loss/distill"]) for r in records)
    assert any(r["count/distill"] > 0 for r in records)  # skills were written and distilled
    with open(os.path.join(seed_dir, "samples.jsonl")) as f:
        assert any(line.get("generated") for line in map(json.loads, f))

    # interrupted one step into SEED (its SFT stage copied, not trained again), then resumed
    shutil.copytree(sft_dir, os.path.join(cut_dir, "stage0-sft"))
    first = run_stages(_seed(seed_steps=1), cut_dir, progress=False)
    assert [s["final_step"] for s in first] == [2, 1]
    again = run_stages(_seed(), cut_dir, progress=False)
    assert [s["final_step"] for s in again] == [2, 2]
    cut_seed = stage_dirs(_seed(), cut_dir)[1]
    loss = lambda d: [(r["step"], r["loss"], r["loss/distill"]) for r in step_records(d)]
    assert loss(cut_seed) == loss(seed_dir)
    (step, got), (_, want) = trained_params(cut_seed), trained_params(seed_dir)
    assert step == 2
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("variant", ["tiny", "smollm2-math"])
def test_seed_variants_resolve_and_pass_preflight(variant, tmp_path):
    (sft, sft_dir), (seed, _) = preflight_stages(configs.seed_stages.get_config(variant),
                                                  str(tmp_path))
    assert sft["model"]["name"] == seed["model"]["name"] and seed["model"]["init_from"] == sft_dir
    assert sft["rollout"]["group_size"] == 1 and sft["method_config"]["num_samples"] == 8
    assert sft["rollout"]["generated_max_tokens"] <= sft["rollout"]["max_new_tokens"]
