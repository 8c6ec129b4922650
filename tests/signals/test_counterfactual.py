"""CRAFT credit, CTI loss, controller and polarised KL (spec §4) against float64 NumPy references."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hindsight.signals as signals
from hindsight.ops import token_logprobs
from ._reference import (assert_close, assert_digits, assert_finite_tree, bf16_round, f64, gather,
                         jitted, log_softmax, random_logits, random_mask, sigmoid)

SPEC_D = [[0.5, 1.0], [-0.5, 0.2], [1.5, 0.0], [0.0, 2.0]]
SPEC_M = [[1, 1], [1, 1], [1, 0], [1, 1]]
SPEC_A = [1.0, -1.0, 1.0, -1.0]
SPEC_P = [[0.5, 0.4], [0.3, 0.6], [0.2, 0.9], [0.7, 0.5]]


def ref_credit(gap, mask, adv, g, tau=1.0, k=2.0, kappa_pos=1.0, kappa_neg=0.5, g_min=2):
    gap, mask, adv = f64(gap), f64(mask) > 0, f64(adv)
    out = np.zeros(gap.shape)
    for p in range(gap.shape[0] // g):
        rows = range(p * g, (p + 1) * g)
        for i in rows:
            for t in range(gap.shape[1]):
                sib = [j for j in rows if j != i and mask[j, t]]
                if not mask[i, t] or len(sib) < g_min:
                    continue
                logit = gap[sib, t] / tau
                w = np.exp(logit - logit.max())
                w /= w.sum()
                da = (w * adv[sib]).sum() - adv[sib].mean()
                c0 = 2 * sigmoid(k * da) - 1
                out[i, t] = (kappa_pos if da >= 0 else kappa_neg) * c0
    return out


def ref_k3(ls, lr, clip=10.0):
    d = np.clip(f64(lr) - f64(ls), -20, 20)
    return np.clip(np.exp(d) - 1 - d, -clip, clip)


def ref_polarised(ls, lr, c, mask, theta=0.1, neg_mode="forward", neutral="reverse"):
    d = np.clip(f64(lr) - f64(ls), -20, 20)
    r = np.exp(d)
    rev = np.clip(r - 1 - d, -10, 10)
    neg = np.clip(r * d - (r - 1), -10, 10) if neg_mode == "forward" else -rev
    mid = rev if neutral == "reverse" else 0 * rev
    c = f64(c)
    return np.where(c > theta, rev, np.where(c < -theta, neg, mid)) * f64(mask)


def test_spec_numbers():
    c = signals.counterfactual_credit_from_gap(jnp.array(SPEC_D), jnp.array(SPEC_M, jnp.float32),
                                               jnp.array(SPEC_A), 4)
    assert_digits(c[:, 0], [0.6671, 0.3681, 0.3331, 0.4515], 4)
    assert_digits(c[:, 1], [0.0, -0.2159, 0.0, 0.3627], 4)
    assert float(c[0, 1]) == 0.0 and float(c[2, 1]) == 0.0  # zero-evidence siblings; masked
    total, count = signals.cti_loss(c, jnp.array(SPEC_D), jnp.log(jnp.array(SPEC_P)),
                                    jnp.array(SPEC_M))
    assert float(count) == 7.0
    assert_digits(total / count, 0.18492, 5)
    active, count = signals.credit_activity(c, jnp.array(SPEC_M))
    rho = active / count
    assert float(active) == 6.0
    assert_digits(rho, 0.8571, 4)
    state = signals.controller_update(signals.controller_init(), rho)
    assert_digits(state.ema, 0.5357, 4)
    assert_digits(state.lam, 0.010364, 6)
    assert_digits(state.mu, 0.000931, 6)
    ls, lr = jnp.log(jnp.full((1, 3), 0.3)), jnp.log(jnp.full((1, 3), 0.5))
    kl = signals.polarised_kl(ls, lr, jnp.array([[0.5, 0.0, -0.5]]), jnp.ones((1, 3)))
    assert_digits(kl[0], [0.15584, 0.15584, 0.18471], 5)
    assert_digits(signals.reverse_k3(ls, lr, jnp.ones((1, 3)))[0], [0.15584] * 3, 5)


def test_controller_clips_and_init():
    state = signals.controller_init()
    np.testing.assert_allclose([state.ema, state.lam, state.mu], [0.5, 0.01, 0.001], rtol=1e-7)
    for _ in range(200):
        state = signals.controller_update(state, 1.0, k_up=20.0, k_down=20.0)
    np.testing.assert_allclose([state.lam, state.mu], [0.1, 0.0001], rtol=1e-6)
    assert jax.tree_util.tree_structure(state) == jax.tree_util.tree_structure(
        jax.jit(signals.controller_update)(state, jnp.float32(0.3)))


CREDIT_CASES = [((2, 4, 5), {}), ((3, 3, 7), {"tau": 0.5, "k": 3.0}),
                ((1, 8, 4), {"kappa_pos": 0.7, "kappa_neg": 0.2, "g_min": 3})]


@pytest.mark.parametrize("shape,options", CREDIT_CASES)
def test_credit_matches_reference(shape, options):
    p, g, t = shape
    rng = np.random.default_rng(g * t)
    gap = jnp.asarray(rng.normal(size=(p * g, t)) * 1.5, jnp.float32)
    adv = jnp.asarray(rng.normal(size=p * g), jnp.float32)
    for right_padded in (True, False):
        mask = random_mask(rng, p * g, t, right_padded=right_padded)
        out = jitted(signals.counterfactual_credit_from_gap, group_size=g, **options)(gap, mask, adv)
        assert out.dtype == jnp.float32 and out.shape == (p * g, t)
        assert_close(out, ref_credit(gap, mask, adv, g, **options))


def test_credit_edge_cases():
    rng = np.random.default_rng(7)
    gap = jnp.asarray(rng.normal(size=(6, 5)), jnp.float32)
    mask = jnp.ones((6, 5))
    adv = jnp.asarray(rng.normal(size=6), jnp.float32)
    # G = 2: one sibling only, the estimator is identically 0 (CTI disabled)
    credit = lambda g, *a: jitted(signals.counterfactual_credit_from_gap, group_size=g)(*a)
    np.testing.assert_array_equal(credit(2, gap, mask, adv), 0.0)
    # constant advantages in a group -> dA = 0
    np.testing.assert_array_equal(credit(3, gap, mask, jnp.ones(6)), 0.0)
    # huge gaps: softmax in log space stays finite and matches the reference
    big = gap * 1e4
    out = credit(3, big, mask, adv)
    assert_finite_tree(out)
    assert_close(out, ref_credit(big, mask, adv, 3))


def test_credit_from_logits_and_bf16():
    rng = np.random.default_rng(8)
    b, t, v, g = 6, 5, 7, 3
    teacher, student = random_logits(rng, (b, t, v)), random_logits(rng, (b, t, v))
    tokens = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
    mask, adv = random_mask(rng, b, t), jnp.asarray(rng.normal(size=b), jnp.float32)
    tok = np.asarray(tokens)
    gap = gather(log_softmax(teacher), tok) - gather(log_softmax(student), tok)
    fn = jitted(signals.counterfactual_credit, group_size=g)
    out = fn(teacher, student, tokens, mask, adv)
    assert_close(out, ref_credit(gap, mask, adv, g))
    bf = fn(teacher.astype(jnp.bfloat16), student.astype(jnp.bfloat16), tokens, mask, adv)
    assert bf.dtype == jnp.float32
    assert_close(bf, fn(bf16_round(teacher), bf16_round(student), tokens, mask, adv), 1e-6, 1e-6)
    assert_close(bf, out, 0, 0.1)
    pairs = jnp.stack([teacher, student]), jnp.stack([student, teacher])
    both = lambda x: jnp.stack([x, x])
    batched = jax.jit(jax.vmap(fn))(*pairs, both(tokens), both(mask), both(adv))
    assert_close(batched[0], out, 1e-6, 1e-7)
    assert_close(batched[1], fn(student, teacher, tokens, mask, adv), 1e-6, 1e-7)


@pytest.mark.parametrize("neg_mode,neutral", itertools.product(["forward", "negate"],
                                                                ["reverse", "zero"]))
def test_cti_and_polarised_kl_match_reference(neg_mode, neutral):
    rng = np.random.default_rng(9)
    b, t = 4, 6
    ls = jnp.asarray(np.log(rng.uniform(0.01, 1, (b, t))), jnp.float32)
    lr = jnp.asarray(np.log(rng.uniform(0.01, 1, (b, t))), jnp.float32)
    c = jnp.asarray(rng.uniform(-0.5, 1, (b, t)), jnp.float32)
    gap = jnp.asarray(rng.normal(size=(b, t)), jnp.float32)
    mask = random_mask(rng, b, t)
    m = f64(mask)
    out = jitted(signals.polarised_kl, neg_mode=neg_mode, neutral=neutral)(ls, lr, c, mask)
    assert_close(out, ref_polarised(ls, lr, c, mask, neg_mode=neg_mode, neutral=neutral))
    total, count = signals.cti_loss(c, gap, ls, mask)
    assert float(count) == m.sum()
    assert_close(total, -(f64(c) * f64(gap) * f64(ls) * m).sum())
    assert_close(signals.reverse_k3(ls, lr, mask), ref_k3(ls, lr) * m)


def _craft_case(rng, p=2, g=4, t=6, v=5, scale=2.0):
    b = p * g
    student = random_logits(rng, (b, t, v), scale)
    ref = random_logits(rng, (b, t, v), scale)
    tokens = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
    gap = jnp.asarray(rng.normal(size=(b, t)), jnp.float32)
    return student, ref, tokens, gap, random_mask(rng, b, t), jnp.asarray(rng.normal(size=b),
                                                                          jnp.float32)


def _craft_loss(student_logits, ref_logits, tokens, gap, mask, adv, state, **flags):
    ls = token_logprobs(student_logits, tokens)
    lr = token_logprobs(ref_logits, tokens)
    total, count, metrics = signals.craft_loss_terms(ls, lr, gap, mask, adv, 4, state, **flags)
    return total / jnp.maximum(count, 1.0), metrics


craft_jit = jax.jit(_craft_loss, static_argnames=("cti", "controller", "polarise"))

FLAGS = [dict(cti=a, controller=b, polarise=c) for a, b, c in itertools.product([True, False],
                                                                                repeat=3)]


@pytest.mark.parametrize("flags", FLAGS)
def test_craft_loss_terms_match_reference(flags):
    rng = np.random.default_rng(10)
    student, ref, tokens, gap, mask, adv = _craft_case(rng)
    state = signals.controller_update(signals.controller_init(), 0.9)
    loss, metrics = craft_jit(student, ref, tokens, gap, mask, adv, state, **flags)
    tok, m = np.asarray(tokens), f64(mask)
    ls, lr = gather(log_softmax(student), tok), gather(log_softmax(ref), tok)
    c = ref_credit(gap, mask, adv, 4)
    if flags["cti"]:  # -c D logp_S
        distill = (-c * f64(gap) * ls * m).sum()
    else:  # SDAR: g (sg(logp_T) - logp_S), whose value is g D
        distill = (sigmoid(5.0 * f64(gap)) * f64(gap) * m).sum()
    kl = (ref_polarised(ls, lr, c, mask) if flags["polarise"] else ref_k3(ls, lr) * m).sum()
    lam, mu = (float(state.lam), float(state.mu)) if flags["controller"] else (0.01, 0.001)
    assert_close(metrics["distill_sum"], distill)
    assert_close(metrics["kl_sum"], kl)
    assert_close([metrics["lambda"], metrics["mu"]], [lam, mu], 1e-6, 0)
    assert_close(loss, (lam * distill + mu * kl) / m.sum())
    if flags["cti"] or flags["polarise"] or flags["controller"]:
        assert float(metrics["active_sum"]) == ((np.abs(c) > 0.1) * m).sum()


def _baseline(student_logits, ref_logits, tokens, gap, mask):
    """Hand-written baseline: SDAR's gated loss ``sg(g) (sg(logp_T) - logp_S)`` + fixed-weight
    verl k3 (no pillars)."""
    valid = mask > 0
    ls = jnp.where(valid, token_logprobs(student_logits, tokens), 0.0)
    lr = jnp.where(valid, token_logprobs(ref_logits, tokens), 0.0)
    g = jax.lax.stop_gradient(jnp.where(valid, jax.nn.sigmoid(5.0 * jnp.where(valid, gap, 0.0)),
                                        0.0))
    teacher = jax.lax.stop_gradient(jnp.where(valid, gap, 0.0) + ls)
    distill_sum = jnp.sum(jnp.where(valid, g * (teacher - ls), 0.0))
    d = jnp.clip(lr - ls, -20.0, 20.0)
    k3_sum = jnp.sum(jnp.where(valid, jnp.where(valid, jnp.clip(jnp.exp(d) - 1.0 - d, -10.0, 10.0),
                                                0.0), 0.0))
    count = jnp.sum(valid.astype(jnp.float32))
    return (0.01 * distill_sum + 0.001 * k3_sum) / jnp.maximum(count, 1.0)


def test_pillars_off_is_bit_exact_baseline():
    rng = np.random.default_rng(11)
    args = _craft_case(rng)
    off = dict(cti=False, controller=False, polarise=False)
    craft = lambda s, *a: _craft_loss(s, *a, None, **off)[0]
    v_craft, g_craft = jax.jit(jax.value_and_grad(craft))(*args)
    v_base, g_base = jax.jit(jax.value_and_grad(_baseline))(*args[:5])
    assert v_craft == v_base
    assert np.array_equal(np.asarray(g_craft), np.asarray(g_base))
    # each switch alone restores its baseline term exactly, whatever the other switches say
    state = signals.controller_update(signals.controller_init(), 0.9)
    ref_off = craft_jit(*args, state, **off)[1]
    for flags in FLAGS:
        metrics = craft_jit(*args, state, **flags)[1]
        if not flags["cti"]:
            assert metrics["distill_sum"] == ref_off["distill_sum"]
        if not flags["polarise"]:
            assert metrics["kl_sum"] == ref_off["kl_sum"]
        if not flags["controller"]:
            assert metrics["lambda"] == ref_off["lambda"] and metrics["mu"] == ref_off["mu"]


def test_craft_grad_finite_vmap_and_padding():
    rng = np.random.default_rng(12)
    state = signals.controller_init()
    grad = jax.jit(jax.grad(lambda s, *a: _craft_loss(s, *a)[0]))
    for scale in (2.0, 1e4):
        student, ref, tokens, gap, mask, adv = _craft_case(rng, scale=scale)
        if scale > 10:
            student, ref, gap = jnp.sign(student) * 1e4, -jnp.sign(ref) * 1e4, gap * 1e4
        g = grad(student, ref, tokens, gap, mask, adv, state)
        assert_finite_tree(g)
        np.testing.assert_array_equal(g[0], 0.0)  # all-masked row
        assert_finite_tree(craft_jit(student, ref, tokens, gap, mask, adv, state))
    cases = [_craft_case(rng) for _ in range(2)]
    stacked = [jnp.stack(x) for x in zip(*cases)]
    batched = jax.jit(jax.vmap(lambda *a: _craft_loss(*a, state)[0]))(*stacked)
    assert_close(batched, [craft_jit(*c, state)[0] for c in cases], 1e-6, 1e-7)
    # padding: extra masked positions and one extra fully masked group change nothing
    student, ref, tokens, gap, mask, adv = cases[0]
    b, t, v = student.shape
    pad_t = lambda x, fill: jnp.concatenate([x, fill(x.shape[:1] + (3,) + x.shape[2:])], axis=1)
    pad_b = lambda x, fill: jnp.concatenate([x, fill((4,) + x.shape[1:])], axis=0)
    rnd = lambda s: random_logits(rng, s)
    ones = lambda s: jnp.ones(s, jnp.int32)
    padded = [pad_b(pad_t(student, rnd), rnd), pad_b(pad_t(ref, rnd), rnd),
              pad_b(pad_t(tokens, ones), ones),
              pad_b(pad_t(gap, rnd), rnd), pad_b(pad_t(mask, jnp.zeros), jnp.zeros),
              pad_b(adv, rnd)]
    from_gap = jitted(signals.counterfactual_credit_from_gap, group_size=4)
    c1, c2 = from_gap(gap, mask, adv), from_gap(*padded[3:])
    assert_close(c2[:b, :t], c1, 1e-6, 1e-7)
    np.testing.assert_array_equal(c2[b:], 0.0)
    np.testing.assert_array_equal(c2[:, t:], 0.0)
    assert_close(craft_jit(*padded, state)[0], craft_jit(*cases[0], state)[0], 1e-6, 1e-8)


def test_bad_input():
    x = jnp.zeros((4, 3, 5))
    tokens, mask, adv = jnp.zeros((4, 3), jnp.int32), jnp.ones((4, 3)), jnp.zeros(4)
    with pytest.raises(ValueError, match="vocab mismatch.*student_logits"):
        signals.counterfactual_credit(x, jnp.zeros((4, 3, 6)), tokens, mask, adv, 2)
    with pytest.raises(ValueError, match="`group_size`=3 does not divide the batch size B=4"):
        signals.counterfactual_credit(x, x, tokens, mask, adv, 3)
    with pytest.raises(ValueError, match=r"`advantages` must have shape \(4,\)"):
        signals.counterfactual_credit(x, x, tokens, mask, jnp.zeros((4, 1)), 2)
    with pytest.raises(ValueError, match="`tokens` holds ids"):
        signals.counterfactual_credit(x, x, tokens + 7, mask, adv, 2)
    with pytest.raises(ValueError, match="`teacher_logits` must have rank 3"):
        signals.counterfactual_credit(x[0], x[0], tokens, mask, adv, 2)
    with pytest.raises(ValueError, match="`gap` must have rank 2"):
        signals.counterfactual_credit_from_gap(jnp.zeros(4), jnp.ones(4), adv, 2)
    with pytest.raises(ValueError, match="neg_mode"):
        signals.polarised_kl(mask, mask, mask, mask, neg_mode="flip")
    with pytest.raises(ValueError, match="`state`"):
        signals.craft_loss_terms(mask, mask, mask, mask, adv, 2, None)


def test_baseline_gradient_is_the_sdar_gate_not_gate_times_gap():
    """SDAR's ``sg(g) (sg(logp_T) - logp_S)``: value ``g D``, gradient ``-g`` w.r.t. ``logp_S``
    (no extra factor ``D``)."""
    rng = np.random.default_rng(12)
    ls = jnp.asarray(np.log(rng.uniform(0.05, 1, (4, 5))), jnp.float32)
    gap = jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)
    mask = random_mask(rng, 4, 5)
    off = dict(cti=False, controller=False, polarise=False)
    distill = lambda x: signals.craft_loss_terms(x, x, gap, mask, jnp.zeros(4), 4, **off)[2][
        "distill_sum"]
    g = sigmoid(5.0 * f64(gap)) * f64(mask)
    assert_close(distill(ls), (g * f64(gap)).sum())
    assert_close(jax.grad(distill)(ls), -g)


def test_forward_kl_clip_is_its_own_keyword():
    ls = jnp.log(jnp.asarray([[0.001, 0.3]]))
    lr = jnp.log(jnp.asarray([[0.9, 0.5]]))  # r = 900: r log r - (r - 1) = 5223
    c = jnp.asarray([[-1.0, -1.0]])
    mask = jnp.ones((1, 2))
    loose = signals.polarised_kl(ls, lr, c, mask, kl_clip=10.0, forward_kl_clip=None)
    tight = signals.polarised_kl(ls, lr, c, mask, kl_clip=None, forward_kl_clip=10.0)
    r = 900.0
    assert_close(loose[0, 0], r * np.log(r) - (r - 1), 1e-5, 0)
    assert float(tight[0, 0]) == 10.0
    assert_close(loose[0, 1], tight[0, 1])
