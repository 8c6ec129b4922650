import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.objectives import ESTIMATORS, kl_penalty

from .helpers import jitted, np_log_softmax, random_mask


def reference(logp, logp_ref, estimator):
    lr = np.asarray(logp, np.float64) - np.asarray(logp_ref, np.float64)
    if estimator.startswith("k1"):
        return lr
    if estimator == "k2":
        return 0.5 * lr ** 2
    if estimator == "abs":  # verl kl_penalty_forward "abs": (logprob - ref_logprob).abs()
        return np.abs(lr)
    d = np.clip(-lr, -20, 20)
    return np.clip(np.exp(d) - d - 1, -10, 10)


def test_spec_k3_number():
    out = kl_penalty(jnp.log(jnp.array([0.8])), jnp.log(jnp.array([0.4])), estimator="k3")
    np.testing.assert_allclose(out, [0.5 - np.log(0.5) - 1], rtol=1e-6)
    np.testing.assert_allclose(out, [0.19315], atol=5e-6)


@pytest.mark.parametrize("shape", [(3,), (2, 3, 5)])
def test_values_and_gradients_match_reference(shape):
    rng = np.random.default_rng(len(shape))
    logp = -rng.exponential(2.0, size=shape).astype(np.float32)
    logp_ref = (logp + rng.normal(scale=3.0, size=shape)).astype(np.float32)
    logp_ref.flat[0] = logp.flat[0] + 30.0  # exercises both k3 clips
    for est in ESTIMATORS:
        out, vjp = jax.jit(jax.vjp, static_argnums=0)(
            functools.partial(kl_penalty, logp_ref=jnp.asarray(logp_ref), estimator=est), jnp.asarray(logp))
        assert out.dtype == jnp.float32 and out.shape == shape
        np.testing.assert_allclose(out, reference(logp, logp_ref, est), rtol=1e-5, atol=1e-5)
        grad, = vjp(jnp.ones(shape))
        if est.endswith("+") or est == "k2":  # straight-through: the gradient of k2
            np.testing.assert_allclose(grad, logp.astype(np.float64) - logp_ref, rtol=1e-5, atol=1e-5)
        elif est == "k1":
            np.testing.assert_allclose(grad, np.ones(shape))
        elif est == "abs":
            np.testing.assert_array_equal(grad, np.sign(logp.astype(np.float64) - logp_ref))


def test_abs_estimator_masked_and_zero_gradient():
    logp = jnp.array([[-1.0, -2.0, -0.5, np.nan], [-3.0, -1.0, -4.0, -2.0]])
    logp_ref = jnp.array([[-1.5, -2.0, 0.5, -1.0], [-1.0, -1.0, -1.0, -1.0]])
    mask = jnp.array([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # row 1 all masked
    f = jax.jit(lambda a: kl_penalty(a, logp_ref, mask, estimator="abs"))
    out = f(logp)
    expected = np.where(np.asarray(mask) > 0, np.abs(np.nan_to_num(np.asarray(logp, np.float64))
                                                      - np.asarray(logp_ref, np.float64)), 0.0)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    grad = jax.jit(jax.grad(lambda a: jnp.sum(f(a))))(logp)
    # sign(logp - logp_ref), 0 where they are equal (torch's abs) and at every masked position.
    np.testing.assert_array_equal(grad, [[1.0, 0.0, -1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


def test_direction_is_kl_policy_to_reference():
    """Averaged over tokens drawn from pi_theta, k1 and k3 give KL(pi_theta || pi_ref), not the reverse."""
    lp = np_log_softmax(np.array([1.0, -0.5, 0.3, 2.0]))
    lq = np_log_softmax(np.array([0.2, 0.9, -1.0, 0.5]))
    p = np.exp(lp)
    exact = (p * (lp - lq)).sum()
    for est in ("k1", "k3", "k1+", "k3+"):
        per_token = np.asarray(jitted(kl_penalty, estimator=est)(jnp.asarray(lp, jnp.float32),
                                                                 jnp.asarray(lq, jnp.float32)), np.float64)
        np.testing.assert_allclose((p * per_token).sum(), exact, rtol=1e-5)
    assert abs(exact - (np.exp(lq) * (lq - lp)).sum()) > 1e-2  # the two directions differ here


def test_mask_extremes_jit_vmap_bf16():
    rng = np.random.default_rng(0)
    mask = jnp.asarray(np.stack([random_mask(rng, 3, 6), random_mask(rng, 3, 6, contiguous=False)]))
    logp = jnp.asarray(rng.choice([-1e4, 1e4, -0.5], size=(2, 3, 6)).astype(np.float32))
    logp_ref = jnp.asarray(-rng.exponential(size=(2, 3, 6)).astype(np.float32))
    logp = logp.at[0, 0].set(jnp.nan)  # garbage in an all-masked row
    for est in ESTIMATORS:
        f = jax.jit(jax.vmap(lambda a, b, m, est=est: kl_penalty(a, b, m, estimator=est)))
        out = f(logp, logp_ref, mask)
        assert np.all(np.isfinite(out)) and np.all(np.asarray(out)[np.asarray(mask) == 0] == 0.0)
        g = jax.jit(jax.grad(lambda a: jnp.sum(f(a, logp_ref, mask))))(logp)
        assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[np.asarray(mask) == 0] == 0.0)
        soft = jnp.asarray(-rng.exponential(size=(2, 3, 6)).astype(np.float32))
        ref = np.where(np.asarray(mask) > 0, reference(soft, logp_ref, est), 0.0)
        low = f(soft.astype(jnp.bfloat16), logp_ref.astype(jnp.bfloat16), mask)
        assert low.dtype == jnp.float32
        np.testing.assert_allclose(low, ref, rtol=3e-2, atol=3e-2)


def test_bad_input():
    with pytest.raises(ValueError, match="`estimator` must be one of"):
        kl_penalty(jnp.zeros(3), jnp.zeros(3), estimator="low_var_kl")
    with pytest.raises(ValueError, match=r"`logp` \(3,\), `logp_ref` \(4,\)"):
        kl_penalty(jnp.zeros(3), jnp.zeros(4))
    with pytest.raises(ValueError, match=r"`logp` \(3,\), `mask` \(2,\)"):
        kl_penalty(jnp.zeros(3), jnp.zeros(3), jnp.ones(2))
