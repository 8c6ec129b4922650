import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.objectives import MODES, clipped_surrogate, finalize, finalize_metrics, policy_loss
from hindsight.objectives.policy import RATIO_LEVELS, SEQ_LOG_RATIO_MAX

from .helpers import jitted, pad_rows_cols, random_mask, row_chunks
from .test_aggregation import kwargs, reference as agg_reference


def surrogate_reference(logp, logp_old, adv, mask, el, eh, c, level="token"):
    """Per-token loss, d sum(loss) / d logp and clip indicators, float64.

    ``level="sequence"``: every token of row b uses s_b = exp(min(mean_t lr, 10)) and, in the token-level
    gradient form, gets d l / d s_b * s_b (0 above the clamp).
    """
    m = mask > 0
    adv = np.broadcast_to(np.asarray(adv, np.float64).reshape(adv.shape[0], -1), logp.shape)
    lr = np.where(m, np.asarray(logp, np.float64) - logp_old, 0.0)
    if level == "token":
        rho, gate = np.exp(np.clip(lr, -20, 20)), np.abs(lr) < 20
    else:
        seq = np.broadcast_to((lr.sum(-1) / np.maximum(m.sum(-1), 1))[:, None], lr.shape)
        rho, gate = np.exp(np.minimum(seq, 10.0)), seq <= 10.0
    unclipped, clipped = -adv * rho, -adv * np.clip(rho, 1 - el, 1 + eh)
    loss = np.maximum(unclipped, clipped)
    grad = np.where(unclipped >= clipped, -adv * rho * gate, 0.0)
    if c is not None:
        dual = (adv < 0) & (loss > -adv * c)
        loss, grad = np.where(dual, -adv * c, loss), np.where(dual, 0.0, grad)
    flags = {"clip_low_frac": m & (adv < 0) & (rho < 1 - el),
             "clip_high_frac": m & (adv > 0) & (rho > 1 + eh),
             "dual_clip_frac": m & (adv < 0) & (rho > (c or np.inf)), "ratio": rho,
             "approx_kl": -np.clip(lr, -20, 20)}
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


@pytest.mark.parametrize("ratio_level", RATIO_LEVELS)
def test_grads_finite_extremes_vmap_bf16(ratio_level):
    rng = np.random.default_rng(2)
    logp, logp_old, adv, mask, logp_ref = (np.stack(z) for z in zip(*(inputs(rng, 4, 6) for _ in range(2))))
    logp[:, 2, :3] = [1e4, -1e4, 0.0]
    logp[:, 0] = np.nan  # all-masked rows may hold garbage
    logp_ref[:, 2, :3] = [-1e4, 1e4, -1e4]
    f = jax.jit(jax.vmap(lambda *a: finalize(*policy_loss(*a[:4], logp_ref=a[4], kl_coef=0.1,
                                                          kl_estimator="k3+", ratio_level=ratio_level)[:2])))
    args = [jnp.asarray(x) for x in (logp, logp_old, adv, mask, logp_ref)]
    out = f(*args)
    assert out.shape == (2,) and np.all(np.isfinite(out))
    grads = jax.jit(jax.grad(lambda x: jnp.sum(f(x, *args[1:]))))(args[0])
    assert np.all(np.isfinite(grads)) and np.all(np.asarray(grads)[mask == 0] == 0.0)
    soft = [jnp.asarray(x) for x in (np.nan_to_num(logp_old + 0.1), logp_old, adv, mask, logp_old - 0.2)]
    low = f(*(x.astype(jnp.bfloat16) if i != 3 else x for i, x in enumerate(soft)))
    assert low.dtype == jnp.float32
    np.testing.assert_allclose(low, f(*soft), rtol=3e-2, atol=3e-2)


def verl_ppo_kl(logp, logp_old, mask):
    """verl ``compute_policy_loss_vanilla``:
    ``ppo_kl = masked_mean(-clamp(log_prob - old_log_prob, -20, 20))``."""
    negative_approx_kl = np.clip(np.asarray(logp, np.float64) - logp_old, -20.0, 20.0)
    return (np.where(mask > 0, -negative_approx_kl, 0.0) * mask).sum() / (mask.sum() + 1e-8)


def test_approx_kl_clamped_like_verl_ppo_kl():
    logp_old = np.full((2, 4), -1.0, np.float32)
    logp = logp_old + np.array([[30.0, -25.0, 0.5, 7.0], [-40.0, 0.1, 0.0, 3.0]], np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 1]], np.float32)
    for level in RATIO_LEVELS:
        _, metrics = jitted(clipped_surrogate, ratio_level=level)(
            jnp.asarray(logp), jnp.asarray(logp_old), jnp.zeros(2), jnp.asarray(mask))
        kl = float(finalize(*metrics["approx_kl"]))
        np.testing.assert_allclose(kl, verl_ppo_kl(logp, logp_old, mask), rtol=1e-6)
        np.testing.assert_allclose(kl, (-20.0 + 20.0 - 0.5 + 20.0 - 0.1 - 3.0) / 6, rtol=1e-6)


def verl_gspo(old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high):
    """verl ``compute_policy_loss_gspo`` (verl/trainer/ppo/core_algos.py) in float64, with its forced
    ``agg_loss(..., "seq-mean-token-mean")`` at the defaults (no global_batch_info), and the gradient
    of ``pg_loss`` w.r.t. ``log_prob`` as torch's autograd computes it (clamp passes the gradient on
    its closed interval, maximum splits a tie in halves).

    Returns ``(pg_loss, d pg_loss / d log_prob, pg_clipfrac, ppo_kl)``.
    """
    old_log_prob, log_prob = np.asarray(old_log_prob, np.float64), np.asarray(log_prob, np.float64)
    response_mask = np.asarray(response_mask, np.float64)
    advantages = np.broadcast_to(np.asarray(advantages, np.float64).reshape(log_prob.shape[0], -1),
                                 log_prob.shape)
    negative_approx_kl = log_prob - old_log_prob
    seq_lengths = np.maximum(response_mask.sum(-1), 1)
    negative_approx_kl_seq = (negative_approx_kl * response_mask).sum(-1) / seq_lengths
    # log_prob - log_prob.detach() + sg(seq): value seq, d/d log_prob = 1.
    log_seq_importance_ratio = np.broadcast_to(negative_approx_kl_seq[:, None], log_prob.shape)
    d_log = (log_seq_importance_ratio <= 10.0).astype(np.float64)  # clamp(max=10)
    seq_importance_ratio = np.exp(np.minimum(log_seq_importance_ratio, 10.0))
    d_ratio = seq_importance_ratio * d_log
    pg_losses1 = -advantages * seq_importance_ratio
    clipped = np.clip(seq_importance_ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    pg_losses2 = -advantages * clipped
    in_range = (seq_importance_ratio >= 1 - clip_ratio_low) & (seq_importance_ratio <= 1 + clip_ratio_high)
    d1, d2 = -advantages * d_ratio, -advantages * d_ratio * in_range
    pg_losses = np.maximum(pg_losses1, pg_losses2)
    d_pg = np.where(pg_losses1 > pg_losses2, d1, np.where(pg_losses1 < pg_losses2, d2, 0.5 * (d1 + d2)))
    # agg_loss "seq-mean-token-mean"
    seq_mask = response_mask.sum(-1)
    seq_losses = (np.where(response_mask > 0, pg_losses, 0.0) * response_mask).sum(-1) / (seq_mask + 1e-8)
    live = (seq_mask > 0).astype(np.float64)
    pg_loss = (seq_losses * live).sum() / live.sum()
    grad = (live / (seq_mask + 1e-8) / live.sum())[:, None] * response_mask * d_pg

    def masked_mean(x):
        return (np.where(response_mask > 0, x, 0.0) * response_mask).sum() / (response_mask.sum() + 1e-8)

    pg_clipfrac = masked_mean((pg_losses2 > pg_losses1).astype(np.float64))
    ppo_kl = masked_mean(-negative_approx_kl)
    return pg_loss, grad, pg_clipfrac, ppo_kl


def trl_sequence_loss(per_token_logps, old_per_token_logps, advantages, mask, epsilon_low, epsilon_high,
                      loss_type):
    """TRL ``GRPOTrainer._compute_loss`` (trl/trainer/grpo_trainer.py), ``importance_sampling_level=
    "sequence"``, beta=0, delta=None, no vLLM correction, advantages ``[B]``; float64 value."""
    per_token_logps = np.asarray(per_token_logps, np.float64)
    mask = np.asarray(mask, np.float64)
    advantages = np.asarray(advantages, np.float64)[:, None]
    log_ratio = per_token_logps - old_per_token_logps
    log_importance_weights = ((log_ratio * mask).sum(-1) / np.maximum(mask.sum(-1), 1.0))[:, None]
    coef_1 = np.exp(log_importance_weights)
    coef_2 = np.clip(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss = -np.minimum(coef_1 * advantages, coef_2 * advantages)
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / np.maximum(mask.sum(-1), 1.0)).mean()
    assert loss_type == "bnpo"
    return (per_token_loss * mask).sum() / max(mask.sum(), 1.0)


def finite_difference_grad(f, x, h=1e-6):
    x = np.asarray(x, np.float64)
    grad = np.zeros_like(x)
    for i in np.ndindex(*x.shape):
        e = np.zeros_like(x)
        e[i] = h
        grad[i] = (f(x + e) - f(x - e)) / (2 * h)
    return grad


# One row per regime: (mean log-ratio, advantage). Row 0 is empty, row 1 holds one token; then clipped
# high (A > 0) / unclipped above (A < 0), clipped low (A < 0) / unclipped below (A > 0), inside the clip
# range (clipped with GSPO's 3e-4 / 4e-4), dual clip (A < 0, s = 4.5), and log s = 12 above the clamp
# (a small |A| keeps its exp(10)-sized loss comparable to the rest).
SEQ_ROWS = ((0.0, 1.0), (0.1, -1.0), (0.3, 1.0), (0.3, -1.0), (-0.4, -1.0), (-0.4, 1.0), (0.05, 1.0),
            (-0.05, -1.0), (1.5, -1.0), (12.0, -1e-3))


def sequence_inputs(rng, t, *, rows=SEQ_ROWS, token_adv=False):
    """``[B, t]`` inputs whose row b has mean log-ratio ``rows[b][0]`` (+ noise) and advantages of sign
    and scale ``rows[b][1]`` (per token with ``token_adv``); the logp at masked positions are finite."""
    b = len(rows)
    offsets, scale = (np.array(x, np.float32) for x in zip(*rows))
    lengths = rng.integers(2, t + 1, size=b)
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)
    if rng.integers(2):  # holes, keeping the first token
        mask[:, 1:] *= rng.random((b, t - 1)) < 0.7
    mask[0] = 0.0
    mask[1] = 0.0
    mask[1, rng.integers(t)] = 1.0
    logp_old = -rng.exponential(1.5, size=(b, t)).astype(np.float32)
    logp = (logp_old + offsets[:, None] + rng.normal(scale=0.02, size=(b, t))).astype(np.float32)
    mag = rng.uniform(0.5, 1.5, size=(b, t) if token_adv else (b,)).astype(np.float32)
    adv = (mag * (scale[:, None] if token_adv else scale)).astype(np.float32)
    return logp, logp_old, adv, mask


@pytest.mark.parametrize("t,token_adv,el,eh,c", [
    (11, False, 0.2, 0.28, 3.0), (7, True, 0.2, 0.2, None), (13, False, 3e-4, 4e-4, 1.5),
    (9, True, 0.1, 0.3, 3.0)])
def test_sequence_level_matches_reference(t, token_adv, el, eh, c):
    rng = np.random.default_rng(t + 1)
    logp, logp_old, adv, mask = sequence_inputs(rng, t, token_adv=token_adv)
    b = len(SEQ_ROWS)
    logp[0] = np.nan  # the all-masked row may hold garbage
    ref_loss, ref_grad, flags = surrogate_reference(logp, logp_old, adv, mask, el, eh, c, level="sequence")

    def run(x):
        loss, metrics = clipped_surrogate(x, jnp.asarray(logp_old), jnp.asarray(adv), jnp.asarray(mask),
                                          eps_low=el, eps_high=eh, dual_clip=c, ratio_level="sequence")
        return jnp.sum(loss), (loss, metrics)

    grad, (loss, metrics) = jax.jit(jax.grad(run, has_aux=True))(jnp.asarray(logp))
    assert loss.dtype == jnp.float32 and loss.shape == (b, t)
    assert np.all(np.asarray(loss)[0] == 0.0) and np.all(np.asarray(grad)[mask == 0] == 0.0)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-6)
    n = mask.sum()
    for name, values in flags.items():
        s, cnt = metrics[name]
        assert float(cnt) == n  # token-mean pairs at the sequence level too
        np.testing.assert_allclose(s, np.where(mask > 0, values, 0.0).sum(), rtol=1e-5, atol=1e-5)
    # `ratio` is the token-weighted mean of s_b, clamped at exp(10).
    lr = np.where(mask > 0, logp.astype(np.float64) - logp_old, 0.0)
    s_b = np.exp(np.minimum(lr.sum(-1) / np.maximum(mask.sum(-1), 1), SEQ_LOG_RATIO_MAX))
    np.testing.assert_allclose(finalize(*metrics["ratio"]), (s_b * mask.sum(-1)).sum() / n, rtol=1e-5)


@pytest.mark.parametrize("token_adv,el,eh", [(False, 0.2, 0.28), (True, 0.2, 0.2), (False, 3e-4, 4e-4)])
def test_sequence_level_matches_verl_gspo(token_adv, el, eh):
    """policy_loss(ratio_level="sequence", mode="seq-mean-token-mean", dual_clip=None) is verl's gspo loss:
    value, gradient w.r.t. logp, pg_clipfrac and ppo_kl, including a row above the log-ratio clamp."""
    rng = np.random.default_rng(31 + token_adv)
    logp, logp_old, adv, mask = sequence_inputs(rng, 10, token_adv=token_adv)

    def run(x):
        total, count, metrics = policy_loss(x, jnp.asarray(logp_old), jnp.asarray(adv), jnp.asarray(mask),
                                            eps_low=el, eps_high=eh, dual_clip=None, ratio_level="sequence",
                                            mode="seq-mean-token-mean")
        return finalize(total, count), metrics

    grad, metrics = jax.jit(jax.grad(run, has_aux=True))(jnp.asarray(logp))
    value = jax.jit(run)(jnp.asarray(logp))[0]
    v_loss, v_grad, v_clipfrac, v_kl = verl_gspo(logp_old, logp, adv, mask, el, eh)
    np.testing.assert_allclose(value, v_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, v_grad, rtol=1e-5, atol=1e-7)
    # Row 9 (log s_b = 12 > 10): verl's clamp blocks the gradient; rows 2, 4 (and 6, 7 at GSPO's eps) are
    # clipped; the others carry a gradient.
    flowing = np.abs(np.asarray(grad)).sum(-1) > 0
    expected = [1, 3, 5, 8] + ([6, 7] if el > 1e-3 else [])
    assert flowing.tolist() == [i in expected for i in range(10)]
    assert v_clipfrac > 0.1
    fm = finalize_metrics(metrics)
    np.testing.assert_allclose(fm["clip_low_frac"] + fm["clip_high_frac"], v_clipfrac, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(fm["approx_kl"], v_kl, rtol=1e-5, atol=1e-6)  # |log ratio| < 20 here
    assert float(fm["dual_clip_frac"]) == 0.0  # verl's gspo has no dual clip (pg_clipfrac_lower = 0)


@pytest.mark.parametrize("el,eh", [(0.2, 0.28), (3e-4, 4e-4)])
def test_sequence_level_matches_trl(el, eh):
    """TRL importance_sampling_level="sequence": loss_type="grpo" is seq-mean-token-mean over ALL rows
    (ours counts rows with a token: ours = TRL * B / rows), "bnpo" is token-mean; gradients from TRL's
    value by float64 finite differences (TRL's autograd differentiates through the sequence mean)."""
    rng = np.random.default_rng(47)
    logp, logp_old, adv, mask = sequence_inputs(rng, 9, rows=SEQ_ROWS[:9])  # TRL has no clamp: stay below
    for mode, loss_type in (("seq-mean-token-mean", "grpo"), ("token-mean", "bnpo")):
        def run(x, mode=mode):
            total, count, _ = policy_loss(x, jnp.asarray(logp_old), jnp.asarray(adv), jnp.asarray(mask),
                                          eps_low=el, eps_high=eh, dual_clip=None, ratio_level="sequence",
                                          mode=mode)
            return total / 9.0 if mode == "seq-mean-token-mean" else finalize(total, count)

        value, grad = jax.jit(jax.value_and_grad(run))(jnp.asarray(logp))

        def trl(x, loss_type=loss_type):
            return trl_sequence_loss(x, logp_old, adv, mask, el, eh, loss_type)

        np.testing.assert_allclose(value, trl(logp), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(grad, finite_difference_grad(trl, logp), rtol=1e-4, atol=1e-7)


def test_sequence_level_all_masked_padding_micro_batching():
    rng = np.random.default_rng(9)
    logp, logp_old, adv, mask = sequence_inputs(rng, 6, token_adv=True)
    logp_ref = (logp + rng.normal(scale=0.2, size=logp.shape)).astype(np.float32)
    arrays = (logp, logp_old, adv, mask, logp_ref)
    f = jax.jit(lambda *a: {mode: policy_loss(*a[:4], logp_ref=a[4], mode=mode, kl_coef=0.05,
                                              ratio_level="sequence", **kwargs(mode)) for mode in MODES})
    full = f(*map(jnp.asarray, arrays))
    padded = f(*(jnp.asarray(pad_rows_cols(x, 2, 3, v)) for x, v in zip(arrays, (1e4, -1e4, 5.0, 0.0, -3.0))))
    parts = [f(*(jnp.asarray(x[sl]) for x in arrays)) for sl in row_chunks(10, (1, 4, 5))]
    combined = jax.tree.map(lambda *p: sum(p), *parts)
    for mode in MODES:
        expected, expected_metrics = finalize(*full[mode][:2]), finalize_metrics(full[mode][2])
        for other in (padded[mode], combined[mode]):
            np.testing.assert_allclose(finalize(*other[:2]), expected, rtol=1e-6, atol=1e-7)
            for name, value in finalize_metrics(other[2]).items():
                np.testing.assert_allclose(value, expected_metrics[name], rtol=1e-6, atol=1e-7)
    # A batch whose rows are all masked, holding garbage: 0, no NaN in value or gradient.
    empty = jnp.zeros((3, 5))
    garbage = jnp.full((3, 5), jnp.nan)
    g = jax.jit(jax.value_and_grad(lambda x: finalize(*policy_loss(
        x, garbage, jnp.ones(3), empty, ratio_level="sequence", mode="seq-mean-token-mean")[:2])))
    value, grad = g(garbage)
    assert float(value) == 0.0 and np.all(np.asarray(grad) == 0.0)


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
    with pytest.raises(ValueError, match="`ratio_level` must be one of"):
        clipped_surrogate(z, z, jnp.zeros(2), m, ratio_level="seq")
    with pytest.raises(ValueError, match="`ratio_level` must be one of"):
        policy_loss(z, z, jnp.zeros(2), m, ratio_level="sentence")
