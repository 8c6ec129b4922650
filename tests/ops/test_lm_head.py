"""The LM-head map's three backends (scan, fused, dense) vs a float64 autodiff reference that never
goes through the LM-head code: values and gradients of losses that use the per-row outputs
nonlinearly and across rows; frozen sides; bf16 unembeddings; chunk padding; compile-time memory."""
import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
import pytest

import hindsight.ops as ops
from hindsight.ops import PAD_LOGIT
from hindsight.ops import fused as fused_mod
from hindsight.ops import lm_head as lm_head_mod
from hindsight.ops.lm_head import BACKENDS

B, T, D, D_T, V = 2, 7, 8, 6, 53      # 14 rows: blocks of 4 need padding (scan) / a shifted block (fused)
TEMP = 0.7
VM = np.arange(V) < V - 3             # three padded vocabulary entries


def make(rng, *, scale=2.0, dtype=np.float32):
    x = dict(hs=rng.normal(size=(B, T, D)), ht=rng.normal(size=(B, T, D_T)),
             w=rng.normal(size=(D, V)) * scale / np.sqrt(D),
             wt=rng.normal(size=(D_T, V)) * scale / np.sqrt(D_T),
             x=rng.normal(size=(B, T, 2)))
    x = {k: np.asarray(v, dtype) for k, v in x.items()}
    x["tok"] = rng.integers(0, V - 3, size=(B, T))
    x["mask"] = np.asarray(rng.random((B, T)) > 0.3, dtype)
    return x


def row_fn(logits, extras):
    """Several per-row outputs of two sides (dtype-generic jnp, so the reference runs it in float64)."""
    zs, zt = logits
    tok, x = extras
    ls, lt = jax.nn.log_softmax(zs), jax.nn.log_softmax(zt)
    return {"lp": jnp.take_along_axis(ls, tok[:, None], axis=-1)[:, 0],
            "ent": ops.entropy_from_logprobs(ls),
            "kl": ops.kl_from_logprobs(ls, lt),
            "x": jnp.sum(jnp.exp(ls[:, :2]) * x, -1)}            # a float extra, mixed with the logits


def downstream(o, mask):
    """Nonlinear in the outputs and mixing rows: exp, a softmax over each sequence, cross-row products."""
    group = jax.nn.softmax(o["ent"], axis=-1)                       # over the T rows of a sequence
    return (jnp.sum(mask * jnp.exp(o["lp"])) + jnp.sum(group * o["kl"])
            + jnp.sum(o["kl"][:, 0] * o["ent"][:, -1]) + jnp.sum(mask * o["x"] ** 2)
            + jnp.prod(1.0 + 0.1 * o["lp"][0, :3]))


def head_loss(backend, *, chunk=4, frozen=None, rows=row_fn):
    def f(hs, ht, w, wt, x, tok, mask):
        o = ops.lm_head_map(rows, [hs, ht], [w, wt], [tok, x], backend=backend, frozen=frozen,
                            chunk_size=chunk, vocab_mask=jnp.asarray(VM), temperature=TEMP)
        return downstream(o, mask)
    return f


def reference(x, *, frozen=(False, False), dtype=np.float64):
    """Float64 value and gradients (hs, ht, w, wt, x) of the same loss, on the full logits."""
    def f(hs, ht, w, wt, xx):
        sg = jax.lax.stop_gradient
        if frozen[1]:
            ht, wt = sg(ht), sg(wt)
        logit = lambda h, w: jnp.where(jnp.asarray(VM), (h @ w) / TEMP, PAD_LOGIT)
        zs, zt = logit(hs, w), logit(ht, wt)
        o = row_fn((zs.reshape(B * T, V), zt.reshape(B * T, V)),
                   (jnp.asarray(x["tok"]).reshape(-1), xx.reshape(B * T, 2)))
        return downstream(jax.tree.map(lambda y: y.reshape(B, T), o), jnp.asarray(x["mask"], dtype))

    with jax.enable_x64(True):
        args = [jnp.asarray(np.asarray(x[k], np.float64), dtype) for k in ("hs", "ht", "w", "wt", "x")]
        val, grads = jax.value_and_grad(f, (0, 1, 2, 3, 4))(*args)
        return np.asarray(val), [np.asarray(g) for g in grads]


def args_of(x):
    return tuple(jnp.asarray(x[k]) for k in ("hs", "ht", "w", "wt", "x", "tok", "mask"))


def close(got, want, rtol=2e-5):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * max(1.0, np.abs(b).max()))


def all_finite(tree):
    return all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(tree))


# ---- values and gradients vs float64 ------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("frozen", [None, (False, True)])
def test_backends_match_float64_reference(rng, backend, frozen):
    x = make(rng)
    val, grads = jax.jit(jax.value_and_grad(head_loss(backend, frozen=frozen), (0, 1, 2, 3, 4)))(
        *args_of(x))
    want_val, want = reference(x, frozen=frozen or (False, False))
    close((val, grads), (want_val, want))
    assert all(g.dtype == jnp.float32 for g in grads)
    assert not np.any(grads[2][:, ~VM]) and not np.any(grads[3][:, ~VM])   # padded vocabulary
    if frozen:
        assert not np.any(grads[1]) and not np.any(grads[3])               # frozen side: constant


@pytest.mark.parametrize("backend", ["scan", "fused"])
@pytest.mark.parametrize("chunk", [1, 3, 13, 1000])
def test_chunk_size_and_padding_exact(rng, backend, chunk):
    """Any block size, dividing the 14 rows or not, gives the dense result to float32 rounding."""
    x = make(rng)
    vg = lambda b, c: jax.jit(jax.value_and_grad(head_loss(b, chunk=c), (0, 1, 2, 3, 4)))(*args_of(x))
    close(vg(backend, chunk), vg("dense", None), rtol=3e-6)


def test_fused_multi_tile_unembedding_gradient(rng, monkeypatch):
    """V = 53 in tiles of 16: three full tiles plus a last one shifted left over an overlap."""
    monkeypatch.setattr(lm_head_mod, "VOCAB_TILE", 16)
    x = make(rng)
    vg = lambda b: jax.jit(jax.value_and_grad(head_loss(b, chunk=5), (0, 1, 2, 3, 4)))(*args_of(x))
    close(vg("fused"), vg("dense"), rtol=3e-6)


def tied_loss(backend, **kw):
    """:func:`head_loss` with both unembeddings given as [V, D] tables, transposed inside the loss
    (the models' tied embeddings: ``unembedding() = embed.T``)."""
    f = head_loss(backend, **kw)
    return lambda hs, ht, table, table_t, *rest: f(hs, ht, table.T, table_t.T, *rest)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tied_unembeddings_match_untied(rng, monkeypatch, backend):
    """Tied tables run in their own [V, D] orientation (the loops contract over D and accumulate the
    table's gradient as [V, D], in tiles of 16 here): the same value and gradients as the [D, V]
    matrices, under jit and eagerly."""
    monkeypatch.setattr(lm_head_mod, "VOCAB_TILE", 16)
    x = make(rng)
    args = args_of(x)
    tied_args = (args[0], args[1], args[2].T, args[3].T) + args[4:]
    want_val, want = jax.jit(jax.value_and_grad(head_loss("dense", chunk=5), (0, 1, 2, 3, 4)))(*args)
    want = (want[0], want[1], want[2].T, want[3].T, want[4])
    for vg in (jax.jit(jax.value_and_grad(tied_loss(backend, chunk=5), (0, 1, 2, 3, 4))),
               jax.value_and_grad(tied_loss(backend, chunk=5), (0, 1, 2, 3, 4))):
        close(vg(*tied_args), (want_val, want), rtol=3e-6)


def test_orientation_follows_the_traced_unembedding(rng):
    """``_is_transpose`` sees ``table.T`` through autodiff tracers and ``stop_gradient`` (under jit),
    and nothing else; the fused backward then carries a [V, D] accumulator for a tied table, a
    [D, V] one for a matrix."""
    seen = []

    def probe(table, w):
        t = table.T
        seen.append(tuple(map(lm_head_mod._is_transpose,
                              (t, jax.lax.stop_gradient(t), w, t * 2.0, jnp.transpose(w).T))))
        return jnp.sum(t) + jnp.sum(w)

    table, w = jnp.ones((V, D)), jnp.ones((D, V))
    jax.jit(jax.grad(probe, (0, 1)))(table, w)
    jax.grad(probe, (0, 1))(table, w)                       # eager: concrete arrays, row-major
    assert seen == [(True, True, False, False, True), (False,) * 5]

    x = make(rng)
    args = args_of(x)
    tied_args = (args[0], args[1], args[2].T, args[3].T) + args[4:]
    carried = _loop_carries(jax.make_jaxpr(jax.grad(tied_loss("fused"), (2, 3)))(*tied_args).jaxpr)
    assert ((V, D), jnp.float32) in carried and ((V, D_T), jnp.float32) in carried
    assert not any(s in ((D, V), (D_T, V)) for s, _ in carried)
    carried = _loop_carries(jax.make_jaxpr(jax.grad(head_loss("fused"), (2, 3)))(*args).jaxpr)
    assert ((D, V), jnp.float32) in carried and not any(s == (V, D) for s, _ in carried)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_unembedding_gradient(rng, backend):
    """A bf16 unembedding over 14 one-row blocks: the fused (float32 tiles) and dense backends give
    the float64 gradient rounded once to bf16; scan sums the 14 block contributions in bf16."""
    x = make(rng)
    w16 = jnp.asarray(x["w"]).astype(jnp.bfloat16)
    x["w"] = np.asarray(w16.astype(jnp.float32))            # the reference sees the same weights
    args = list(args_of(x))
    args[2] = w16
    val, grads = jax.jit(jax.value_and_grad(head_loss(backend, chunk=1), (0, 2)))(*args)
    want_val, want = reference(x)
    assert grads[1].dtype == jnp.bfloat16
    close((val, grads[0]), (want_val, want[0]))              # float32 math on the bf16 weights
    err = np.abs(np.asarray(grads[1], np.float64) - want[2])
    ulp = 2.0 ** -8 * np.abs(want[2]) + 1e-6 * np.abs(want[2]).max()     # one bf16 rounding
    if backend == "scan":     # 14 bf16 roundings of the running sum: about twice the error here
        assert np.linalg.norm(err) < 2.0 ** -6 * np.linalg.norm(want[2])
    else:
        assert np.all(err <= ulp), float((err / ulp).max())


@pytest.mark.parametrize("backend", BACKENDS)
def test_row_fn_closing_over_traced_arrays(rng, backend):
    """A row_fn closing over differentiated arrays: the fused backend hoists them (closure_convert)
    and returns their gradient, as JAX does for the other two."""
    x = make(rng)

    def f(hs, w, alpha, bias):
        def rows(logits, extras):
            (z,), (tok,) = logits, extras
            ls = jax.nn.log_softmax(z + bias)
            return alpha * jnp.take_along_axis(ls, tok[:, None], axis=-1)[:, 0]
        return jnp.sum(jnp.tanh(ops.lm_head_map(rows, [hs], [w], [jnp.asarray(x["tok"])],
                                                 backend=backend, chunk_size=4)))

    args = (jnp.asarray(x["hs"]), jnp.asarray(x["w"]), jnp.float32(0.3),
            jnp.asarray(rng.normal(size=V), jnp.float32))
    got = jax.jit(jax.value_and_grad(f, (0, 1, 2, 3)))(*args)
    with jax.enable_x64(True):
        def ref(hs, w, alpha, bias):
            ls = jax.nn.log_softmax(hs @ w + bias)
            return jnp.sum(jnp.tanh(alpha * jnp.take_along_axis(ls, jnp.asarray(x["tok"])[..., None],
                                                                  axis=-1)[..., 0]))
        r = jax.value_and_grad(ref, (0, 1, 2, 3))(*(jnp.asarray(np.asarray(a), jnp.float64)
                                                    for a in args))
        r = jax.tree.map(np.asarray, r)
    close(got, r)


def test_shared_unembedding_and_unused_outputs(rng):
    """Both sides trainable on one unembedding (one accumulator), and outputs the loss ignores."""
    x = make(rng)
    ht = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)

    def f(backend):
        def loss(hs, ht, w):
            o = ops.lm_head_map(row_fn, [hs, ht], [w, w], [jnp.asarray(x["tok"]), jnp.asarray(x["x"])],
                                backend=backend, chunk_size=4)
            return jnp.sum(jnp.exp(o["kl"]))                 # "lp", "ent", "x": zero cotangents
        return jax.jit(jax.value_and_grad(loss, (0, 1, 2)))(jnp.asarray(x["hs"]), ht,
                                                             jnp.asarray(x["w"]))

    want = f("dense")
    close(f("fused"), want, rtol=3e-6)
    close(f("scan"), want, rtol=3e-6)


# ---- frozen sides: no gradient work --------------------------------------------------------------

def _dots(fn, *args):
    return str(jax.make_jaxpr(fn)(*args)).count("dot_general")


def _loop_carries(jaxpr):
    """Shapes of every value carried by a scan or while loop, at any depth of the jaxpr."""
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            k, c = eqn.params["num_consts"], eqn.params["num_carry"]
            out += [(v.aval.shape, v.aval.dtype) for v in eqn.invars[k:k + c]]
        elif eqn.primitive.name == "while":
            k = eqn.params["cond_nconsts"] + eqn.params["body_nconsts"]
            out += [(v.aval.shape, v.aval.dtype) for v in eqn.invars[k:]]
        for p in eqn.params.values():
            for sub in (p if isinstance(p, (tuple, list)) else (p,)):
                if isinstance(sub, jex.ClosedJaxpr):
                    out += _loop_carries(sub.jaxpr)
                elif isinstance(sub, jex.Jaxpr):
                    out += _loop_carries(sub)
    return out


@pytest.mark.parametrize("how", ["frozen", "stop_gradient"])
def test_fused_frozen_side_costs_nothing_in_backward(rng, how):
    """The teacher (D_T = 6) is recomputed for the student's gradient but gets no dlogits @ W^T, no
    h^T @ dlogits and no [D_T, V] accumulator, whether marked ``frozen`` or stop_gradient-ed."""
    x = make(rng)
    args = args_of(x)
    trainable = head_loss("fused")
    if how == "frozen":
        frozen_loss = head_loss("fused", frozen=(False, True))
    else:
        sg = jax.lax.stop_gradient
        frozen_loss = lambda hs, ht, w, wt, *rest: trainable(hs, sg(ht), w, sg(wt), *rest)
    grad = lambda f: jax.grad(f, (0, 1, 2, 3))
    # forward: 2 projections; backward: 2 recomputed + per differentiated side 2 gradient matmuls
    assert _dots(trainable, *args) == 2
    assert _dots(grad(trainable), *args) == 8
    assert _dots(grad(frozen_loss), *args) == 6
    carried = _loop_carries(jax.make_jaxpr(grad(frozen_loss))(*args).jaxpr)
    # accumulators are shaped like the unembeddings as given ([D, V] matrices here)
    assert ((D, V), jnp.float32) in carried                   # the student's float32 accumulator
    assert not any(s == (D_T, V) for s, _ in carried)         # none for the teacher
    assert ((D_T, V), jnp.float32) in _loop_carries(jax.make_jaxpr(grad(trainable))(*args).jaxpr)


def test_scan_and_dense_honour_frozen(rng):
    x = make(rng)
    args = args_of(x)
    for backend in ("scan", "dense"):
        g = jax.grad(head_loss(backend, frozen=(False, True)), (0, 2))
        # scan: forward 2, remat backward 2 recomputed + 2 for the student; dense: 2 + 2
        assert _dots(g, *args) == {"scan": 6, "dense": 4}[backend]


def test_fused_skips_backward_when_no_output_is_differentiated(rng):
    """Outputs the caller does not differentiate (metrics, aux) reach the rule as symbolic zeros."""
    x = make(rng)
    f = lambda hs, w: jnp.sum(jax.lax.stop_gradient(ops.lm_head_map(
        lambda z, e: jax.nn.logsumexp(z[0], -1), [hs], [w], backend="fused", chunk_size=4))) + jnp.sum(hs)
    g = jax.grad(f, (0, 1))
    assert _dots(g, jnp.asarray(x["hs"]), jnp.asarray(x["w"])) == 1
    gh, gw = jax.jit(g)(jnp.asarray(x["hs"]), jnp.asarray(x["w"]))
    assert np.all(np.asarray(gh) == 1.0) and not np.any(gw)


# ---- composition, edge cases, errors --------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_eager_grad_has_aux_and_vmap_compose(rng, backend):
    x = make(rng)
    args = args_of(x)

    def f(hs, w):
        o = ops.lm_head_map(row_fn, [hs, args[1]], [w, args[3]], [args[5], args[4]],
                            backend=backend, frozen=(False, True), chunk_size=4,
                            vocab_mask=jnp.asarray(VM), temperature=TEMP)
        return downstream(o, args[6]), o["kl"]

    want = jax.jit(jax.value_and_grad(lambda hs, w: head_loss("dense", frozen=(False, True))(
        hs, args[1], w, *args[3:]), (0, 1)))(args[0], args[2])
    (val, kl), grads = jax.value_and_grad(f, (0, 1), has_aux=True)(args[0], args[2])   # eager
    close((val, grads), want, rtol=3e-6)
    assert kl.shape == (B, T)
    g = jax.jit(jax.grad(lambda hs, w: f(hs, w)[0]))(args[0], args[2])
    close(g, want[1][0], rtol=3e-6)
    hs2 = jnp.stack([args[0], -args[0]])
    gv = jax.jit(jax.vmap(jax.grad(lambda hs: f(hs, args[2])[0])))(hs2)
    close(gv[0], want[1][0], rtol=3e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_rows_and_large_logits_are_finite(rng, backend):
    """Logits of order 1e4, tokens on padded vocabulary entries in masked rows (log-prob ~ -1e9)."""
    x = make(rng, scale=1e4 * np.sqrt(D) / 3)
    x["tok"] = np.where(x["mask"] > 0, x["tok"], V - 1)          # V - 1 is padded
    x["mask"][0] = 0.0                                           # one fully masked sequence
    val, grads = jax.jit(jax.value_and_grad(head_loss(backend), (0, 1, 2, 3, 4)))(*args_of(x))
    assert all_finite((val, grads))


def test_one_default_backend_everywhere(rng):
    from hindsight.methods import LMHead
    from hindsight.train.experiment import TrainSection

    assert ops.LM_HEAD_BACKENDS == ("scan", "fused", "dense")
    assert ops.LM_HEAD_DEFAULT == LMHead().backend == TrainSection().lm_head == "fused"
    x = make(rng)
    args = args_of(x)
    out = ops.lm_head_map(row_fn, [args[0], args[1]], [args[2], args[3]], [args[5], args[4]],
                          chunk_size=4)
    direct = ops.lm_head_map(row_fn, [args[0], args[1]], [args[2], args[3]], [args[5], args[4]],
                             backend="fused", chunk_size=4)
    for k in out:
        np.testing.assert_array_equal(out[k], direct[k])


def test_bad_arguments_raise(rng):
    x = make(rng)
    hs, w = jnp.asarray(x["hs"]), jnp.asarray(x["w"])
    rows = lambda z, e: jax.nn.logsumexp(z[0], -1)
    with pytest.raises(ValueError, match=r"`backend` must be one of"):
        ops.lm_head_map(rows, [hs], [w], backend="pallas")
    with pytest.raises(ValueError, match=r"`frozen` must be a sequence of 1 static bools"):
        ops.lm_head_map(rows, [hs], [w], frozen=(True, False))
    with pytest.raises(ValueError, match=r"`frozen` must be a sequence"):
        ops.lm_head_map(rows, [hs], [w], frozen=(jnp.bool_(True),))
    with pytest.raises(ValueError, match=r"must return arrays of \[C, \.\.\.\]"):
        ops.lm_head_map(lambda z, e: jnp.sum(z[0]), [hs], [w], backend="fused")


# ---- compile-time memory ----------------------------------------------------------------------------

@pytest.mark.parametrize("tied", [True, False])
def test_fused_temp_memory_has_no_gradient_sized_buffer(tied):
    """XLA's temporaries at V = 32,768, D = 256, 1,024 rows in blocks of 32, for a tied unembedding
    (a [V, D] table transposed, as the models' tied embeddings, differentiated w.r.t. the table) and
    an untied [D, V] matrix: the scan backend holds a float32 gradient-sized buffer beyond its
    blocks (its per-block gradient contribution), the fused one only a few [C, V] blocks and one
    [VOCAB_TILE, D] tile (no copy of the unembedding in the other orientation, no transposed
    accumulator); dense holds [N, V] logits."""
    n, d, v, c = 1024, 256, 32_768, 32
    spec = lambda *s, t=jnp.float32: jax.ShapeDtypeStruct(s, t)
    unembed = (lambda p: p.T) if tied else (lambda p: p)
    p_shape = (v, d) if tied else (d, v)

    def grpo_row(logits, extras):
        (z,), (tok,) = logits, extras
        return jnp.take_along_axis(jax.nn.log_softmax(z), tok[:, None], axis=-1)[:, 0]

    def kl_row(logits, _):
        ls, lt = (jax.nn.log_softmax(z) for z in logits)
        return ops.kl_from_logprobs(ls, lt)

    def temps(backend):
        def grpo(hs, p, tok, adv):
            lp = ops.lm_head_map(grpo_row, [hs], [unembed(p)], [tok], backend=backend,
                                 chunk_size=c)
            r = jnp.exp(lp - jax.lax.stop_gradient(lp))
            return -jnp.sum(jnp.minimum(r * adv, jnp.clip(r, 0.8, 1.2) * adv))

        def kl(hs, ht, p, pt):
            return jnp.sum(ops.lm_head_map(kl_row, [hs, ht], [unembed(p), unembed(pt)],
                                           backend=backend, chunk_size=c, frozen=(False, True)))

        lowered = [jax.jit(jax.value_and_grad(grpo, (0, 1))).lower(
                       spec(1, n, d), spec(*p_shape), spec(1, n, t=jnp.int32), spec(1, n)),
                   jax.jit(jax.value_and_grad(kl, (0, 2))).lower(
                       spec(1, n, d), spec(1, n, d), spec(*p_shape), spec(*p_shape))]
        return [low.compile().memory_analysis().temp_size_in_bytes for low in lowered]

    scan, fused, dense = (temps(b) for b in ("scan", "fused", "dense"))
    grad_w, block, tile = d * v * 4, c * v * 4, d * lm_head_mod.VOCAB_TILE * 4
    for s, f, de in zip(scan, fused, dense):
        assert s >= grad_w                                      # scan: a gradient-sized temporary
        assert f < 4 * block + tile < grad_w <= s
        assert de > 8 * s and de > 20 * f
