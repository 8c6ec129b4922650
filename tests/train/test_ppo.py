"""PPO-style updates: several optimizer steps per rollout move the importance ratio off 1 and make
the clip act; the policy term of a later update equals a float64 reference of the clipped
objective at the updated params; updates.jsonl records every update."""
import importlib
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hindsight.train as ht
from hindsight.methods import LMHead, RolloutShape, get_method
from hindsight.testing import make_batch, tiny_model
from hindsight.ops import token_logprobs
from hindsight.train.loop import run
from tests.methods.helpers import dense_logits, numpy_surrogate


def test_clipped_objective_of_the_second_update_equals_a_float64_reference():
    model = tiny_model(0)
    grpo = get_method("grpo").configure(rollout=RolloutShape(group_size=4))
    # logp_old = the policy's own log-probs: the first update sees ratio 1 exactly.
    batch = {k: np.asarray(v) for k, v in make_batch(model, logp_noise=0.0, seed=5).items()}
    mesh = ht.make_mesh(ht.MeshConfig())
    tx = ht.make_optimizer(ht.OptimConfig(name="sgd", learning_rate=20.0, max_grad_norm=None))
    state, shardings, model_def = ht.create_train_state(model, tx, mesh=mesh)
    step = ht.make_train_step(grpo.loss_fn, model_def=model_def, optimizer=tx, mesh=mesh,
                              shardings=shardings, config=ht.StepConfig(batch_size=8),
                              loss_kwargs={"config": grpo.config}, head=LMHead(chunk_size=16))
    state, first = step(state, batch)
    np.testing.assert_allclose(float(first["ratio"]), 1.0, atol=1e-6)
    assert float(first["clip_low_frac"]) == float(first["clip_high_frac"]) == 0.0
    _, second = step.grads(state, batch)
    assert abs(float(second["ratio"]) - 1.0) > 1e-3
    assert float(second["clip_low_frac"]) + float(second["clip_high_frac"]) > 0

    # float64 NumPy reference of the clipped surrogate at the updated params (dense logits).
    updated = model_def.merge(state.params)
    logp = token_logprobs(dense_logits(updated, batch), jnp.asarray(batch["targets"]))
    c = grpo.config
    total, count = numpy_surrogate(logp, batch["logp_old"], batch["advantages"], batch["mask"],
                                   eps_low=c.eps_low, eps_high=c.eps_high, dual_clip=c.dual_clip)
    assert float(second["count/policy"]) == count
    np.testing.assert_allclose(float(second["loss/policy"]), total / count, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(float(second["loss"]), total / count, rtol=1e-5, atol=1e-7)


def _updates(workdir):
    with open(os.path.join(workdir, "updates.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("method", ["grpo", "dapo"])
def test_tiny_configs_with_two_epochs_of_two_minibatches(method, tmp_path):
    config = importlib.import_module(f"configs.{method}").get_config("tiny")
    config.train.update(num_steps=2, ppo_epochs=2, ppo_minibatches=2)
    config.train.optim.learning_rate = 1.0
    config.eval.num_examples = 0
    workdir = str(tmp_path / method)
    out = run(config, workdir, progress=False)
    assert out["final_step"] == 2
    updates = _updates(workdir)
    assert [(u["step"], u["update"], u["epoch"], u["minibatch"]) for u in updates] == [
        (s, 4 * (s - 1) + i + 1, i // 2, i % 2) for s in (1, 2) for i in range(4)]
    for s in (1, 2):
        mine = [u for u in updates if u["step"] == s]
        np.testing.assert_allclose(mine[0]["ratio"], 1.0, atol=1e-5)  # logp_old is the policy's
        for i, u in enumerate(mine[1:], start=1):
            if any(p["grad_norm"] > 0 for p in mine[:i]):  # the policy moved since the rollout
                assert abs(u["ratio"] - 1.0) > 1e-6, (s, i, u)
    assert any(u["clip_low_frac"] + u["clip_high_frac"] > 0 for u in updates)
    # metrics.jsonl: one record per step, the means over its 4 updates.
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
        steps = [json.loads(line) for line in f if "loss" in line]
    for s, rec in zip((1, 2), steps):
        mine = [u for u in updates if u["step"] == s]
        np.testing.assert_allclose(rec["ratio"], np.mean([u["ratio"] for u in mine]), rtol=1e-6)


def test_resume_with_several_updates_per_step_is_exact(tmp_path):
    """CRAFT (controller updated once per step, frozen reference), 2 epochs x 2 mini-batches:
    3 straight steps == 2 steps + resume, bit for bit."""
    def config(steps):
        c = importlib.import_module("configs.craft").get_config("tiny")
        c.rollout.prompts_per_step = 4
        c.train.update(num_steps=steps, ppo_epochs=2, ppo_minibatches=2, save_every=1)
        c.eval.num_examples = 0
        return c
    straight, resumed = str(tmp_path / "a"), str(tmp_path / "b")
    run(config(3), straight, progress=False)
    run(config(2), resumed, progress=False)
    run(config(3), resumed, progress=False)
    a, b = _updates(straight), _updates(resumed)
    assert len(a) == len(b) == 12
    for key in ("loss", "ratio", "grad_norm", "loss/distill", "weight/distill"):
        assert [u[key] for u in a] == [u[key] for u in b], key
    assert len({u["weight/distill"] for u in a}) == 3  # the controller moved once per step
    import orbax.checkpoint as ocp
    load = lambda w: ocp.StandardCheckpointer().restore(os.path.join(w, "checkpoints", "3",
                                                                     "state"))
    for x, y in zip(jax.tree.leaves(load(straight)), jax.tree.leaves(load(resumed))):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
