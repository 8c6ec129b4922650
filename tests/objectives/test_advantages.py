import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.objectives import group_advantages

from .helpers import jitted


def reference(rewards, g, scale, ddof=1, eps=1e-6):
    r = np.asarray(rewards, np.float64).reshape(-1, g)
    c = r - r.mean(1, keepdims=True)
    if scale == "std":
        c = c / (r.std(1, ddof=ddof, keepdims=True) + eps)
    return c.reshape(-1)


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
    for scale, ddof in [("std", 1), ("std", 0), ("none", 1)]:
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
