"""DemoPSD geometric target, disagreement alpha and KL(S || q) (spec §6) against NumPy references."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hindsight.signals as signals
from hindsight.ops import generalized_jsd_from_logprobs
from ._reference import (assert_close, assert_digits, assert_finite_tree, bf16_round, f64, jitted,
                         jsd, kl, log_softmax, random_logits, random_mask, sigmoid)

PT, PS = [0.6, 0.3, 0.1], [0.2, 0.5, 0.3]
SPEC_CASES = [(15.0, 0.089059, [0.5619, 0.3242, 0.1139], 0.300548),
              (25.0, 0.122112, [0.5475, 0.3332, 0.1193], 0.278117),
              (100.0, 0.149967, [0.5353, 0.3407, 0.1240], 0.259892)]


def ref_target(lt, ls, alpha_max=0.15, beta=25.0, floor=-50.0):
    lt, ls = f64(lt), f64(ls)
    d = jsd(lt, ls, 0.5)
    alpha = alpha_max * (2 * sigmoid(beta * d) - 1)
    a = alpha[..., None]
    return log_softmax((1 - a) * np.maximum(lt, floor) + a * np.maximum(ls, floor)), alpha


def test_spec_numbers():
    lt, ls = jnp.log(jnp.array(PT)), jnp.log(jnp.array(PS))
    assert_digits(generalized_jsd_from_logprobs(ls, lt, 0.5), 0.091121, 6)  # d, via hindsight.ops
    for beta, alpha, q, loss in SPEC_CASES:
        lq, a = signals.barycenter_target_from_logprobs(lt, ls, beta=beta)
        assert_digits(a, alpha, 6)
        assert_digits(jnp.exp(lq), q, 4)
        assert_digits(signals.barycenter_kl_from_logprobs(ls, lt, beta=beta), loss, 6)
        lq2, a2 = signals.barycenter_target(lt[None, None], ls[None, None], beta=beta)
        assert_close(lq2[0, 0], lq, 1e-6, 1e-7)
        total, count = signals.barycenter_loss(lt[None, None], ls[None, None], jnp.ones((1, 1)),
                                               beta=beta)
        assert_digits(total / count, loss, 6)
    near_t, near_s = jnp.log(jnp.array([0.5, 0.3, 0.2])), jnp.log(jnp.array([0.45, 0.35, 0.2]))
    _, a = signals.barycenter_target_from_logprobs(near_t, near_s)
    assert_digits(a, 0.0030384, 7)
    assert_digits(signals.disagreement_alpha(jnp.float32(0.0016207)), 0.0030384, 7)
    # KL(S || T) at alpha = 0 (pure teacher target)
    assert_digits(signals.barycenter_kl_from_logprobs(ls, lt, alpha_max=0.0), 0.365274, 6)


def test_barycenter_optimality():
    lt, ls = jnp.log(jnp.array(PT)), jnp.log(jnp.array(PS))
    a = 0.15
    lq = f64(signals.geometric_target_from_logprobs(lt, ls, a))
    objective = lambda x: (1 - a) * kl(x, f64(lt)) + a * kl(x, f64(ls))
    assert_digits(objective(lq), 0.0506118, 7)
    rng = np.random.default_rng(0)
    for _ in range(200):
        assert objective(log_softmax(lq + 0.05 * rng.standard_normal(3))) > objective(lq)


def test_agreement_gives_teacher():
    rng = np.random.default_rng(1)
    x = random_logits(rng, (2, 3, 5))
    lq, alpha = signals.barycenter_target(x, x)
    np.testing.assert_allclose(alpha, 0.0, atol=1e-6)
    assert_close(lq, log_softmax(f64(x)))
    total, _ = signals.barycenter_loss(x, x, jnp.ones((2, 3)))
    assert abs(float(total)) < 1e-5


@pytest.mark.parametrize("shape,options", [((2, 3, 5), {}), ((1, 6, 9), {"beta": 15.0}),
                                           ((3, 4, 4), {"alpha_max": 0.4, "beta": 100.0,
                                                        "floor": -2.0})])
def test_matches_reference(shape, options):
    rng = np.random.default_rng(shape[-1])
    t, s = random_logits(rng, shape, 1.0), random_logits(rng, shape, 1.0)
    lt, ls = log_softmax(t), log_softmax(s)
    lq, alpha = jitted(signals.barycenter_target, **options)(t, s)
    assert lq.dtype == jnp.float32 and lq.shape == shape and alpha.shape == shape[:2]
    want_q, want_a = ref_target(lt, ls, **options)
    assert_close(alpha, want_a)
    assert_close(lq, want_q)
    mask = random_mask(rng, *shape[:2])
    total, count = jitted(signals.barycenter_loss, **options)(t, s, mask)
    m = f64(mask)
    assert float(count) == m.sum()
    assert_close(total, (kl(ls, want_q) * m).sum())


def test_vocab_mask():
    rng = np.random.default_rng(2)
    vm = jnp.array([1, 0, 1, 1, 0, 1], bool)
    t, s = random_logits(rng, (2, 3, 6)), random_logits(rng, (2, 3, 6))
    lq, alpha = signals.barycenter_target(t, s, vocab_mask=vm)
    keep = np.asarray(vm)
    want_q, want_a = ref_target(log_softmax(f64(t)[..., keep]), log_softmax(f64(s)[..., keep]))
    assert_close(np.asarray(lq)[..., keep], want_q)
    assert_close(alpha, want_a)
    assert np.all(np.asarray(lq)[..., ~keep] < -1e8)
    total, _ = signals.barycenter_loss(t, s, jnp.ones((2, 3)), vocab_mask=vm)
    assert_close(total, kl(log_softmax(f64(s)[..., keep]), want_q).sum())


def test_jit_vmap_grad_bf16_padding():
    rng = np.random.default_rng(3)
    shape = (3, 5, 6)
    loss = jitted(signals.barycenter_loss)
    grad = jax.jit(jax.grad(lambda s, t, m: (lambda p: p[0] / jnp.maximum(p[1], 1.0))(
        signals.barycenter_loss(t, s, m))))
    target_grad = jax.jit(jax.grad(lambda x, t: jnp.sum(signals.barycenter_target(t, x)[0])
                                   + jnp.sum(signals.barycenter_target(t, x)[1])))
    mask = random_mask(rng, *shape[:2])
    for scale in (2.0, 1e4):
        t, s = random_logits(rng, shape, scale), random_logits(rng, shape, scale)
        if scale > 10:
            t, s = jnp.sign(t) * 1e4, jnp.sign(s) * 1e4
        g = grad(s, t, mask)
        assert_finite_tree((g, loss(t, s, mask), jitted(signals.barycenter_target)(t, s)))
        np.testing.assert_array_equal(g[0], 0.0)  # all-masked row
        assert scale > 10 or np.any(np.asarray(g[1]))  # one-token row (saturated at 1e4)
        assert not np.any(np.asarray(target_grad(s, t)))  # target and alpha are stop-gradient'ed
    # one-hot teacher: the floor keeps the geometric target finite
    onehot = jnp.where(jax.nn.one_hot(jnp.zeros(shape[:2], jnp.int32), 6) > 0, 0.0, -jnp.inf)
    assert_finite_tree(jitted(signals.barycenter_target_from_logprobs)(onehot,
                                                                       jax.nn.log_softmax(s)))
    stack = [(random_logits(rng, shape), random_logits(rng, shape)) for _ in range(2)]
    args = [jnp.stack(x) for x in zip(*stack)]
    lq, alpha = jax.jit(jax.vmap(signals.barycenter_target))(*args)
    for i, c in enumerate(stack):
        want = jitted(signals.barycenter_target)(*c)
        assert_close(lq[i], want[0], 1e-6, 1e-6)
        assert_close(alpha[i], want[1], 1e-6, 1e-7)
    t, s = stack[0]
    bf = jitted(signals.barycenter_target)(t.astype(jnp.bfloat16), s.astype(jnp.bfloat16))
    assert bf[0].dtype == jnp.float32
    want = jitted(signals.barycenter_target)(bf16_round(t), bf16_round(s))
    assert_close(bf[0], want[0], 1e-6, 1e-5)
    cat = lambda x: jnp.concatenate([x, random_logits(rng, (3, 4, 6))], axis=1)
    mask2 = jnp.concatenate([mask, jnp.zeros((3, 4), bool)], axis=1)
    assert_close(np.stack(loss(cat(t), cat(s), mask2)), np.stack(loss(t, s, mask)), 1e-6, 1e-7)
    lq2, a2 = jitted(signals.barycenter_target)(cat(t), cat(s))
    assert_close(lq2[:, :5], jitted(signals.barycenter_target)(t, s)[0], 1e-6, 1e-7)


def test_bad_input():
    x = jnp.zeros((2, 3, 5))
    with pytest.raises(ValueError, match="vocab mismatch.*student_logits"):
        signals.barycenter_target(x, jnp.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="shape mismatch"):
        signals.barycenter_target(x, jnp.zeros((2, 4, 5)))
    with pytest.raises(ValueError, match="`mask` has shape"):
        signals.barycenter_loss(x, x, jnp.ones((3, 3)))
    with pytest.raises(ValueError, match="`student_logits` must have rank 3"):
        signals.barycenter_loss(x[0], x[0], jnp.ones((3,)))
