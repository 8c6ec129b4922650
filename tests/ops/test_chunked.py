"""Chunked LM-head reductions and the fused distillation loss vs the dense ops on materialised logits
(values and gradients), vs a float64 NumPy reference for the JSD, and their numerical edge cases."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hindsight.ops as ops
from hindsight.ops import fused as fused_mod
from hindsight.ops import lm_head as lm_head_mod
from hindsight.ops import masked_logits

V = 53
SHAPES = [(2, 5, 8), (1, 1, 8)]     # (B, T, D); with chunk_size 4, B*T = 10 needs padding


def make(rng, b, t, d, *, v=V, d_t=None, scale=1.0):
    d_t = d if d_t is None else d_t
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    return dict(hs=f32(rng.normal(size=(b, t, d))), ht=f32(rng.normal(size=(b, t, d_t))),
                w=f32(rng.normal(size=(d, v)) * scale / np.sqrt(d)),
                wt=f32(rng.normal(size=(d_t, v)) * scale / np.sqrt(d_t)),
                tok=jnp.asarray(rng.integers(0, v, size=(b, t))),
                mask=f32(rng.random((b, t)) > 0.3))


def vg(f, argnums=0, **kw):
    """Jitted value_and_grad: one compilation per test instead of many small eager ones."""
    return jax.jit(jax.value_and_grad(f, argnums, **kw))


def close(a, b, rtol=1e-5):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * max(1.0, np.abs(y).max()))


def np_lsm(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


# ---- chunked (scan + remat) reductions vs dense ----------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
def test_token_logprobs_and_entropy_match_dense(rng, shape):
    chunk = 4
    x = make(rng, *shape)
    vm = jnp.arange(V) < V - 3
    kw = dict(vocab_mask=vm, temperature=0.7)

    def chunked(hs, w):
        lp, ent = ops.chunked_token_logprobs(hs, w, x["tok"], chunk_size=chunk, with_entropy=True, **kw)
        return jnp.sum(x["mask"] * (lp + 0.3 * ent)), (lp, ent)

    def dense(hs, w):
        z = hs @ w / 0.7
        lp, ent = ops.token_logprobs(z, x["tok"], vocab_mask=vm), ops.entropy(z, vocab_mask=vm)
        return jnp.sum(x["mask"] * (lp + 0.3 * ent)), (lp, ent)

    got = vg(chunked, (0, 1), has_aux=True)(x["hs"], x["w"])
    want = vg(dense, (0, 1), has_aux=True)(x["hs"], x["w"])
    close(got, want)
    close(ops.chunked_entropy(x["hs"], x["w"], chunk_size=chunk, **kw), want[0][1][1])
    close(ops.chunked_token_logprobs(x["hs"], x["w"], x["tok"], chunk_size=chunk, **kw), want[0][1][0])


def test_divergences_match_dense_with_teacher_unembed(rng):
    beta = 0.3
    x = make(rng, 3, 7, 16, d_t=12)

    def run(fn):
        return vg(lambda hs, ht, w, wt: jnp.sum(x["mask"] * fn(hs, ht, w, wt)),
                                  (0, 1, 2, 3))(x["hs"], x["ht"], x["w"], x["wt"])

    close(run(lambda hs, ht, w, wt: ops.chunked_generalized_jsd(hs, ht, w, beta, teacher_unembed=wt,
                                                                chunk_size=4)),
          run(lambda hs, ht, w, wt: ops.generalized_jsd(hs @ w, ht @ wt, beta)))
    close(run(lambda hs, ht, w, wt: ops.chunked_kl(hs, ht, w, q_unembed=wt, chunk_size=5)),
          run(lambda hs, ht, w, wt: ops.kl(hs @ w, ht @ wt)))
    close(run(lambda hs, ht, w, wt: ops.chunked_topk_divergence(
              hs, ht, w, beta, k=5, support="teacher", teacher_unembed=wt, chunk_size=8)),
          run(lambda hs, ht, w, wt: ops.topk_divergence(hs @ w, ht @ wt, beta, k=5, support="teacher")))


def test_lm_head_map_several_outputs_and_float_extras(rng):
    x = make(rng, 2, 5, 8)
    target = jnp.asarray(rng.normal(size=(2, 5, V)), jnp.float32)

    def row(logits, extras):
        (z,), (tgt,) = logits, extras
        return {"dot": jnp.sum(jax.nn.log_softmax(z) * tgt, -1), "max": jnp.max(z, -1)}

    def chunked(hs, w, tgt):
        out = ops.lm_head_map(row, [hs], [w], [tgt], backend="scan", chunk_size=3)
        return jnp.sum(out["dot"]) + jnp.sum(out["max"]), out

    def dense(hs, w, tgt):
        z = hs @ w
        out = {"dot": jnp.sum(jax.nn.log_softmax(z) * tgt, -1), "max": jnp.max(z, -1)}
        return jnp.sum(out["dot"]) + jnp.sum(out["max"]), out

    close(vg(chunked, (0, 1, 2), has_aux=True)(x["hs"], x["w"], target),
          vg(dense, (0, 1, 2), has_aux=True)(x["hs"], x["w"], target))


def test_chunk_size_invariance(rng):
    x = make(rng, 3, 7, 16)
    outs = [vg(lambda hs, w: jnp.sum(ops.chunked_generalized_jsd(hs, x["ht"], w, 0.5,
                                                                               chunk_size=c)),
                               (0, 1))(x["hs"], x["w"]) for c in (1, 8, 1000)]
    for o in outs[1:]:
        close(o, outs[0])


def test_jit_and_vmap(rng):
    x = make(rng, 2, 5, 8)
    batched = jnp.stack([x["hs"], 2 * x["hs"]])
    f = jax.jit(lambda hs: ops.chunked_generalized_jsd(hs, x["ht"], x["w"], 0.5, chunk_size=4))
    close(jax.vmap(f)(batched), jnp.stack([ops.generalized_jsd(h @ x["w"], x["ht"] @ x["w"], 0.5)
                                           for h in batched]))


# ---- fused weighted-sum distillation loss ----------------------------------------------------------

def dense_loss(loss, beta, hs, ht, w, wt, weights):
    zs, zt = hs @ w, jax.lax.stop_gradient(ht @ wt)
    b = {"reverse_kl": 1.0, "forward_kl": 0.0}.get(loss, beta)
    return jnp.sum(weights * ops.generalized_jsd(zs, zt, b))


@pytest.mark.parametrize("loss,beta,shape", [("reverse_kl", None, SHAPES[0]), ("forward_kl", None, SHAPES[0]),
                                             ("jsd", 0.1, SHAPES[0]), ("jsd", 0.5, SHAPES[1])])
def test_fused_matches_dense(rng, loss, beta, shape):
    x = make(rng, *shape, scale=3.0)
    weights = x["mask"] / 7.0                          # token-mean style weights

    def fused(hs, w, weights, ht, wt):
        return ops.fused_distillation_loss(hs, ht, w, weights, loss=loss, beta=beta,
                                           teacher_unembed=wt, chunk_size=4)[0]

    def dense(hs, w, weights, ht, wt):
        return dense_loss(loss, beta, hs, ht, w, wt, weights)

    args = (x["hs"], x["w"], weights, x["ht"], x["wt"])
    val, grads = vg(fused, (0, 1, 2, 3, 4))(*args)
    want_val, want_grads = vg(dense, (0, 1, 2))(*args[:3], *args[3:])
    close((val, grads[:3]), (want_val, want_grads))
    assert not np.any(grads[3]) and not np.any(grads[4])       # the teacher is a constant
    total, count = ops.fused_distillation_loss(*args[:1], x["ht"], x["w"], weights, loss=loss,
                                               beta=beta, teacher_unembed=x["wt"])
    close((total, count), (want_val, jnp.sum(weights)))


@pytest.mark.parametrize("tied", [False, True])
def test_fused_multi_tile_unembed_gradient(rng, monkeypatch, tied):
    """V = 53 in tiles of 16: three full tiles plus a last one shifted left over an overlap; the
    unembedding as a [D, V] matrix, or as a [V, D] table transposed (a tied embedding: the
    gradient accumulates in the table's layout)."""
    monkeypatch.setattr(lm_head_mod, "VOCAB_TILE", 16)
    x = make(rng, 3, 7, 16)
    p = x["w"].T if tied else x["w"]
    as_w = (lambda p: p.T) if tied else (lambda p: p)
    g = jax.jit(jax.grad(lambda p: ops.fused_distillation_loss(
        x["hs"], x["ht"], as_w(p), x["mask"], loss="jsd", chunk_size=5)[0]))(p)
    close(g, jax.grad(lambda p: dense_loss("jsd", 0.5, x["hs"], x["ht"], as_w(p), x["w"],
                                           x["mask"]))(p))


def test_fused_generic_hook_with_two_teachers(rng):
    x = make(rng, 2, 5, 8)
    probe = jnp.asarray(rng.normal(size=(2, 5, 8)), jnp.float32)

    def hook(ls, lt, lp):            # KL(S || normalised geometric mean of two teachers)
        return ops.kl_from_logprobs(ls, jax.nn.log_softmax(0.5 * (lt + lp)))

    got = vg(lambda hs, w: ops.fused_distillation_loss(
        hs, (x["ht"], probe), w, x["mask"], loss=hook, teacher_unembed=(x["wt"], x["w"]),
        chunk_size=3)[0], (0, 1))(x["hs"], x["w"])

    def dense(hs, w):
        lt = jax.lax.stop_gradient(jax.nn.log_softmax(x["ht"] @ x["wt"]))
        lp = jax.lax.stop_gradient(jax.nn.log_softmax(probe @ w))
        return jnp.sum(x["mask"] * hook(jax.nn.log_softmax(hs @ w), lt, lp))

    close(got, vg(dense, (0, 1))(x["hs"], x["w"]))


def test_fused_primal_computes_no_gradient(rng):
    x = make(rng, 2, 5, 8)
    f = lambda hs, w: ops.fused_distillation_loss(hs, x["ht"], w, x["mask"], chunk_size=4)[0]
    # value only: the student and teacher projections; with the gradient, also dlogits @ W^T and h^T @ dlogits
    assert str(jax.make_jaxpr(f)(x["hs"], x["w"])).count("dot_general") == 2
    assert str(jax.make_jaxpr(jax.grad(f, (0, 1)))(x["hs"], x["w"])).count("dot_general") == 4


def test_fused_vmap(rng):
    x = make(rng, 2, 5, 8)
    hs = jnp.stack([x["hs"], -x["hs"]])
    g = jax.vmap(jax.grad(lambda h: ops.fused_distillation_loss(h, x["ht"], x["w"], x["mask"],
                                                                chunk_size=4)[0]))(hs)
    close(g, jnp.stack([jax.grad(lambda h: dense_loss("jsd", 0.5, h, x["ht"], x["w"], x["w"],
                                                      x["mask"]))(h) for h in hs]))


# ---- closed-form dlogits of the built-in losses ----------------------------------------------------

CLOSED = [("reverse_kl", 0.5), ("forward_kl", 0.5), ("jsd", 0.5), ("jsd", 0.1), ("jsd", 0.0),
          ("jsd", 1.0)]


def np_closed_reference(loss, beta, zs, zt, g, temperature, vm):
    """Float64 NumPy ``(f, g * df/dz_s)`` of a built-in loss on raw projections ``zs, zt``."""
    def lsm(z):
        x = z / temperature
        return np_lsm(x if vm is None else np.where(vm, x, -1e9))
    ls, lt = lsm(zs), lsm(zt)
    ps, pt = np.exp(ls), np.exp(lt)
    b = {"reverse_kl": 1.0, "forward_kl": 0.0}.get(loss, beta)
    if b == 1.0:
        r = ls - lt
        f = (ps * r).sum(-1)
        dl = ps * (r - f[:, None])
    elif b == 0.0:
        f, dl = (pt * (lt - ls)).sum(-1), ps - pt
    else:
        lm = np.logaddexp(lt + np.log(b), ls + np.log1p(-b))
        ks = (ps * (ls - lm)).sum(-1)
        f = b * (pt * (lt - lm)).sum(-1) + (1 - b) * ks
        dl = (1 - b) * ps * (ls - lm - ks[:, None])
    return f, g[:, None] * dl / temperature


@pytest.mark.parametrize("loss,beta", CLOSED)
@pytest.mark.parametrize("temperature,masked", [(1.0, False), (0.7, True)])
def test_closed_form_matches_float64_and_autodiff_of_dense_loss(rng, loss, beta, temperature, masked):
    """``(f, dz)`` of the closed forms vs a float64 NumPy reference and vs the dense per-row loss with
    its ``jax.vjp`` w.r.t. the raw projections (temperature and vocab mask included), on rows from
    near-equal to very different distributions (logit scale up to 40, where the JSD's exponent cap
    is reached); tolerance 1e-5 relative to the largest value, as for the other comparisons."""
    c, v = 12, 211
    scale = np.repeat([0.1, 1.0, 5.0, 40.0], 3)[:, None]
    zs, zt = (rng.normal(size=(c, v)) * scale for _ in range(2))
    zt[:3] = zs[:3] + 0.01 * zt[:3]                                  # near-equal rows
    zs, zt = (np.asarray(z, np.float32).astype(np.float64) for z in (zs, zt))
    vm = np.arange(v) % 17 != 3 if masked else None
    g = rng.random(c)
    row_loss, closed = fused_mod._row_loss(loss, beta)
    cfg = fused_mod._Config(row_loss, closed, (c,), c, temperature)
    f32 = lambda a: jnp.asarray(a, jnp.float32)
    vmj = None if vm is None else jnp.asarray(vm)
    lmap = fused_mod._logit_map(cfg, vmj)
    f, dz = closed(f32(zs), f32(zt), lmap, f32(g))
    f_only, none = closed(f32(zs), f32(zt), lmap, None)
    assert none is None and all_finite((f, dz))
    want = np_closed_reference(loss, beta, zs, zt, g, temperature, vm)
    close((f, f_only, dz), (want[0], want[0], want[1]))

    lt = jax.nn.log_softmax(masked_logits(f32(zt) / temperature, vmj))
    auto_f, vjp = jax.vjp(lambda z: row_loss(
        jax.nn.log_softmax(masked_logits(z / temperature, vmj)), lt), f32(zs))
    close((f, dz), (auto_f, vjp(f32(g))[0]))


@pytest.mark.parametrize("loss,beta", CLOSED[:3])
def test_fused_matches_dense_with_temperature_and_vocab_mask(rng, loss, beta):
    x = make(rng, 2, 5, 8, scale=3.0)
    vm = jnp.arange(V) < V - 4

    def fused(hs, w):
        return ops.fused_distillation_loss(hs, x["ht"], w, x["mask"], loss=loss, beta=beta,
                                           vocab_mask=vm, temperature=0.7, chunk_size=3)[0]

    def dense(hs, w):
        zs, zt = hs @ w / 0.7, jax.lax.stop_gradient(x["ht"] @ w / 0.7)
        b = {"reverse_kl": 1.0, "forward_kl": 0.0}.get(loss, beta)
        return jnp.sum(x["mask"] * ops.generalized_jsd(zs, zt, b, vocab_mask=vm))

    got = vg(fused, (0, 1))(x["hs"], x["w"])
    close(got, vg(dense, (0, 1))(x["hs"], x["w"]))
    assert not np.any(got[1][1][V - 4:])                 # padded vocabulary: zero unembedding gradient


def test_fused_chunk_size_fills_the_budget_in_even_blocks():
    v = 151_936
    cap = fused_mod.FUSED_BLOCK_BYTES // (2 * 4 * v) // 8 * 8
    assert cap == 192
    assert fused_mod.fused_chunk_size(1024, v) == 176              # 6 blocks of 176, not 5 x 192 + 64
    for n in (1, 7, 100, 192, 193, 1024, 4096, 8192, 10_000):
        c = fused_mod.fused_chunk_size(n, v)
        blocks = -(-n // c)
        assert c % 8 == 0 and 8 <= c <= cap and blocks == -(-n // cap)
        assert blocks * c - n < 8 * blocks                    # padding: under 8 rows per block
    assert fused_mod.fused_chunk_size(10, 53) == 16           # small V: the whole input in one block


@pytest.mark.parametrize("loss", list(ops.DISTILLATION_LOSSES))
@pytest.mark.parametrize("kw", [{}, {"temperature": 0.7, "vocab_mask": True}])
def test_closed_form_block_holds_two_logit_buffers(loss, kw):
    """XLA's buffer plan for a block of the closed-form path: the student and teacher logits, with
    dlogits written over the student's (see ``fused._fresh``). Compile-only, at a size where XLA fuses
    as at V = 151,936 (at V of a few thousand it picks other fusions and holds 3-4 buffers)."""
    n, d, v, c = 512, 64, 32_768, 128
    spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    vm = jax.ShapeDtypeStruct((v,), jnp.bool_)
    kw = dict(kw)

    def f(hs, ht, w, mask, vm):
        extra = {**kw, "vocab_mask": vm} if "vocab_mask" in kw else kw
        return ops.fused_distillation_loss(hs, ht, w, mask, loss=loss, chunk_size=c, **extra)[0]

    args = (spec(1, n, d), spec(1, n, d), spec(d, v), spec(1, n), vm)
    for fn in (jax.value_and_grad(f, argnums=(0, 2)), f):
        temp = jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes
        assert temp < 2.25 * c * v * 4, f"{temp / (c * v * 4):.2f} [C, V] float32 buffers"


@pytest.mark.parametrize("loss", ["jsd", lambda ls, lt: ops.kl_from_logprobs(ls, lt)])
def test_fused_working_memory_does_not_grow_with_positions(loss):
    """No copy of the hidden states (nor of the per-row outputs) when the block does not divide the
    positions: the last block is shifted back, not padded. 1,000 and 4,000 rows in blocks of 256."""
    d, v, c = 1024, 8192, 256

    def temp(n):
        spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        f = lambda hs, ht, w, m: ops.fused_distillation_loss(hs, ht, w, m, loss=loss, chunk_size=c)[0]
        step = jax.jit(jax.value_and_grad(f, argnums=(0, 2)))
        lowered = step.lower(spec(1, n, d), spec(1, n, d), spec(d, v), spec(1, n))
        return lowered.compile().memory_analysis().temp_size_in_bytes

    small, large = temp(1000), temp(4000)
    assert large - small < 2 ** 20, (small, large)      # padding would copy 3 x 12 MB more


# ---- float64 NumPy reference (values and closed-form gradients) -----------------------------------

@pytest.mark.parametrize("beta", [0.25, 0.9])
def test_jsd_against_float64_numpy(rng, beta):
    x = make(rng, 3, 7, 16, scale=3.0)
    hs, ht, w = (np.asarray(x[k], np.float64) for k in ("hs", "ht", "w"))
    m = np.asarray(x["mask"], np.float64)
    ls, lt = np_lsm(hs @ w), np_lsm(ht @ w)
    lm = np.logaddexp(lt + np.log(beta), ls + np.log1p(-beta))
    kl = lambda a, b: (np.exp(a) * (a - b)).sum(-1)
    per_pos = beta * kl(lt, lm) + (1 - beta) * kl(ls, lm)
    # d/dz_s of the mixture JSD is (1 - beta) p_s (r - sum p_s r) with r = log p_s - log m
    r = ls - lm
    dz = m[..., None] * (1 - beta) * np.exp(ls) * (r - (np.exp(ls) * r).sum(-1, keepdims=True))
    want_gh, want_gw = dz @ w.T, np.einsum("btd,btv->dv", hs, dz)

    close(ops.chunked_generalized_jsd(x["hs"], x["ht"], x["w"], beta, chunk_size=4), per_pos)
    val, (gh, gw) = vg(lambda h, w_: ops.fused_distillation_loss(
        h, x["ht"], w_, x["mask"], beta=beta, chunk_size=4)[0], (0, 1))(x["hs"], x["w"])
    close((val, gh, gw), ((m * per_pos).sum(), want_gh, want_gw))


# ---- numerical edge cases --------------------------------------------------------------------------

def all_finite(tree):
    return all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(tree))


@pytest.mark.parametrize("loss", ["reverse_kl", "jsd"])
def test_all_masked_is_zero_with_finite_grads(rng, loss):
    x = make(rng, 2, 5, 8)
    zero = jnp.zeros((2, 5))
    val, grads = vg(lambda hs, w: ops.fused_distillation_loss(
        hs, x["ht"], w, zero, loss=loss, chunk_size=4)[0], (0, 1))(x["hs"], x["w"])
    assert float(val) == 0.0 and all(not np.any(g) for g in grads)
    val, grads = vg(lambda hs, w: jnp.sum(zero * ops.chunked_generalized_jsd(
        hs, x["ht"], w, 0.5, chunk_size=4)), (0, 1))(x["hs"], x["w"])
    assert float(val) == 0.0 and all(not np.any(g) for g in grads)


def test_large_logits_and_one_token_rows_are_finite(rng):
    x = make(rng, 4, 1, 8, scale=1e4 * np.sqrt(8) / 3)   # logits of order +-1e4, one token per row
    vm = jnp.arange(V) != 0
    for loss in ops.DISTILLATION_LOSSES:
        out = vg(lambda hs, w: ops.fused_distillation_loss(
            hs, x["ht"], w, x["mask"], loss=loss, vocab_mask=vm, temperature=0.7,
            chunk_size=3)[0], (0, 1))(x["hs"], x["w"])
        assert all_finite(out), loss
    out = vg(lambda hs, w: jnp.sum(ops.chunked_token_logprobs(
        hs, w, x["tok"], vocab_mask=vm, with_entropy=True, chunk_size=3)[1]), (0, 1))(x["hs"], x["w"])
    assert all_finite(out)
    out = vg(lambda hs, w: jnp.sum(ops.chunked_kl(hs, x["ht"], w, vocab_mask=vm)),
                             (0, 1))(x["hs"], x["w"])
    assert all_finite(out)


def test_bf16_inputs_agree_with_fp32(rng):
    x = make(rng, 3, 7, 16, scale=3.0)
    bf = lambda a: a.astype(jnp.bfloat16)
    up = lambda a: bf(a).astype(jnp.float32)     # the same bf16-rounded inputs, computed in fp32
    f32 = ops.chunked_generalized_jsd(up(x["hs"]), up(x["ht"]), up(x["w"]), 0.5, chunk_size=4)
    b16 = ops.chunked_generalized_jsd(bf(x["hs"]), bf(x["ht"]), bf(x["w"]), 0.5, chunk_size=4)
    assert b16.dtype == jnp.float32
    close(b16, f32, rtol=1e-5)                   # float32 accumulation: same as fp32 math on bf16 inputs
    loss = lambda hs, w: ops.fused_distillation_loss(hs, bf(x["ht"]), w, x["mask"], chunk_size=4)[0]
    v16, (gh16, gw16) = vg(loss, (0, 1))(bf(x["hs"]), bf(x["w"]))
    v32, (gh32, gw32) = vg(loss, (0, 1))(up(x["hs"]), up(x["w"]))
    assert gh16.dtype == gw16.dtype == jnp.bfloat16
    close((v16, gh16, gw16), (v32, gh32, gw32), rtol=1e-2)   # bf16 rounding of the gradients only


# ---- argument errors -------------------------------------------------------------------------------

def test_bad_arguments_raise_clear_errors(rng):
    x = make(rng, 2, 5, 8)
    with pytest.raises(ValueError, match=r"`hidden` has hidden size 8.*`unembed` expects 7"):
        ops.chunked_entropy(x["hs"], x["w"][:7])
    with pytest.raises(ValueError, match=r"vocab mismatch: `teacher_unembed` has vocab 50"):
        ops.chunked_generalized_jsd(x["hs"], x["ht"], x["w"], teacher_unembed=x["wt"][:, :50])
    with pytest.raises(ValueError, match=r"`unembed` must have rank 2"):
        ops.fused_distillation_loss(x["hs"], x["ht"], x["w"][None], x["mask"])
    with pytest.raises(ValueError, match=r"`teacher_hidden` has leading shape \(2, 4\)"):
        ops.fused_distillation_loss(x["hs"], x["ht"][:, :4], x["w"], x["mask"])
    with pytest.raises(ValueError, match=r"`weights` must have shape \(2, 5\)"):
        ops.fused_distillation_loss(x["hs"], x["ht"], x["w"], x["mask"][:, :3])
    with pytest.raises(ValueError, match=r"`tokens` has shape \(2, 4\)"):
        ops.chunked_token_logprobs(x["hs"], x["w"], x["tok"][:, :4])
    with pytest.raises(ValueError, match=r"`vocab_mask` must have shape \(53,\)"):
        ops.chunked_entropy(x["hs"], x["w"], vocab_mask=jnp.ones(52, bool))
    with pytest.raises(ValueError, match=r"`chunk_size` must be a positive"):
        ops.chunked_entropy(x["hs"], x["w"], chunk_size=0)
    with pytest.raises(ValueError, match=r"`loss` must be one of"):
        ops.fused_distillation_loss(x["hs"], x["ht"], x["w"], x["mask"], loss="tvd")
    with pytest.raises(ValueError, match=r"`beta` must be in"):
        ops.fused_distillation_loss(x["hs"], x["ht"], x["w"], x["mask"], beta=1.5)
    with pytest.raises(ValueError, match=r"`temperature` must be > 0"):
        ops.chunked_entropy(x["hs"], x["w"], temperature=0.0)
