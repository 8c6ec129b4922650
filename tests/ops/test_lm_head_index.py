"""The LM head reading its rows from a decoder's whole output (``index``) with masked rows at zero
(``row_mask``): every backend, ``lm_head_map`` and ``lm_head_sum``, against a float64 reference
that gathers and masks the rows itself; the gradient lands in the ``[B, S, D]`` output (repeated
positions add, masked positions and positions no row reads get zero, NaN there stays out)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hindsight.ops as ops
from hindsight.ops.lm_head import BACKENDS

B, S, S_T, T, D, D_T, V = 2, 9, 11, 7, 8, 6, 41     # 14 rows, blocks of 4: a shifted last block
TEMP = 0.8


def make(seed=0):
    rng = np.random.default_rng(seed)
    x = dict(hs=rng.normal(size=(B, S, D)), ht=rng.normal(size=(B, S_T, D_T)),
             w=rng.normal(size=(D, V)) * 2 / np.sqrt(D), wt=rng.normal(size=(D_T, V)) * 2 / np.sqrt(D_T))
    x = {k: np.asarray(v, np.float32) for k, v in x.items()}
    # student positions: a response after a prompt, with one position read twice
    x["idx"] = np.stack([np.arange(1, 1 + T), np.r_[np.arange(2, 2 + T - 1), 3]]).astype(np.int32)
    x["idx_t"] = np.stack([np.arange(3, 3 + T), np.arange(4, 4 + T)]).astype(np.int32)
    x["tok"] = rng.integers(0, V, size=(B, T)).astype(np.int32)
    x["mask"] = np.array([[1, 1, 0, 1, 1, 1, 0], [1, 0, 1, 1, 1, 1, 1]], bool)
    return x


def rows(logits, extras):
    zs, zt = logits
    tok = extras[0]
    ls, lt = jax.nn.log_softmax(zs), jax.nn.log_softmax(zt)
    return {"lp": jnp.take_along_axis(ls, tok[:, None], axis=-1)[:, 0],
            "kl": ops.kl_from_logprobs(ls, lt)}


def downstream(o):
    return jnp.sum(jnp.exp(o["lp"]) * jnp.arange(1.0, 1 + T)) + jnp.sum(jnp.tanh(o["kl"]))


def reference(x):
    """Float64: gather, mask, project, the same per-row function and downstream loss."""
    def f(hs, ht, w, wt):
        m = jnp.asarray(x["mask"])[..., None]
        take = lambda h, i: jnp.where(m, jnp.take_along_axis(h, jnp.asarray(i)[..., None], axis=1), 0.0)
        zs = (take(hs, x["idx"]) @ w / TEMP).reshape(B * T, V)
        zt = (take(ht, x["idx_t"]) @ wt / TEMP).reshape(B * T, V)
        o = rows((zs, zt), (jnp.asarray(x["tok"]).reshape(-1),))
        return downstream(jax.tree.map(lambda y: y.reshape(B, T), o))

    with jax.enable_x64(True):
        args = [jnp.asarray(x[k], jnp.float64) for k in ("hs", "ht", "w", "wt")]
        val, grads = jax.value_and_grad(f, (0, 1, 2, 3))(*args)
        return float(val), [np.asarray(g) for g in grads]


def head(backend, *, summed=False):
    def f(hs, ht, w, wt, x):
        kw = dict(index=[x["idx"], x["idx_t"]], row_mask=x["mask"], backend=backend, chunk_size=4,
                  temperature=TEMP)
        if summed:   # lm_head_sum of the same loss where it is a sum of per-row terms
            total, _ = ops.lm_head_sum(
                lambda z, e: (jnp.exp(rows(z, e)["lp"]) * e[1] + jnp.tanh(rows(z, e)["kl"]), ()),
                [hs, ht], [w, wt], [x["tok"], jnp.broadcast_to(jnp.arange(1.0, 1 + T), (B, T))], **kw)
            return total
        return downstream(ops.lm_head_map(rows, [hs, ht], [w, wt], [x["tok"]], **kw))
    return f


@pytest.mark.parametrize("summed", [False, True], ids=["map", "sum"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_index_and_row_mask_match_float64(backend, summed):
    x = make()
    ref_val, ref_grads = reference(x)
    args = [jnp.asarray(x[k]) for k in ("hs", "ht", "w", "wt")]
    val, grads = jax.jit(jax.value_and_grad(head(backend, summed=summed), (0, 1, 2, 3)))(
        *args, {k: jnp.asarray(v) for k, v in x.items()})
    np.testing.assert_allclose(float(val), ref_val, rtol=1e-5)
    for name, g, r in zip(("hs", "ht", "w", "wt"), grads, ref_grads):
        assert g.shape == r.shape, name
        np.testing.assert_allclose(np.asarray(g), r, rtol=2e-4, atol=2e-6, err_msg=name)
    # positions no live row reads get exactly zero; the position read twice gets both rows' share
    gs = np.asarray(grads[0])
    read = np.zeros((B, S), bool)
    for b in range(B):
        read[b, x["idx"][b][x["mask"][b]]] = True
    assert np.all(gs[~read] == 0.0)
    assert np.all(np.abs(gs[read]).sum(-1) > 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_at_masked_and_unread_positions_stays_out(backend):
    x = make(1)
    ref_val, ref_grads = reference(x)
    hs = x["hs"].copy()
    hs[0, 0] = np.nan                      # never read
    hs[0, x["idx"][0, 2]] = np.nan         # read only by a masked row
    args = [jnp.asarray(hs)] + [jnp.asarray(x[k]) for k in ("ht", "w", "wt")]
    val, grads = jax.jit(jax.value_and_grad(head(backend), (0, 2)))(
        *args, {k: jnp.asarray(v) for k, v in x.items()})
    assert np.isfinite(float(val))
    np.testing.assert_allclose(float(val), ref_val, rtol=1e-5)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in grads)
    np.testing.assert_allclose(np.asarray(grads[1]), ref_grads[2], rtol=2e-4, atol=2e-6)


def test_bad_index_is_refused_naming_the_argument():
    x = make()
    args = ([jnp.asarray(x["hs"]), jnp.asarray(x["ht"])], [jnp.asarray(x["w"]), jnp.asarray(x["wt"])],
            [jnp.asarray(x["tok"])])
    with pytest.raises(ValueError, match=r"index\[0\]` must lie in \[0, 9\)"):
        ops.lm_head_map(rows, *args, index=[x["idx"] + 5, x["idx_t"]])
    with pytest.raises(ValueError, match=r"`index` must have one entry"):
        ops.lm_head_map(rows, *args, index=[x["idx"]])
    with pytest.raises(ValueError, match=r"`row_mask` must have the rows' shape"):
        ops.lm_head_map(rows, *args, index=[x["idx"], x["idx_t"]], row_mask=x["mask"][:, :3])
    with pytest.raises(ValueError, match=r"`index\[1\]` must be an int array"):
        ops.lm_head_map(rows, *args, index=[x["idx"], x["idx_t"].astype(np.float32)])


def test_fused_reads_rows_without_a_gathered_copy():
    """The fused backend's program holds no [B, T, D]-sized gather of the student's output and no
    scatter of its gradient: its XLA temporaries are smaller than those of the same loss fed
    pre-gathered rows (which need both)."""
    bb, ss, tt, dd, vv = 4, 160, 128, 256, 512
    rng = np.random.default_rng(0)
    h = jnp.asarray(rng.normal(size=(bb, ss, dd)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(dd, vv)) / 16, jnp.float32)
    idx = jnp.asarray(np.broadcast_to(np.arange(ss - tt, ss), (bb, tt)), jnp.int32)
    tok = jnp.asarray(rng.integers(0, vv, (bb, tt)), jnp.int32)
    row = lambda z, e: (jnp.take_along_axis(jax.nn.log_softmax(z[0]), e[0][:, None], -1)[:, 0], ())
    by_index = lambda h, w: ops.lm_head_sum(row, [h], [w], [tok], index=[idx], chunk_size=64)[0]
    gathered = lambda h, w: ops.lm_head_sum(
        row, [jnp.take_along_axis(h, idx[..., None], axis=1)], [w], [tok], chunk_size=64)[0]
    temp = lambda f: jax.jit(jax.grad(f, (0, 1))).lower(h, w).compile().memory_analysis().temp_size_in_bytes
    row_bytes = bb * tt * dd * 4
    assert temp(by_index) <= temp(gathered) - row_bytes
