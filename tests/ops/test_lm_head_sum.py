"""``lm_head_sum`` (the gradient formed in the forward pass) vs a float64 autodiff reference on full
logits: values, gradients w.r.t. both sides, float extras and closed-over arrays, frozen sides, a
shared unembedding, bf16 inputs, any block size, and the cost claim (no logits recomputed)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hindsight.ops as ops
from hindsight.ops import PAD_LOGIT
from hindsight.ops import lm_head as lm_head_mod
from hindsight.ops.lm_head import BACKENDS
from tests.ops.test_lm_head import B, D, D_T, T, TEMP, V, VM, args_of, close, make


def row_loss(logits, extras, scale):
    """A per-row loss of both sides' log-softmax, a float extra and a closed-over array; aux = two
    metrics (dtype-generic jnp, so the reference runs it in float64)."""
    zs, zt = logits
    tok, x, mask = extras
    ls, lt = jax.nn.log_softmax(zs), jax.nn.log_softmax(zt)
    lp = jnp.take_along_axis(ls, tok[:, None], axis=-1)[:, 0]
    kl = ops.kl_from_logprobs(ls, lt)
    loss = mask * (jnp.exp(lp) * x[:, 0] + scale * kl + jnp.tanh(x[:, 1]) * lp ** 2)
    return loss, {"lp": lp, "kl": kl}


def head_sum(backend, *, chunk=4, frozen=None):
    def f(hs, ht, w, wt, x, tok, mask, scale):
        total, aux = ops.lm_head_sum(lambda z, e: row_loss(z, e, scale), [hs, ht], [w, wt],
                                     [tok, x, mask], backend=backend, frozen=frozen,
                                     chunk_size=chunk, vocab_mask=jnp.asarray(VM),
                                     temperature=TEMP)
        return total, aux
    return f


def reference(x, scale, *, frozen=(False, False)):
    def f(hs, ht, w, wt, xx, s):
        if frozen[1]:
            ht, wt = jax.lax.stop_gradient(ht), jax.lax.stop_gradient(wt)
        logit = lambda h, w: jnp.where(jnp.asarray(VM), (h @ w) / TEMP, PAD_LOGIT)
        loss, aux = row_loss((logit(hs, w).reshape(B * T, V), logit(ht, wt).reshape(B * T, V)),
                             (jnp.asarray(x["tok"]).reshape(-1), xx.reshape(B * T, 2),
                              jnp.asarray(x["mask"], jnp.float64).reshape(-1)), s)
        return jnp.sum(loss), aux

    with jax.enable_x64(True):
        args = [jnp.asarray(np.asarray(x[k], np.float64)) for k in ("hs", "ht", "w", "wt", "x")]
        (val, aux), grads = jax.value_and_grad(f, (0, 1, 2, 3, 4, 5), has_aux=True)(
            *args, jnp.float64(scale))
        return np.asarray(val), jax.tree.map(lambda a: np.asarray(a).reshape(B, T), aux), \
            [np.asarray(g) for g in grads]


GRAD_ARGS = (0, 1, 2, 3, 4, 7)   # hs, ht, w, wt, x, scale


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("frozen", [None, (False, True)])
def test_sum_matches_float64_reference(rng, backend, frozen):
    x = make(rng)
    fn = jax.jit(jax.value_and_grad(head_sum(backend, frozen=frozen), GRAD_ARGS, has_aux=True))
    (val, aux), grads = fn(*args_of(x), jnp.float32(0.3))
    want_val, want_aux, want = reference(x, 0.3, frozen=frozen or (False, False))
    close((val, grads), (want_val, want))
    close(aux, want_aux)
    if frozen:
        assert not np.any(grads[1]) and not np.any(grads[3])
    assert not np.any(grads[2][:, ~VM]) and not np.any(grads[3][:, ~VM])


@pytest.mark.parametrize("chunk", [1, 3, 13, 1000])
def test_sum_any_block_size(rng, chunk, monkeypatch):
    monkeypatch.setattr(lm_head_mod, "VOCAB_TILE", 16)   # several vocabulary tiles, one shifted
    x = make(rng)
    vg = lambda b, c: jax.jit(jax.value_and_grad(head_sum(b, chunk=c), GRAD_ARGS, has_aux=True))(
        *args_of(x), jnp.float32(0.3))
    close(vg("fused", chunk), vg("dense", None), rtol=3e-6)


def test_sum_value_only_and_scaled_cotangent(rng):
    """Not differentiated, the value-only scan gives the same sum; a cotangent other than 1 (the
    sum times 3, squared) scales the forward-formed gradient exactly."""
    x = make(rng)
    args = args_of(x) + (jnp.float32(0.3),)
    val = jax.jit(lambda *a: head_sum("fused")(*a)[0])(*args)
    want_val, _, _ = reference(x, 0.3)
    close(val, want_val)
    outer = lambda b: jax.jit(jax.grad(lambda *a: (3.0 * head_sum(b)(*a)[0]) ** 2, GRAD_ARGS))
    close(outer("fused")(*args), outer("dense")(*args), rtol=3e-6)


def test_sum_shared_unembedding_and_bf16(rng):
    """A trainable teacher sharing the student's unembedding (one accumulator) and bf16 inputs: the
    fused sum equals the dense one computed from the same bf16 arrays."""
    x = make(rng)
    hs = jnp.asarray(x["hs"], jnp.bfloat16)
    w = jnp.asarray(x["w"], jnp.bfloat16)
    ht = jnp.asarray(rng.normal(size=(B, T, D)), jnp.bfloat16)

    def f(backend):
        def loss(hs, ht, w):
            total, _ = ops.lm_head_sum(lambda z, e: row_loss(z, e, 0.5), [hs, ht], [w, w],
                                       [jnp.asarray(x["tok"]), jnp.asarray(x["x"]),
                                        jnp.asarray(x["mask"])], backend=backend, chunk_size=4)
            return total
        return jax.jit(jax.value_and_grad(loss, (0, 1, 2)))(hs, ht, w)

    (v_f, g_f), (v_d, g_d) = f("fused"), f("dense")
    assert all(g.dtype == jnp.bfloat16 for g in g_f)
    close(v_f, v_d, rtol=1e-5)
    close(g_f, g_d, rtol=2e-2)   # bf16 gradients: rounding of the last cast only


def _dots(fn, *args) -> int:
    """``dot_general`` equations in the jaxpr, inside loops included."""
    count = 0

    def walk(jaxpr):
        nonlocal count
        for eqn in jaxpr.eqns:
            count += eqn.primitive.name == "dot_general"
            for sub in jax.core.jaxprs_in_params(eqn.params):
                walk(sub)
    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return count


def test_sum_computes_no_logits_twice(rng):
    """One trained side: the fused sum's program holds 3 matmuls (logits, d hidden, d unembedding);
    the fused map under the same loss holds 4 (the logits again in the backward pass)."""
    x = make(rng)
    hs, w, tok = jnp.asarray(x["hs"]), jnp.asarray(x["w"]), jnp.asarray(x["tok"])

    def row(z, e):
        lp = jax.nn.log_softmax(z[0])
        return jnp.take_along_axis(lp, e[0][:, None], axis=-1)[:, 0]

    by_sum = jax.grad(lambda h, w: ops.lm_head_sum(lambda z, e: (row(z, e), ()), [h], [w], [tok],
                                                   backend="fused")[0], (0, 1))
    by_map = jax.grad(lambda h, w: jnp.sum(ops.lm_head_map(row, [h], [w], [tok], backend="fused")),
                      (0, 1))
    assert _dots(by_sum, hs, w) == 3
    assert _dots(by_map, hs, w) == 4
    close(by_sum(hs, w), by_map(hs, w), rtol=3e-6)


def test_sum_row_fn_contract(rng):
    x = make(rng)
    hs, w = jnp.asarray(x["hs"]), jnp.asarray(x["w"])
    with pytest.raises(ValueError, match="must return a pair"):
        ops.lm_head_sum(lambda z, e: jnp.sum(z[0], -1), [hs], [w], backend="dense")
    with pytest.raises(ValueError, match="one value per row"):
        ops.lm_head_sum(lambda z, e: (z[0], ()), [hs], [w], backend="fused")
