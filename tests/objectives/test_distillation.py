import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hindsight.ops as ops
from hindsight.objectives import (DIVERGENCES, distillation_loss, finalize, finalize_metrics,
                                  sampled_distillation_loss)

from .helpers import jitted, np_log_softmax, pad_rows_cols, random_mask, row_chunks
from .test_aggregation import reference as agg_reference


def np_kl(lp, lq):
    return (np.exp(lp) * (lp - lq)).sum(-1)


def np_divergence(ls, lt, divergence, beta=0.5):
    """Per-position divergence from float64 log-probs; TRL beta convention for "jsd"."""
    if divergence == "forward_kl":
        return np_kl(lt, ls)
    if divergence == "reverse_kl":
        return np_kl(ls, lt)
    lm = np.logaddexp(lt + np.log(beta), ls + np.log1p(-beta))
    return beta * np_kl(lt, lm) + (1 - beta) * np_kl(ls, lm)


def np_topk_tail(lp, idx):
    picked = np.take_along_axis(lp, idx, -1)
    head = np.minimum(np.log(np.exp(picked).sum(-1, keepdims=True)), -1e-7)
    return np.concatenate([picked, np.log(-np.expm1(head))], -1)


def reference(s_logits, t_logits, mask, divergence, *, beta=0.5, temperature=1.0, vocab_mask=None,
              top_k=None, support="student"):
    s, t = (np.asarray(x, np.float64) / temperature for x in (s_logits, t_logits))
    if vocab_mask is not None:  # padded entries have probability 0: drop them
        s, t = s[..., vocab_mask], t[..., vocab_mask]
    ls, lt = np_log_softmax(s), np_log_softmax(t)
    if top_k is not None:
        idx = np.argsort(-(ls if support == "student" else lt), -1, kind="stable")[..., :top_k]
        ls, lt = np_topk_tail(ls, idx), np_topk_tail(lt, idx)
    return np.where(mask > 0, np_divergence(ls, lt, divergence, beta), 0.0)


def test_spec_kl_jsd_numbers():
    s = jnp.log(jnp.array([[[0.7, 0.2, 0.1]]]))
    t = jnp.log(jnp.array([[[0.5, 0.45, 0.05]]]))
    m = jnp.ones((1, 1))
    for divergence, expected in [("forward_kl", 0.162025), ("reverse_kl", 0.142659), ("jsd", 0.037289)]:
        total, count, _ = jitted(distillation_loss, divergence=divergence)(s, t, m)
        np.testing.assert_allclose(finalize(total, count), expected, atol=1e-6)


def test_spec_topk_tail_number():
    lp = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
    tail = jax.jit(ops.topk_tail_logprobs)(lp, jnp.array([0, 1]))
    np.testing.assert_allclose(jnp.exp(tail), [0.5, 0.3, 0.2], rtol=1e-6)
    # The loss over the student's top-2 + tail is the divergence between the two 3-bucket distributions.
    t = jnp.log(jnp.array([0.4, 0.1, 0.3, 0.2]))
    total, _, _ = jitted(distillation_loss, divergence="reverse_kl", top_k=2)(lp[None, None], t[None, None],
                                                                            jnp.ones((1, 1)))
    np.testing.assert_allclose(total, np_kl(np.log([0.5, 0.3, 0.2]), np.log([0.4, 0.1, 0.5])), rtol=1e-5)


CASES = [
    dict(shape=(2, 1, 5), divergence="forward_kl"),
    dict(shape=(3, 4, 11), divergence="reverse_kl", temperature=1.1, vocab=9, mode="seq-mean-token-mean"),
    dict(shape=(4, 6, 17), divergence="jsd", beta=0.3, top_k=5),
    dict(shape=(3, 5, 13), divergence="jsd", top_k=4, support="teacher", vocab=11, temperature=0.7,
         mode="seq-mean-token-sum"),
    dict(shape=(2, 7, 8), divergence="forward_kl", top_k=3),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['divergence']}-{c['shape']}-k{c.get('top_k')}")
def test_matches_float64_reference(case):
    case = dict(case)
    b, t, v = case.pop("shape")
    vocab = case.pop("vocab", None)
    mode = case.pop("mode", "token-mean")
    rng = np.random.default_rng(b * t * v)
    s_logits = (rng.normal(size=(b, t, v)) * 2).astype(np.float32)
    t_logits = (rng.normal(size=(b, t, v)) * 2).astype(np.float32)
    mask = random_mask(rng, b, t)
    vocab_mask = None if vocab is None else np.arange(v) < vocab
    ref = reference(s_logits, t_logits, mask, vocab_mask=vocab_mask, **case)
    total, count, metrics = jitted(distillation_loss, mode=mode, **case)(
        jnp.asarray(s_logits), jnp.asarray(t_logits), jnp.asarray(mask),
        vocab_mask=None if vocab_mask is None else jnp.asarray(vocab_mask))
    rs, rc = agg_reference(ref, mask, mode)
    assert total.dtype == jnp.float32 and float(count) == rc
    np.testing.assert_allclose(total, rs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["divergence"][0], ref.sum(), rtol=1e-5, atol=1e-6)


VARIANTS = {name: dict(divergence=name) for name in DIVERGENCES}
VARIANTS["jsd-top4-seq-mean"] = dict(divergence="jsd", beta=0.2, top_k=4, mode="seq-mean-token-mean")


def test_gradients_padding_micro_batching():
    rng = np.random.default_rng(1)
    b, t, v = 6, 5, 12
    s_logits = rng.normal(size=(b, t, v)).astype(np.float32)
    t_logits = rng.normal(size=(b, t, v)).astype(np.float32)
    s_logits[2, 0, :4] = [1e4, -1e4, 1e4, 0.0]
    t_logits[2, 0, :4] = [-1e4, 1e4, 0.0, -1e4]
    mask = random_mask(rng, b, t)
    s_logits[0] = np.nan  # an all-masked row may hold garbage
    # Every variant in one compiled function: one compile per input shape.
    f = jax.jit(lambda *a: {name: distillation_loss(*a, **kw) for name, kw in VARIANTS.items()})
    args = [jnp.asarray(x) for x in (s_logits, t_logits, mask)]
    full = f(*args)
    losses = {name: finalize(*out[:2]) for name, out in full.items()}
    g_s, g_t = jax.jit(jax.grad(lambda *a: sum(finalize(*out[:2]) for out in f(*a).values()),
                                argnums=(0, 1)))(*args)
    assert all(np.isfinite(x) for x in losses.values()) and np.all(np.isfinite(g_s))
    assert np.all(np.asarray(g_s)[mask == 0] == 0.0) and np.all(np.asarray(g_t) == 0.0)  # teacher is a target
    padded = f(*(jnp.asarray(pad_rows_cols(x, 2, 3, val)) for x, val in zip((s_logits, t_logits, mask),
                                                                             (3.0, -7.0, 0.0))))
    parts = [f(*(x[sl] for x in args)) for sl in row_chunks(b, (3, 3))]
    combined = jax.tree.map(lambda *p: sum(p), *parts)
    for name, expected in losses.items():
        for other in (padded[name], combined[name]):
            np.testing.assert_allclose(finalize(*other[:2]), expected, rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(finalize(*other[2]["divergence"]),
                                       finalize(*full[name][2]["divergence"]), rtol=1e-6, atol=1e-7)


def test_jit_vmap_bf16():
    rng = np.random.default_rng(4)
    s_logits = jnp.asarray(rng.normal(size=(2, 3, 4, 10)).astype(np.float32))
    t_logits = jnp.asarray(rng.normal(size=(2, 3, 4, 10)).astype(np.float32))
    mask = jnp.asarray(np.stack([random_mask(rng, 3, 4), random_mask(rng, 3, 4, contiguous=False)]))
    f = jax.jit(jax.vmap(lambda *a: finalize(*distillation_loss(*a, divergence="jsd", top_k=4)[:2])))
    out = f(s_logits, t_logits, mask)
    for i in range(2):
        ref = reference(s_logits[i], t_logits[i], np.asarray(mask[i]), "jsd", top_k=4)
        np.testing.assert_allclose(out[i], ref.sum() / np.asarray(mask[i]).sum(), rtol=1e-5)
    low = f(s_logits.astype(jnp.bfloat16), t_logits.astype(jnp.bfloat16), mask)
    assert low.dtype == jnp.float32
    np.testing.assert_allclose(low, out, rtol=3e-2, atol=3e-3)


def sampled_reference(ls, lt, lo, mask, is_clip):
    ls, lt = np.asarray(ls, np.float64), np.asarray(lt, np.float64)
    m = mask > 0
    w = np.ones_like(ls) if lo is None else np.minimum(np.exp(np.clip(ls - lo, -20, 20)), is_clip)
    loss = np.where(m, -(lt - ls) * ls * w, 0.0)
    grad = np.where(m, (ls - lt) * w, 0.0)  # d loss / d logp_student (advantage and weight are constants)
    return loss, grad, np.where(m, w, 0.0), np.where(m, ls - lt, 0.0)


@pytest.mark.parametrize("use_old", [False, True])
def test_sampled_matches_reference_and_micro_batches(use_old):
    rng = np.random.default_rng(9)
    b, t = 8, 9
    ls = -rng.exponential(1.0, size=(b, t)).astype(np.float32)
    lt = -rng.exponential(1.0, size=(b, t)).astype(np.float32)
    lo = (ls + rng.normal(scale=1.0, size=(b, t))).astype(np.float32) if use_old else None
    mask = random_mask(rng, b, t)
    loss, grad, w, k1 = sampled_reference(ls, lt, lo, mask, 2.0)

    def run(x, lt_, lo_, m):
        total, count, metrics = sampled_distillation_loss(x, lt_, m, logp_old=lo_, is_clip=2.0)
        return total, (count, metrics)

    f = jax.jit(jax.value_and_grad(run, has_aux=True))
    args = [jnp.asarray(x) if x is not None else None for x in (ls, lt, lo, mask)]
    (total, (count, metrics)), g = f(*args)
    np.testing.assert_allclose(total, loss.sum(), rtol=1e-5, atol=1e-6)
    assert float(count) == mask.sum()
    np.testing.assert_allclose(g, grad, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["reverse_kl"][0], k1.sum(), rtol=1e-5, atol=1e-6)
    if use_old:
        np.testing.assert_allclose(metrics["is_weight"][0], w.sum(), rtol=1e-5)
        assert 0 < float(metrics["is_clip_frac"][0]) < mask.sum()
    parts = [f(*(None if x is None else x[sl] for x in args))[0] for sl in row_chunks(b, (4, 4))]
    cs, (cc, cm) = jax.tree.map(lambda *p: sum(p), *parts)
    np.testing.assert_allclose(finalize(cs, cc), finalize(total, count), rtol=1e-6, atol=1e-7)
    for name, value in finalize_metrics(cm).items():
        np.testing.assert_allclose(value, finalize(*metrics[name]), rtol=1e-6, atol=1e-7)


def test_sampled_gradient_is_reverse_kl_gradient():
    """Averaged over tokens drawn from the student, the sampled loss has the gradient of KL(S || T)."""
    rng = np.random.default_rng(0)
    s_logits = jnp.asarray(rng.normal(size=6).astype(np.float32))
    lt = jax.nn.log_softmax(jnp.asarray(rng.normal(size=6).astype(np.float32)))

    def sampled(logits, y):
        ls = jax.nn.log_softmax(logits)
        return sampled_distillation_loss(ls[y][None, None], lt[y][None, None], jnp.ones((1, 1)))[0]

    per_token = jax.jit(jax.vmap(jax.grad(sampled), in_axes=(None, 0)))(s_logits, jnp.arange(6))
    expected = jax.jit(jax.grad(lambda x: ops.kl_from_logprobs(jax.nn.log_softmax(x), lt)))(s_logits)
    p = jax.nn.softmax(s_logits)
    np.testing.assert_allclose(jnp.sum(p[:, None] * per_token, 0), expected, rtol=1e-5, atol=1e-6)


def test_sampled_extremes_vmap_bf16():
    rng = np.random.default_rng(3)
    ls = jnp.asarray([[-1e4, 0.0, -2.0], [jnp.nan, jnp.nan, jnp.nan], [-0.5, -1e4, -0.1]])
    lt = jnp.asarray([[0.0, -1e4, -1.0], [0.0, 0.0, 0.0], [-0.2, 0.0, -1e4]])
    mask = jnp.asarray([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    f = jax.jit(jax.grad(lambda x: finalize(*sampled_distillation_loss(x, lt, mask, logp_old=lt)[:2])))
    g = f(ls)
    assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[np.asarray(mask) == 0] == 0.0)
    a, b, c = (jnp.asarray(-rng.exponential(size=(2, 3, 4)).astype(np.float32)) for _ in range(3))
    m = jnp.asarray(np.stack([random_mask(rng, 3, 4), random_mask(rng, 3, 4, contiguous=False)]))
    f = jax.jit(jax.vmap(lambda *x: finalize(*sampled_distillation_loss(*x[:3], logp_old=x[3])[:2])))
    out = f(a, b, m, c)
    for i in range(2):
        loss = sampled_reference(a[i], b[i], np.asarray(c[i], np.float64), np.asarray(m[i]), 2.0)[0]
        np.testing.assert_allclose(out[i], loss.sum() / np.asarray(m[i]).sum(), rtol=1e-5, atol=1e-6)
    low = f(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), m, c.astype(jnp.bfloat16))
    assert low.dtype == jnp.float32
    np.testing.assert_allclose(low, out, rtol=3e-2, atol=3e-2)


def test_bad_input():
    s, m = jnp.zeros((2, 3, 5)), jnp.ones((2, 3))
    vocab_error = (r"vocab mismatch: `student_logits` has vocab 5 \(shape \(2, 3, 5\)\) "
                   r"but `teacher_logits` has vocab 6")
    with pytest.raises(ValueError, match=vocab_error):
        distillation_loss(s, jnp.zeros((2, 3, 6)), m, divergence="reverse_kl")
    with pytest.raises(ValueError, match="`divergence` must be one of"):
        distillation_loss(s, s, m, divergence="kl")
    with pytest.raises(TypeError, match="divergence"):
        distillation_loss(s, s, m)
    with pytest.raises(ValueError, match="`beta` only applies to divergence='jsd'"):
        distillation_loss(s, s, m, divergence="forward_kl", beta=0.5)
    with pytest.raises(ValueError, match=r"`mask` has shape \(2, 4\), expected leading dims \(2, 3\)"):
        distillation_loss(s, s, jnp.ones((2, 4)), divergence="jsd")
    with pytest.raises(ValueError, match="`temperature` must be positive"):
        distillation_loss(s, s, m, divergence="jsd", temperature=0.0)
    with pytest.raises(ValueError, match=r"`top_k` must be None or a Python int in \[1, 5\)"):
        distillation_loss(s, s, m, divergence="jsd", top_k=5)
    with pytest.raises(ValueError, match="`support` must be one of"):
        distillation_loss(s, s, m, divergence="jsd", top_k=2, support="both")
    with pytest.raises(ValueError, match=r"`logp_student` \(2, 3\), `logp_teacher` \(2, 4\)"):
        sampled_distillation_loss(m, jnp.ones((2, 4)), m)
    with pytest.raises(ValueError, match="needs `norm`"):
        sampled_distillation_loss(m, m, m, mode="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="`is_clip` must be positive"):
        sampled_distillation_loss(m, m, m, logp_old=m, is_clip=0.0)
