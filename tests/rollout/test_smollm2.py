"""HDL tree and GRPO group on the real SmolLM2-135M-Instruct with a real task (slow)."""
import jax
import numpy as np
import pytest

from hindsight.methods import RolloutShape, get_method
from hindsight.rollout import RolloutConfig, TreeOptions, collect, context_logprobs
from hindsight.sampling import SamplingParams
from hindsight.tasks import get_task


@pytest.fixture(scope="module")
def smollm2():
    from hindsight.models import load
    return load("smollm2-135m-instruct")


@pytest.mark.slow
def test_hdl_tree_on_smollm2(smollm2):
    model, tok = smollm2
    task = get_task("arithmetic", style="reasoning")
    exs = task.examples(split="train", count=1, seed=0)
    hdl = get_method("hdl").configure(rollout=RolloutShape(max_new_tokens=48))
    batch, stats = collect(hdl, model, tok, task, exs, key=jax.random.key(0),
                           sampling=SamplingParams(max_new_tokens=48),
                           rollout=RolloutConfig(tree=TreeOptions(
                               reflection_max_tokens=24, hindsight_reflection_tokens=24)))
    assert batch["targets"].shape == (16, 48)
    mask = batch["mask"] > 0
    assert stats.generated_tokens[0] == int(mask.sum()) + stats.reflection_tokens[0]
    assert 0 < stats.reflection_tokens[0] <= 48 and len(stats.reflections) == 2
    for i, b in enumerate(np.array(stats.branch_positions[0]).reshape(-1)):
        if b > 0:  # continuation rows of this point share the root's prefix
            rows = {0: range(1, 5), 1: range(5, 8), 2: range(9, 13), 3: range(13, 16)}[i]
            root = 0 if i < 2 else 8
            for r in rows:
                np.testing.assert_array_equal(batch["targets"][r, :b], batch["targets"][root, :b])
    lp = context_logprobs(model, batch)
    np.testing.assert_allclose(np.where(mask, lp, 0), np.where(mask, batch["logp_old"], 0),
                               atol=2e-4)
