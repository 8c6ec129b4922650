"""Optimizer chain and schedules."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import hindsight.train as ht


def test_warmup_then_cosine():
    cfg = ht.OptimConfig(learning_rate=1.0, schedule="cosine", warmup_steps=4, total_steps=14,
                         final_lr_ratio=0.1)
    lr = ht.make_schedule(cfg)
    np.testing.assert_allclose([float(lr(s)) for s in (0, 2, 4)], [0.0, 0.5, 1.0], atol=1e-7)
    # Half-way through the decay: 0.1 + 0.9 * (1 + cos(pi/2)) / 2 = 0.55.
    np.testing.assert_allclose(float(lr(9)), 0.55, atol=1e-6)
    np.testing.assert_allclose(float(lr(14)), 0.1, atol=1e-6)


def test_constant_and_linear():
    assert float(ht.make_schedule(ht.OptimConfig(learning_rate=3e-4))(1000)) == pytest.approx(3e-4)
    lin = ht.make_schedule(ht.OptimConfig(learning_rate=1.0, schedule="linear", total_steps=10))
    np.testing.assert_allclose(float(lin(5)), 0.5, atol=1e-7)


def test_clipping_and_weight_decay_mask():
    params = {"w": jnp.ones((2, 2)), "scale": jnp.ones((2,))}
    grads = {"w": jnp.full((2, 2), 3.0), "scale": jnp.full((2,), 4.0)}
    # SGD with clipping at norm 1: the update is -lr * g / |g|.
    tx = ht.make_optimizer(ht.OptimConfig(name="sgd", learning_rate=1.0, max_grad_norm=1.0))
    upd, _ = tx.update(grads, tx.init(params), params)
    norm = float(optax.global_norm(grads))
    np.testing.assert_allclose(upd["w"], -3.0 / norm, rtol=1e-6)
    # AdamW decays matrices only: with zero gradients the update is -lr * wd * p for "w", 0 else.
    tx = ht.make_optimizer(ht.OptimConfig(learning_rate=0.5, weight_decay=0.1, max_grad_norm=None))
    zeros = jax.tree.map(jnp.zeros_like, params)
    upd, _ = tx.update(zeros, tx.init(params), params)
    np.testing.assert_allclose(upd["w"], -0.05, rtol=1e-6)
    np.testing.assert_allclose(upd["scale"], 0.0)
