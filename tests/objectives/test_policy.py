import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.objectives import MODES, clipped_surrogate, finalize, finalize_metrics, policy_loss

from .helpers import jitted, pad_rows_cols, random_mask, row_chunks
from .test_aggregation import kwargs, reference as agg_reference


def surrogate_reference(logp, logp_old, adv, mask, el, eh, c):
    """Per-token loss, d loss / d logp and clip indicators, float64."""
    m = mask > 0
    adv = np.broadcast_to(np.asarray(adv, np.float64).reshape(adv.shape[0], -1), logp.shape)
    lr = np.where(m, np.asarray(logp, np.float64) - logp_old, 0.0)
    rho = np.exp(np.clip(lr, -20, 20))
    unclipped, clipped = -adv * rho, -adv * np.clip(rho, 1 - el, 1 + eh)
    loss = np.maximum(unclipped, clipped)
    grad = np.where(unclipped >= clipped, -adv * rho * (np.abs(lr) < 20), 0.0)
    if c is not None:
        dual = (adv < 0) & (loss > -adv * c)
        loss, grad = np.where(dual, -adv * c, loss), np.where(dual, 0.0, grad)
    flags = {"clip_low_frac": m & (adv < 0) & (rho < 1 - el),
             "clip_high_frac": m & (adv > 0) & (rho > 1 + eh),
             "dual_clip_frac": m & (adv < 0) & (rho > (c or np.inf)), "ratio": rho, "approx_kl": -lr}
    return np.where(m, loss, 0.0), np.where(m, grad, 0.0), flags


def k3_reference(logp, logp_ref):
    d = np.clip(np.asarray(logp_ref, np.float64) - logp, -20, 20)
    return np.clip(np.exp(d) - d - 1, -10, 10)


def inputs(rng, b, t, token_adv=False):
    mask = random_mask(rng, b, t, contiguous=bool(rng.integers(2)))
    logp_old = -rng.exponential(1.5, size=(b, t)).astype(np.float32)
    logp = (logp_old + rng.normal(scale=0.4, size=(b, t))).astype(np.float32)
    logp_ref = (logp + rng.normal(scale=0.3, size=(b, t))).astype(np.float32)
    adv = rng.normal(size=(b, t) if token_adv else (b,)).astype(np.float32)
    return logp, logp_old, adv, mask, logp_ref


@pytest.mark.parametrize("dual_clip", [3.0, None])
def test_spec_dapo_numbers(dual_clip):
    # Spec cases (eps_low=0.2, eps_high=0.28): rho=1.35, A=+1 -> -1.28; rho=0.7, A=-1 -> +0.8; rho=1.35,
    # A=-1 -> +1.35. The third never reaches the dual clip: for A < 0 the max picks the unclipped
    # -A*rho = 1.35 (above -A*1.28), and 1.35 < c = 3 leaves it, with or without dual clip. The last row
    # is where the dual clip binds: rho = 4 > c caps the loss at -A*c = 3.
    rho, adv = jnp.array([[1.35], [0.7], [1.35], [4.0]]), jnp.array([1.0, -1.0, -1.0, -1.0])
    f = jitted(clipped_surrogate, eps_low=0.2, eps_high=0.28, dual_clip=dual_clip)
    loss, metrics = f(jnp.log(rho), jnp.zeros((4, 1)), adv, jnp.ones((4, 1)))
    np.testing.assert_allclose(loss[:, 0], [-1.28, 0.8, 1.35, 3.0 if dual_clip else 4.0], rtol=1e-6)
    assert float(metrics["dual_clip_frac"][0]) == (1.0 if dual_clip else 0.0)
    assert float(metrics["clip_high_frac"][0]) == 1.0 and float(metrics["clip_low_frac"][0]) == 1.0


@pytest.mark.parametrize("b,t,token_adv,el,eh,c", [
    (2, 1, False, 0.2, 0.2, 3.0), (6, 11, False, 0.2, 0.28, 3.0),
    (8, 17, True, 0.1, 0.3, None), (4, 5, True, 0.2, 0.28, 1.5)])
def test_surrogate_matches_reference(b, t, token_adv, el, eh, c):
    rng = np.random.default_rng(b * t)
    logp, logp_old, adv, mask, _ = inputs(rng, b, t, token_adv)
    if c == 1.5:  # push ratios past every clip
        logp = logp + rng.choice([-2.0, 2.0, 25.0], size=logp.shape).astype(np.float32)
    ref_loss, ref_grad, flags = surrogate_reference(logp, logp_old, adv, mask, el, eh, c)

    def run(x):
        loss, metrics = clipped_surrogate(x, jnp.asarray(logp_old), jnp.asarray(adv), jnp.asarray(mask),
                                          eps_low=el, eps_high=eh, dual_clip=c)
        return jnp.sum(loss), (loss, metrics)

    grad, (loss, metrics) = jax.jit(jax.grad(run, has_aux=True))(jnp.asarray(logp))
    assert loss.dtype == jnp.float32 and loss.shape == (b, t)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-6)
    n = mask.sum()
    for name, values in flags.items():
        s, cnt = metrics[name]
        assert float(cnt) == n
        np.testing.assert_allclose(s, np.where(mask > 0, values, 0.0).sum(), rtol=1e-5, atol=1e-5)


def test_policy_loss_matches_reference():
    rng = np.random.default_rng(11)
    arrays = [jnp.asarray(x) for x in inputs(rng, 6, 9)]
    logp, logp_old, adv, mask, logp_ref = (np.asarray(x) for x in arrays)
    ref_loss, _, _ = surrogate_reference(logp, logp_old, adv, mask, 0.2, 0.28, 3.0)
    kl = k3_reference(logp, logp_ref)
    f = jax.jit(lambda *a: {mode: (policy_loss(*a[:4], logp_ref=a[4], eps_high=0.28, mode=mode, kl_coef=0.1,
                                               kl_estimator="k3", **kwargs(mode)),
                                   policy_loss(*a[:4], eps_high=0.28, mode=mode, **kwargs(mode)))
                            for mode in MODES})
    for mode, ((s, c, metrics), (s0, c0, m0)) in f(*arrays).items():
        pg_s, count = agg_reference(ref_loss, mask, mode)
        kl_s, _ = agg_reference(kl, mask, mode)
        assert float(c) == count and float(c0) == count
        np.testing.assert_allclose(s, pg_s + 0.1 * kl_s, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(metrics["pg_loss"][0], pg_s, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(metrics["kl"][0], kl_s, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(s0, pg_s, rtol=1e-5, atol=1e-6)
        assert "kl" not in m0


def test_padding_and_micro_batching():
    rng = np.random.default_rng(5)
    arrays = inputs(rng, 8, 10, token_adv=True)
    # Every mode in one compiled function: one compile per input shape.
    f = jax.jit(lambda *a: {mode: policy_loss(*a[:4], logp_ref=a[4], mode=mode, kl_coef=0.05, **kwargs(mode))
                            for mode in MODES})
    full = f(*map(jnp.asarray, arrays))
    padded = f(*(jnp.asarray(pad_rows_cols(x, 2, 3, v)) for x, v in zip(arrays, (1e4, -1e4, 5.0, 0.0, -3.0))))
    parts = [f(*(jnp.asarray(x[sl]) for x in arrays)) for sl in row_chunks(8, (3, 5))]
    combined = jax.tree.map(lambda *p: sum(p), *parts)
    for mode in MODES:
        expected, expected_metrics = finalize(*full[mode][:2]), finalize_metrics(full[mode][2])
        for other in (padded[mode], combined[mode]):
            np.testing.assert_allclose(finalize(*other[:2]), expected, rtol=1e-6, atol=1e-7)
            for name, value in finalize_metrics(other[2]).items():
                np.testing.assert_allclose(value, expected_metrics[name], rtol=1e-6, atol=1e-7)


def test_grads_finite_extremes_vmap_bf16():
    rng = np.random.default_rng(2)
    logp, logp_old, adv, mask, logp_ref = (np.stack(z) for z in zip(*(inputs(rng, 4, 6) for _ in range(2))))
    logp[:, 2, :3] = [1e4, -1e4, 0.0]
    logp[:, 0] = np.nan  # all-masked rows may hold garbage
    logp_ref[:, 2, :3] = [-1e4, 1e4, -1e4]
    f = jax.jit(jax.vmap(lambda *a: finalize(*policy_loss(*a[:4], logp_ref=a[4], kl_coef=0.1,
                                                          kl_estimator="k3+")[:2])))
    args = [jnp.asarray(x) for x in (logp, logp_old, adv, mask, logp_ref)]
    out = f(*args)
    assert out.shape == (2,) and np.all(np.isfinite(out))
    grads = jax.jit(jax.grad(lambda x: jnp.sum(f(x, *args[1:]))))(args[0])
    assert np.all(np.isfinite(grads)) and np.all(np.asarray(grads)[mask == 0] == 0.0)
    soft = [jnp.asarray(x) for x in (np.nan_to_num(logp_old + 0.1), logp_old, adv, mask, logp_old - 0.2)]
    low = f(*(x.astype(jnp.bfloat16) if i != 3 else x for i, x in enumerate(soft)))
    assert low.dtype == jnp.float32
    np.testing.assert_allclose(low, f(*soft), rtol=3e-2, atol=3e-2)


def test_bad_input():
    z, m = jnp.zeros((2, 3)), jnp.ones((2, 3))
    with pytest.raises(ValueError, match=r"`advantages` must have shape \(2,\) .* or \(2, 3\).*got \(3,\)"):
        clipped_surrogate(z, z, jnp.zeros(3), m)
    with pytest.raises(ValueError, match=r"`logp` \(2, 3\), `logp_old` \(2, 4\)"):
        clipped_surrogate(z, jnp.zeros((2, 4)), jnp.zeros(2), m)
    with pytest.raises(ValueError, match="`dual_clip` must be > 1"):
        clipped_surrogate(z, z, jnp.zeros(2), m, dual_clip=0.5)
    with pytest.raises(ValueError, match=r"`kl_coef`=0.001 needs `logp_ref`.*\(2, 3\)"):
        policy_loss(z, z, jnp.zeros(2), m, kl_coef=0.001)
    with pytest.raises(ValueError, match="`kl_estimator` must be one of"):
        policy_loss(z, z, jnp.zeros(2), m, logp_ref=z, kl_coef=0.1, kl_estimator="k4")
    with pytest.raises(ValueError, match=r"`logp` \(2, 3\), `logp_ref` \(3, 2\)"):
        policy_loss(z, z, jnp.zeros(2), m, logp_ref=jnp.zeros((3, 2)))
    with pytest.raises(ValueError, match="needs `norm`"):
        policy_loss(z, z, jnp.zeros(2), m, mode="seq-mean-token-sum-norm")
