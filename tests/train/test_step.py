"""Train step extras: EMA reference, method state, reported metrics, gradient of the token mean."""
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
        schedule=ht.make_schedule(optim), max_grad_norm=optim.max_grad_norm,
        method_update=lambda ms, m: {"calls": ms["calls"] + 1.0 + 0.0 * m["loss"]})
    batch = ht.shard_batch(make_batch(8, seed=4), mesh)
    ref0 = flat(state.reference)
    params = []
    for _ in range(2):
        state, metrics = step(state, batch)
        params.append(flat(state.params))
    assert seen and seen[0] == ["calls"]
    assert float(state.method_state["calls"]) == 2.0 and int(state.step) == 2
    # Second update: lr = 0.1 * (1 - 0/4) after one warm-up step; kl reported (ema != params).
    np.testing.assert_allclose(float(metrics["learning_rate"]), 0.1, rtol=1e-6)
    for key in ("loss", "count", "grad_norm", "grad_clipped", "kl", "entropy", "clip_low_frac"):
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


def test_split_microbatches_keeps_rows_on_their_shard():
    rows = jnp.arange(16)
    micro = np.asarray(ht.split_microbatches(rows, 2, 4))
    # Shard s holds rows [4s, 4s+4); micro-batch m takes rows 4s+2m, 4s+2m+1 of every shard.
    np.testing.assert_array_equal(micro, [[0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15]])
    np.testing.assert_array_equal(np.asarray(ht.split_microbatches(rows, 4, 1)).ravel(), rows)
