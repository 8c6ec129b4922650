"""OPSD-PMI purified target and JSD loss (spec §5) against float64 NumPy references."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hindsight.signals as signals
from ._reference import (assert_close, assert_digits, assert_finite_tree, bf16_round, f64, jitted,
                         jsd, log_softmax, random_logits, random_mask)

SPEC_T, SPEC_R = [2.0, 1, 0, -1], [0.0, 2, 0, -1]
SPEC_P0, SPEC_S = [1.0, 1, 0.5, 0], [1.5, 1, 0.2, 0]
# (c, beta) -> rcl (None when not printed), q, J
SPEC_CASES = [(10.0, 1.0, [1.7324, -1.2435, -0.2499, -0.2499], [0.8437, 0.0430, 0.0705, 0.0428],
               0.088330),
              (1.0, 1.0, [0.9414, -0.8483, -0.2449, -0.2449], [0.6828, 0.1140, 0.1265, 0.0767],
               0.030055),
              (10.0, 0.5, None, [0.6299, 0.1423, 0.1418, 0.0860], 0.018726)]


def ref_target(lt, lr, l0, beta=1.0, clip=10.0, floor=-50.0, vocab_mask=None):
    lt, lr, l0 = f64(lt), f64(lr), f64(l0)
    vm = np.ones(lt.shape[-1], bool) if vocab_mask is None else np.asarray(vocab_mask)
    out = np.full(lt.shape, -np.inf)
    for pos in np.ndindex(lt.shape[:-1]):
        r = np.maximum(lt[pos][vm], floor) - np.maximum(lr[pos][vm], floor)
        rcl = clip * np.tanh((r - r.mean()) / clip)
        out[pos][vm] = log_softmax(l0[pos][vm] + beta * rcl)
    return out


def test_spec_numbers():
    lt, lr, l0, ls = (jax.nn.log_softmax(jnp.array(x)) for x in (SPEC_T, SPEC_R, SPEC_P0, SPEC_S))
    assert_digits(jnp.exp(lt), [0.6439, 0.2369, 0.0871, 0.0321], 4)
    assert_digits(jnp.exp(lr), [0.1025, 0.7573, 0.1025, 0.0377], 4)
    r = lt - lr
    assert_digits(r, [1.8378, -1.1622, -0.1622, -0.1622], 4)
    assert_digits(r - r.mean(), [1.75, -1.25, -0.25, -0.25], 4)
    for clip, beta, rcl, q, j in SPEC_CASES:
        lq = signals.pmi_target(jnp.array(SPEC_T), jnp.array(SPEC_R), jnp.array(SPEC_P0), beta=beta,
                                clip=clip)
        assert_digits(jnp.exp(lq), q, 4)
        if rcl is not None:  # log q - l0 = beta * rcl + const
            shift = (lq - l0) / beta
            assert_digits(shift - shift.mean() + jnp.mean(jnp.array(rcl)), rcl, 4)
        assert_digits(signals.pmi_jsd_from_logprobs(ls, lt, lr, l0, beta=beta, clip=clip), j, 6)
        total, count = signals.pmi_loss(*(jnp.array(x)[None, None] for x in
                                          (SPEC_T, SPEC_R, SPEC_P0, SPEC_S)), jnp.ones((1, 1)),
                                        beta=beta, clip=clip)
        assert_digits(total / count, j, 6)


def test_edge_cases():
    rng = np.random.default_rng(0)
    t, l0 = random_logits(rng, (3, 6)), random_logits(rng, (3, 6))
    base = jax.nn.log_softmax(l0)
    assert_close(signals.pmi_target(t, t, l0), base)  # identical teacher and probe -> P0
    assert_close(signals.pmi_target(t, random_logits(rng, (3, 6)), l0, beta=0.0), base)


@pytest.mark.parametrize("shape,options", [((2, 3, 5), {}), ((1, 7, 9), {"beta": 2.0, "clip": 1.0}),
                                           ((3, 4, 6), {"beta": 0.5, "floor": -3.0})])
def test_matches_reference(shape, options):
    rng = np.random.default_rng(shape[-1])
    t, r, b, s = (random_logits(rng, shape, 3.0) for _ in range(4))
    lt, lr, l0, ls = (log_softmax(x) for x in (t, r, b, s))
    out = jitted(signals.pmi_target, **options)(t, r, b)
    assert out.dtype == jnp.float32 and out.shape == shape
    want = ref_target(lt, lr, l0, **options)
    assert_close(out, want)
    mask = random_mask(rng, *shape[:2])
    total, count = jitted(signals.pmi_loss, **options)(t, r, b, s, mask)
    m = f64(mask)
    assert float(count) == m.sum()
    assert_close(total, (jsd(want, ls, 0.5) * m).sum())
    total_b, _ = jitted(signals.pmi_loss, beta_jsd=0.2, **options)(t, r, b, s, mask)
    assert_close(total_b, (jsd(want, ls, 0.2) * m).sum())


def test_vocab_mask_and_temperature():
    rng = np.random.default_rng(1)
    shape = (2, 3, 7)
    vm = jnp.array([1, 1, 0, 1, 1, 1, 0], bool)
    t, r, b = (random_logits(rng, shape) for _ in range(3))
    out = signals.pmi_target(t, r, b, vocab_mask=vm)
    keep = np.asarray(vm)
    want = ref_target(log_softmax(f64(t)[..., keep]), log_softmax(f64(r)[..., keep]),
                      log_softmax(f64(b)[..., keep]))
    assert_close(np.asarray(out)[..., keep], want)
    assert np.all(np.asarray(out)[..., ~keep] < -1e8)
    hot = signals.pmi_target(t, r, b, temperature=2.0)
    assert_close(hot, ref_target(log_softmax(f64(t) / 2), log_softmax(f64(r) / 2),
                                 log_softmax(f64(b) / 2)))


def test_jit_vmap_grad_bf16_padding():
    rng = np.random.default_rng(2)
    shape = (3, 5, 6)
    loss = jitted(signals.pmi_loss)
    mean = lambda s, t, r, b, m: (lambda p: p[0] / jnp.maximum(p[1], 1.0))(
        signals.pmi_loss(t, r, b, s, m))
    grad = jax.jit(jax.grad(mean))
    target_grad = jax.jit(jax.grad(lambda *a: jnp.sum(signals.pmi_target(*a))))
    mask = random_mask(rng, *shape[:2])
    for scale in (2.0, 1e4):
        t, r, b, s = (random_logits(rng, shape, scale) for _ in range(4))
        if scale > 10:
            t, r, b, s = (jnp.sign(x) * 1e4 for x in (t, r, b, s))
        g = grad(s, t, r, b, mask)
        assert_finite_tree((g, loss(t, r, b, s, mask), jitted(signals.pmi_target)(t, r, b)))
        np.testing.assert_array_equal(g[0], 0.0)  # all-masked row
        assert scale > 10 or np.any(np.asarray(g[1]))  # one-token row (saturated at 1e4)
        assert not np.any(np.asarray(target_grad(t, r, b)))  # the target is stop-gradient'ed
    stack = [tuple(random_logits(rng, shape) for _ in range(4)) for _ in range(2)]
    args = [jnp.stack(x) for x in zip(*stack)]
    batched = jax.jit(jax.vmap(signals.pmi_target))(*args[:3])
    assert_close(batched, [jitted(signals.pmi_target)(*c[:3]) for c in stack], 1e-6, 1e-6)
    t, r, b, s = stack[0]
    bf = jitted(signals.pmi_target)(*(x.astype(jnp.bfloat16) for x in (t, r, b)))
    assert bf.dtype == jnp.float32
    assert_close(bf, jitted(signals.pmi_target)(*(bf16_round(x) for x in (t, r, b))), 1e-6, 1e-5)
    cat = lambda x: jnp.concatenate([x, random_logits(rng, (3, 4, 6))], axis=1)
    mask2 = jnp.concatenate([mask, jnp.zeros((3, 4), bool)], axis=1)
    assert_close(np.stack(loss(cat(t), cat(r), cat(b), cat(s), mask2)),
                 np.stack(loss(t, r, b, s, mask)), 1e-6, 1e-7)


def test_bad_input():
    x = jnp.zeros((2, 3, 5))
    with pytest.raises(ValueError, match="vocab mismatch.*probe_logits"):
        signals.pmi_target(x, jnp.zeros((2, 3, 4)), x)
    with pytest.raises(ValueError, match="vocab mismatch.*base_logits"):
        signals.pmi_target(x, x, jnp.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="`mask` has shape"):
        signals.pmi_loss(x, x, x, x, jnp.ones((2, 4)))
    with pytest.raises(ValueError, match="`student_logits` must have rank 3"):
        signals.pmi_loss(x, x, x, x[0], jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="`vocab_mask` must have shape"):
        signals.pmi_target(x, x, x, vocab_mask=jnp.ones(4, bool))
