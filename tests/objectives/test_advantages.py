import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.objectives import group_advantages
from hindsight.objectives.advantages import TRL_EPS

from .helpers import jitted


def reference(rewards, g, scale, ddof=1, eps=1e-6):
    r = np.asarray(rewards, np.float64).reshape(-1, g)
    c = r - r.mean(1, keepdims=True)
    if scale == "std":
        c = c / (r.std(1, ddof=ddof, keepdims=True) + eps)
    elif scale == "batch":
        c = c / (r.std(ddof=ddof) + eps)
    return c.reshape(-1)


def trl_nanstd(x, axis=None):
    """TRL ``nanstd`` (trl/trainer/utils.py) without NaNs: Bessel-corrected, NaN for a single value."""
    x = np.asarray(x, np.float64)
    mean = x.mean(axis=axis, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=axis, keepdims=True)
    count = x.shape[axis] if axis is not None else x.size
    variance = variance * (count / (count - 1) if count > 1 else np.nan)
    return np.sqrt(variance) if axis is not None else np.sqrt(variance).squeeze()


def trl_advantages(rewards, num_generations, scale_rewards):
    """TRL ``GRPOTrainer`` advantages, ``multi_objective_aggregation="sum_then_normalize"``, one reward
    function, float64: group mean subtracted; std of the group (``"group"``) or of the whole batch
    (``"batch"``), ``+ 1e-4``; ``"none"`` leaves the centred reward."""
    rewards = np.asarray(rewards, np.float64)
    mean_grouped = np.repeat(rewards.reshape(-1, num_generations).mean(1), num_generations)
    if scale_rewards in ("group", "none"):
        std = np.repeat(trl_nanstd(rewards.reshape(-1, num_generations), axis=1), num_generations)
    else:
        std = np.broadcast_to(trl_nanstd(rewards), rewards.shape)
    advantages = rewards - mean_grouped
    if scale_rewards != "none":
        advantages = advantages / (std.reshape(-1) + 1e-4)
    return np.nan_to_num(advantages, nan=0.0)


def test_spec_base_numbers():
    r = jnp.array([1.0, 0.0, 0.0, 1.0])
    np.testing.assert_allclose(jitted(group_advantages, group_size=4)(r), [0.866, -0.866, -0.866, 0.866],
                               atol=3e-4)
    np.testing.assert_allclose(jitted(group_advantages, group_size=4)(r), reference(r, 4, "std"), rtol=1e-6)
    np.testing.assert_allclose(jitted(group_advantages, group_size=4, ddof=0)(r), [1.0, -1.0, -1.0, 1.0],
                               atol=1e-5)
    np.testing.assert_array_equal(jitted(group_advantages, group_size=4, scale="none")(r),
                                  [0.5, -0.5, -0.5, 0.5])


def test_spec_hdl_grpo16():
    r = np.array([0, 1, 0, 0, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0, 1], np.float32)
    assert abs(r.mean() - 0.5625) < 1e-7 and abs(r.std(ddof=1) - 0.51235) < 1e-5
    a = np.asarray(jitted(group_advantages, group_size=16)(jnp.asarray(r)))
    np.testing.assert_allclose(a[r == 1], 0.8539, atol=1e-4)
    np.testing.assert_allclose(a[r == 0], -1.0979, atol=1e-4)


@pytest.mark.parametrize("p,g", [(1, 2), (3, 4), (2, 16)])
def test_matches_float64_reference(p, g):
    rng = np.random.default_rng(p * 100 + g)
    r = jnp.asarray(rng.normal(size=p * g).astype(np.float32) * 3)
    for scale, ddof in [("std", 1), ("std", 0), ("none", 1), ("batch", 1), ("batch", 0)]:
        out = jitted(group_advantages, group_size=g, scale=scale, ddof=ddof)(r)
        chex.assert_shape(out, (p * g,))
        chex.assert_type(out, jnp.float32)
        np.testing.assert_allclose(out, reference(r, g, scale, ddof), rtol=1e-5, atol=1e-6)


def test_zero_variance_and_binary_groups():
    # 0.3 is not exact in float32: a float32 mean can miss it by an ulp, which 1/eps would amplify.
    r = jnp.array([0.3, 0.3, 0.3, 0.3, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 7.1, 7.1, 7.1, 7.1])
    a = jitted(group_advantages, group_size=4)(r)
    assert np.all(np.asarray(a[:8]) == 0.0) and np.all(np.asarray(a[12:]) == 0.0)
    np.testing.assert_allclose(a[8:12], reference(r[8:12], 4, "std"), rtol=1e-5)
    assert np.all(np.asarray(jitted(group_advantages, group_size=4, scale="none")(r)[:8]) == 0.0)


@pytest.mark.parametrize("p,g", [(1, 2), (3, 4), (4, 8)])
def test_trl_scale_rewards_parity(p, g):
    """scale="std"/"batch"/"none" with eps=TRL_EPS reproduce TRL's scale_rewards="group"/"batch"/"none"."""
    assert TRL_EPS == 1e-4
    rng = np.random.default_rng(p * 10 + g)
    binary = rng.integers(0, 2, size=p * g).astype(np.float32)
    binary[:g] = 1.0  # a constant group inside a non-constant batch: TRL's value is exactly 0 as ours
    for r in (binary, (rng.normal(size=p * g) * 2).astype(np.float32)):
        for ours, trl in (("std", "group"), ("batch", "batch"), ("none", "none")):
            out = jitted(group_advantages, group_size=g, scale=ours, eps=TRL_EPS)(jnp.asarray(r))
            np.testing.assert_allclose(out, trl_advantages(r, g, trl), rtol=1e-5, atol=1e-6)
    # Our default eps stays verl's 1e-6, which differs from TRL's value.
    r = jnp.asarray(binary)
    if np.ptp(binary) > 0:
        assert not np.allclose(jitted(group_advantages, group_size=g, scale="batch")(r),
                               trl_advantages(binary, g, "batch"), rtol=1e-6, atol=0)


def test_batch_scale_equal_rewards_nan_free():
    f = jax.jit(lambda x, eps: group_advantages(x, 4, "batch", eps=eps), static_argnums=1)
    for eps in (1e-6, 0.0):
        for r in (jnp.full(8, 0.3), jnp.array([0.3, 0.3, 0.3, 0.3, 0.0, 1.0, 0.0, 1.0])):
            out = f(r, eps)
            assert np.all(np.isfinite(out)) and np.all(np.asarray(out[:4]) == 0.0)
            grads = jax.jit(jax.grad(lambda x: jnp.sum(f(x, eps) * jnp.arange(8.0))))(r)
            assert np.all(np.isfinite(grads))
        g_std = jax.jit(jax.grad(lambda x: jnp.sum(group_advantages(x, 4, eps=eps) * jnp.arange(8.0))))
        assert np.all(np.isfinite(g_std(jnp.full(8, 0.3))))  # eps=0 with a zero std: no 0/0 in backward
    np.testing.assert_allclose(f(jnp.array([0.3, 0.3, 0.3, 0.3, 0.0, 1.0, 0.0, 1.0]), 1e-6)[4:],
                               reference([0.3] * 4 + [0.0, 1.0, 0.0, 1.0], 4, "batch")[4:], rtol=1e-5)
    assert np.all(np.asarray(group_advantages(jnp.array([1.0, 0.0, 2.5]), 1, "batch")) == 0.0)
    with pytest.raises(ValueError, match="`singleton`='reward'.*`scale`='batch'"):
        group_advantages(jnp.array([1.0, 0.0]), 1, "batch", singleton="reward")


def test_singleton_groups():
    r = jnp.array([1.0, 0.0, 2.5])
    assert np.all(np.asarray(group_advantages(r, 1)) == 0.0)
    np.testing.assert_allclose(jitted(group_advantages, group_size=1, singleton="reward")(r),
                               np.asarray(r) / (1 + 1e-6), rtol=1e-7)
    np.testing.assert_allclose(jitted(group_advantages, group_size=1, scale="none", singleton="reward")(r), r)


def test_vmap_grad_bf16():
    rng = np.random.default_rng(0)
    r = jnp.asarray(rng.integers(0, 2, size=(3, 8)).astype(np.float32))
    r = r.at[0].set(1.0)  # a zero-variance group: the std's sqrt must not poison the gradient
    f = jax.vmap(lambda x: group_advantages(x, 4))
    out = jax.jit(f)(r)
    for i in range(3):
        np.testing.assert_allclose(out[i], reference(r[i], 4, "std"), rtol=1e-5, atol=1e-6)
    grads = jax.jit(jax.grad(lambda x: jnp.sum(f(x) * jnp.arange(8.0))))(r)
    assert np.all(np.isfinite(grads))
    rb = jnp.asarray(rng.normal(size=8), jnp.bfloat16)
    out_b = jitted(group_advantages, group_size=4)(rb)
    chex.assert_type(out_b, jnp.float32)
    np.testing.assert_allclose(out_b, reference(np.asarray(rb, np.float32), 4, "std"), rtol=1e-5, atol=1e-5)


def test_bad_input():
    r = jnp.zeros(6)
    with pytest.raises(ValueError, match=r"group_size.*=4.*B=6"):
        group_advantages(r, 4)
    with pytest.raises(ValueError, match="positive Python int"):
        group_advantages(r, 0)
    with pytest.raises(ValueError, match="`scale`"):
        group_advantages(r, 3, scale="mad")
    with pytest.raises(ValueError, match=r"`rewards` must have rank 1, got shape \(2, 3\)"):
        group_advantages(jnp.zeros((2, 3)), 3)
    with pytest.raises(ValueError, match="`singleton`"):
        group_advantages(r, 1, singleton="verl")
