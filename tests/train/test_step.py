"""Train step extras: EMA reference, method state, reported metrics, the row layout."""
import jax.numpy as jnp
import numpy as np
import pytest

import hindsight.train as ht
from tests.train.helpers import TinyMLPLM, flat, grpo_loss, make_batch


def test_ema_reference_method_state_and_metrics():
    mesh = ht.make_mesh(ht.MeshConfig())
    optim = ht.OptimConfig(learning_rate=0.1, schedule="linear", warmup_steps=1, total_steps=5)
    tx = ht.make_optimizer(optim)
    seen = []

    def loss_fn(model, batch, *, reference, method_state):
        seen.append(sorted(method_state))
        return grpo_loss(model, batch, reference=reference, kl_coef=0.1)

    state, shardings, model_def = ht.create_train_state(
        TinyMLPLM(), tx, mesh=mesh, reference="ema", method_state={"calls": jnp.float32(0.0)})
    step = ht.make_train_step(
        loss_fn, model_def=model_def, optimizer=tx, mesh=mesh, shardings=shardings,
        config=ht.StepConfig(batch_size=8, num_microbatches=2, reference="ema", ema_decay=0.75),
        schedule=ht.make_schedule(optim), max_grad_norm=optim.max_grad_norm)
    batch = make_batch(8, seed=4)
    ref0 = flat(state.reference)
    params = []
    for _ in range(2):
        state, metrics = step(state, batch)
        params.append(flat(state.params))
    assert seen and seen[0] == ["calls"]
    # The step passes the method state to the loss and keeps it: it is updated by the loop, at
    # rollout boundaries.
    assert float(state.method_state["calls"]) == 0.0 and int(state.step) == 2
    # Second update: lr = 0.1 * (1 - 0/4) after one warm-up step; kl reported (ema != params).
    np.testing.assert_allclose(float(metrics["learning_rate"]), 0.1, rtol=1e-6)
    for key in ("loss", "loss/policy", "count/policy", "weight/policy", "grad_norm",
                "grad_clipped", "kl", "entropy", "clip_low_frac"):
        assert key in metrics and np.isfinite(float(metrics[key])), key
    # EMA after two steps: r2 = d^2 r0 + d (1 - d) p1 + (1 - d) p2.
    ref2, (p1, p2), d = flat(state.reference), params, 0.75
    for k in ref0:
        np.testing.assert_allclose(ref2[k], d * d * ref0[k] + d * (1 - d) * p1[k] + (1 - d) * p2[k],
                                   rtol=1e-5, atol=1e-7, err_msg=k)
    assert any(np.abs(ref2[k] - ref0[k]).max() > 0 for k in ref0)


def test_reference_mismatch_is_rejected():
    mesh = ht.make_mesh(ht.MeshConfig())
    tx = ht.make_optimizer(ht.OptimConfig(name="sgd"))
    state, shardings, model_def = ht.create_train_state(TinyMLPLM(), tx, mesh=mesh)
    with pytest.raises(ValueError, match=r"step.reference='frozen' does not match the train state"):
        ht.make_train_step(grpo_loss, model_def=model_def, optimizer=tx, mesh=mesh,
                           shardings=shardings,
                           config=ht.StepConfig(batch_size=8, reference="frozen"))


def test_shard_batch_cuts_contiguous_microbatches():
    mesh = ht.make_mesh(ht.MeshConfig())
    micro = np.asarray(ht.shard_batch({"r": np.arange(16)}, mesh, num_microbatches=4)["r"])
    # One process: micro-batch m is rows [4m, 4m + 4), so groups of 4 stay whole.
    np.testing.assert_array_equal(micro, np.arange(16).reshape(4, 4))


@pytest.mark.parametrize("rows, micro, mini, group, shards, procs, couples, match", [
    (32, 4, 2, 8, 1, 1, True, "couples the rows of a group"),   # 4-row micro-batches < G
    (32, 4, 2, 8, 8, 1, False, r"pieces"),                      # 16 rows over 4 x 8
    (24, 1, 2, 8, 1, 1, False, "mini-batches of whole groups"),  # 3 groups into 2
    (16, 1, 1, 8, 1, 4, False, "mini-batches of whole groups"),  # 2 groups over 4 processes
])
def test_check_layout_refuses_split_groups(rows, micro, mini, group, shards, procs, couples,
                                           match):
    with pytest.raises(ValueError, match=match) as e:
        ht.check_layout(batch_size=rows, num_microbatches=micro, group_size=group,
                        ppo_minibatches=mini, mesh_shape={"data": shards, "fsdp": 1, "tensor": 1},
                        process_count=procs, couples_rows=couples)
    for part in (f"group_size={group}", f"train.num_microbatches={micro}",
                 f"train.ppo_minibatches={mini}", f"data={shards}"):
        assert part in str(e.value), part
    # A layout whose groups span devices but not micro-batches is fine (XLA moves the rows).
    ht.check_layout(batch_size=32, num_microbatches=2, group_size=8, ppo_minibatches=2,
                    mesh_shape={"data": 8, "fsdp": 1, "tensor": 1}, couples_rows=True)


def test_a_nonfinite_update_is_not_applied():
    mesh = ht.make_mesh(ht.MeshConfig())
    tx = ht.make_optimizer(ht.OptimConfig(name="adamw", learning_rate=0.1))
    state, shardings, model_def = ht.create_train_state(TinyMLPLM(), tx, mesh=mesh,
                                                        reference="ema")

    def loss_fn(model, batch, *, poison):
        out = grpo_loss(model, batch)
        t = out.terms["policy"]
        return type(out)({"policy": type(t)(t.sum * poison, t.count)}, out.metrics)

    make = lambda poison: ht.make_train_step(
        loss_fn, model_def=model_def, optimizer=tx, mesh=mesh, shardings=shardings,
        loss_kwargs={"poison": poison},
        config=ht.StepConfig(batch_size=8, reference="ema", ema_decay=0.5))
    batch = make_batch(8, seed=4)
    before = flat(state)
    state, metrics = make(float("nan"))(state, batch)
    assert float(metrics["nonfinite"]) == 1.0 and not np.isfinite(float(metrics["loss"]))
    after = flat(state)
    for k in before:
        if k.startswith(("params", "opt_state", "reference")):
            np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    assert int(state.step) == 1  # the counter still advances
    state, metrics = make(1.0)(state, batch)
    assert float(metrics["nonfinite"]) == 0.0
    assert any(np.abs(flat(state)[k] - before[k]).max() > 0 for k in before
               if k.startswith("params"))
