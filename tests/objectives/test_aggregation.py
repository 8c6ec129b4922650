import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.objectives import MODES, aggregate, finalize, finalize_metrics

from .helpers import jitted, pad_rows_cols, random_mask, row_chunks

NORM = 16.0


def trl_dr_grpo(per_token_loss, mask, max_completion_length):
    """TRL ``GRPOTrainer._compute_loss``, ``loss_type="dr_grpo"`` (trl/trainer/grpo_trainer.py), float64:
    ``(per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)``."""
    per_token_loss, mask = np.asarray(per_token_loss, np.float64), np.asarray(mask, np.float64)
    return (per_token_loss * mask).sum() / (per_token_loss.shape[0] * max_completion_length)


def verl_agg_loss(loss_mat, loss_mask, loss_agg_mode, loss_scale_factor=None, release="0.7.1"):
    """verl ``agg_loss`` (verl/trainer/ppo/core_algos.py) in float64, with its defaults ``dp_size=1``,
    ``batch_num_tokens=None``, ``global_batch_size=None``; ``masked_sum`` selects before multiplying.

    ``release="0.7.0"``: verl up to v0.7.0 and main before PR #5417 (volcengine/verl b178a3cd), where
    "seq-mean-token-sum-norm" is ``sum(seq_losses) / loss_scale_factor``; ``"0.7.1"`` (v0.7.1 .. v0.9,
    verl-project/verl 1dda039b): the "seq-mean-token-sum" branch, then ``/= loss_scale_factor``.
    The other modes are the same in both."""
    loss_mask = np.asarray(loss_mask, np.float64)
    loss_mat = np.where(loss_mask > 0, np.asarray(loss_mat, np.float64), 0.0)  # verl_F.masked_sum's where
    if loss_agg_mode == "token-mean":
        return (loss_mat * loss_mask).sum() / loss_mask.sum()
    if loss_agg_mode == "seq-mean-token-sum" or (loss_agg_mode == "seq-mean-token-sum-norm"
                                                and release == "0.7.1"):
        seq_losses = (loss_mat * loss_mask).sum(-1)
        seq_mask = (loss_mask.sum(-1) > 0).astype(np.float64)
        loss = (seq_losses * seq_mask).sum() / seq_mask.sum()
        if loss_agg_mode == "seq-mean-token-sum-norm":
            loss /= loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
        return loss
    if loss_agg_mode == "seq-mean-token-mean":
        seq_mask = loss_mask.sum(-1)
        seq_losses = (loss_mat * loss_mask).sum(-1) / (seq_mask + 1e-8)
        seq_mask = (seq_mask > 0).astype(np.float64)
        return (seq_losses * seq_mask).sum() / seq_mask.sum()
    assert loss_agg_mode == "seq-mean-token-sum-norm" and release == "0.7.0"
    seq_losses = (loss_mat * loss_mask).sum(-1)
    if loss_scale_factor is None:
        loss_scale_factor = loss_mask.shape[-1]
    return seq_losses.sum() / loss_scale_factor


def reference(x, mask, mode, norm=NORM):
    """Independent float64 (sum, count). The first three modes are verl ``agg_loss`` (checked against
    :func:`verl_agg_loss` below); ``seq-mean-token-sum-norm`` is TRL's dr_grpo formula applied to the
    rows holding >= 1 token (TRL divides by all rows), with ``max_completion_length = norm``."""
    x = np.where(mask > 0, np.asarray(x, np.float64), 0.0)
    m = (mask > 0).astype(np.float64)
    if mode == "token-mean":
        return x.sum(), m.sum()
    tokens = m.sum(-1)
    live = tokens > 0
    rows = float(live.sum())
    if mode == "seq-mean-token-sum-norm":
        return (trl_dr_grpo(x[live], m[live], norm) * rows if rows else 0.0), rows
    row = x.sum(-1)
    if mode == "seq-mean-token-mean":
        row = np.where(live, row / np.maximum(tokens, 1), 0.0)
    return row[live].sum(), rows


def kwargs(mode):
    return {"norm": NORM} if mode == "seq-mean-token-sum-norm" else {}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape,contiguous", [((2, 1), True), ((8, 33), False)])
def test_matches_float64_reference(mode, shape, contiguous):
    rng = np.random.default_rng(sum(shape))
    x = rng.normal(size=shape).astype(np.float32)
    mask = random_mask(rng, *shape, contiguous=contiguous)
    x[mask == 0] = np.nan  # values at masked positions must be ignored, even NaN
    agg = jitted(aggregate, mode=mode, **kwargs(mode))
    s, c = agg(jnp.asarray(x), jnp.asarray(mask))
    rs, rc = reference(x, mask, mode)
    assert s.dtype == jnp.float32 and c.dtype == jnp.float32
    np.testing.assert_allclose(s, rs, rtol=1e-5, atol=1e-6)
    assert float(c) == rc
    np.testing.assert_allclose(finalize(s, c), rs / max(rc, 1), rtol=1e-5, atol=1e-6)
    s_bool, c_bool = agg(jnp.asarray(x), jnp.asarray(mask > 0))
    assert float(s_bool) == float(s) and float(c_bool) == float(c)


@pytest.mark.parametrize("mode", MODES)
def test_peer_parity_verl_and_trl(mode):
    """verl agg_loss equals finalize for every mode from verl v0.7.1 on; the norm mode is TRL's dr_grpo
    (on the rows holding a token) and differs from verl <= v0.7.0, which does not divide by rows."""
    rng = np.random.default_rng(17)
    x = rng.normal(size=(6, 9)).astype(np.float32)
    mask = random_mask(rng, 6, 9, contiguous=False)  # row 0 empty, row 1 one token
    full = (rng.random((5, 9)) < 0.7).astype(np.float32)
    full[:, 0] = 1.0  # every row holds a token
    agg = jitted(aggregate, mode=mode, **kwargs(mode))
    for msk in (mask, full):
        s, c = agg(jnp.asarray(x[: len(msk)]), jnp.asarray(msk))
        ours, rows = float(finalize(s, c)), float((msk.sum(-1) > 0).sum())
        verl = verl_agg_loss(x[: len(msk)], msk, mode, loss_scale_factor=NORM)
        np.testing.assert_allclose(ours, verl, rtol=1e-5, atol=1e-6)
        if mode != "seq-mean-token-sum-norm":
            continue
        trl = trl_dr_grpo(x[: len(msk)], msk, NORM)
        # TRL divides by all rows: equal when every row has a token, rows/B times ours otherwise.
        np.testing.assert_allclose(ours * rows / len(msk), trl, rtol=1e-5, atol=1e-6)
        if msk is full:
            np.testing.assert_allclose(ours, trl, rtol=1e-5, atol=1e-6)
        # Documented difference: verl <= v0.7.0 does not divide by rows at all (our `sum` alone).
        old = verl_agg_loss(x[: len(msk)], msk, mode, loss_scale_factor=NORM, release="0.7.0")
        np.testing.assert_allclose(old, float(s), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(old, ours * rows, rtol=1e-5, atol=1e-6)


def test_norm_mode_on_ones_trl_verl_releases():
    ones = np.ones((4, 8), np.float32)
    s, c = aggregate(jnp.asarray(ones), jnp.asarray(ones), mode="seq-mean-token-sum-norm", norm=8.0)
    assert float(finalize(s, c)) == 1.0 == trl_dr_grpo(ones, ones, 8)
    assert verl_agg_loss(ones, ones, "seq-mean-token-sum-norm", loss_scale_factor=8, release="0.7.0") == 4.0
    assert verl_agg_loss(ones, ones, "seq-mean-token-sum-norm", loss_scale_factor=8) == 1.0


@pytest.mark.parametrize("mode", MODES)
def test_padding_and_micro_batching(mode):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(9, 12)).astype(np.float32)
    mask = random_mask(rng, 9, 12)
    agg = jitted(aggregate, mode=mode, **kwargs(mode))
    full = finalize(*agg(jnp.asarray(x), jnp.asarray(mask)))
    xp, mp = pad_rows_cols(x, 3, 5, 1e4), pad_rows_cols(mask, 3, 5, 0.0)
    np.testing.assert_allclose(finalize(*agg(jnp.asarray(xp), jnp.asarray(mp))), full, rtol=1e-6)
    pairs = [agg(jnp.asarray(x[sl]), jnp.asarray(mask[sl])) for sl in row_chunks(9, (2, 4, 1, 2))]
    combined = jax.tree.map(lambda *p: sum(p), *pairs)
    np.testing.assert_allclose(finalize(*combined), full, rtol=1e-6, atol=1e-7)


def test_jit_vmap_grad_bf16():
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.normal(size=(2, 4, 6)).astype(np.float32))
    mask = jnp.asarray(np.stack([random_mask(rng, 4, 6), random_mask(rng, 4, 6, contiguous=False)]))
    for mode in MODES:
        f = jax.vmap(lambda a, m, mode=mode: finalize(*aggregate(a, m, mode=mode, **kwargs(mode))))
        out = jax.jit(f)(x, mask)
        for i in range(2):
            rs, rc = reference(np.asarray(x[i]), np.asarray(mask[i]), mode)
            np.testing.assert_allclose(out[i], rs / max(rc, 1), rtol=1e-5, atol=1e-6)
        g = jax.jit(jax.grad(lambda a: jnp.sum(f(a, mask))))(x)
        assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[np.asarray(mask) == 0] == 0)
        xb = x.astype(jnp.bfloat16)
        np.testing.assert_allclose(jax.jit(f)(xb, mask), out, rtol=2e-2, atol=2e-2)


def test_empty_batch_and_finalize_metrics():
    s, c = aggregate(jnp.ones((3, 4)), jnp.zeros((3, 4)), mode="seq-mean-token-mean")
    assert float(s) == 0.0 and float(c) == 0.0 and float(finalize(s, c)) == 0.0
    out = finalize_metrics({"a": (jnp.float32(3.0), jnp.float32(4.0)), "b": (0.0, 0.0)})
    assert float(out["a"]) == 0.75 and float(out["b"]) == 0.0


def test_bad_input():
    x, m = jnp.zeros((2, 3)), jnp.ones((2, 3))
    with pytest.raises(ValueError, match="`mode` must be one of"):
        aggregate(x, m, mode="seq-mean")
    with pytest.raises(ValueError, match="needs `norm`"):
        aggregate(x, m, mode="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="`norm` only applies"):
        aggregate(x, m, mode="token-mean", norm=4.0)
    with pytest.raises(ValueError, match=r"`per_token` \(2, 3\), `mask` \(2, 4\)"):
        aggregate(x, jnp.ones((2, 4)))
    with pytest.raises(ValueError, match="`per_token` must have rank 2"):
        aggregate(jnp.zeros(3), jnp.ones(3))
