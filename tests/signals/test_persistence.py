"""PCSD persistence-consistency gate and loss (spec §3) against float64 NumPy references."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hindsight.signals as signals
from ._reference import (assert_close, assert_digits, assert_finite_tree, bf16_round, gather,
                         jitted, kl, log_softmax, random_logits, random_mask, sigmoid)

SPEC_D = [1.0, 0.8, 0.9, 1.1, -0.5, -1.0, 0.2, 0.3, 0.0, 0.0]
SPEC_M = [1.0] * 8 + [0.0, 0.0]
SPEC_P = [0.5, 0.4, 0.6, 0.7, 0.2, 0.1, 0.3, 0.5, 1.0, 1.0]
# spec table rows: i -> (m_Nmax, v, omega, m, slope, z, w); every printed to 4 decimals
SPEC_ROWS = {0: (0.5676, 0.4250, 0.8334, 0.9280, -0.1810, 0.2946, 0.8135),
             3: (0.0849, 0.6197, 1.0, 1.1000, -0.0900, 0.7850, 0.9806),
             4: (-0.3450, 0.2610, 0.4688, -0.4177, 0.3600, -0.4177, 0.1102),
             6: (0.2444, 0.0025, 0.0, 0.2444, 0.1000, 0.2444, 0.7725),
             7: (0.3000, 0.0, 0.0, 0.3000, 0.0, 0.3000, 0.8176)}


def ref_stats(gap, mask, n_max=8, n_min=1, alpha=0.8, tau_low=0.05, tau_high=0.5, beta_gate=5.0,
              gamma=None, direction="shrink"):
    """Loop reference of spec §3 steps 1-6; returns [7, B, T] (m_long, v, omega, m, slope, z, w)."""
    gamma = (n_max - 1) / 2 if gamma is None else gamma
    gap, mask = np.asarray(gap, np.float64), np.asarray(mask, np.float64) > 0
    out = np.zeros((7,) + gap.shape)
    for row in np.ndindex(gap.shape[:-1]):
        d, m = np.where(mask[row], gap[row], 0.0), mask[row]
        length = len(d)
        for i in range(length):
            if not m[i]:
                continue

            def window(n):
                idx = [i + j for j in range(n) if i + j < length and m[i + j]]
                return np.array(idx), np.array([alpha ** (k - i) for k in idx])

            idx, w = window(n_max)
            m_long = (w * d[idx]).sum() / w.sum()
            v = (w * (d[idx] - m_long) ** 2).sum() / w.sum()
            idx1, w1 = window(n_min)
            m_short = (w1 * d[idx1]).sum() / w1.sum()
            om = min(max((v - tau_low) / (tau_high - tau_low), 0.0), 1.0)
            if direction == "shrink":
                mm = (1 - om) * m_long + om * m_short
            else:
                mm = (1 - om) * m_short + om * m_long
            x = idx - i
            if len(x) < 2:
                b = 0.0
            else:
                b = ((x - x.mean()) * (d[idx] - d[idx].mean())).sum() / ((x - x.mean()) ** 2).sum()
            z = mm - gamma * max(0.0, -b)
            out[(slice(None),) + row + (i,)] = [m_long, v, om, mm, b, z, sigmoid(beta_gate * z)]
    return out


def test_spec_table_and_loss():
    st = signals.persistence_stats_from_gap(jnp.array([SPEC_D]), jnp.array([SPEC_M]))
    for i, row in SPEC_ROWS.items():
        assert_digits([float(x[0, i]) for x in st], row, 4)
    # SDAR column: the last valid token reduces to sigmoid(5 D)
    assert_digits(st.gate[0, 7], sigmoid(5 * 0.3), 6)
    np.testing.assert_array_equal(
        signals.persistence_gate_from_gap(jnp.array([SPEC_D]), jnp.array([SPEC_M])), st.gate)
    np.testing.assert_array_equal(st.gate[0, 8:], 0.0)
    total, count = signals.pcsd_loss(st.gate, jnp.log(jnp.array([SPEC_P])), jnp.array([SPEC_M]))
    assert float(count) == 8.0
    assert_digits(total / count, 0.45895, 5)
    assert_digits(0.01 * total / count, 0.0045895, 7)


def test_teacher_equals_student_gives_half():
    rng = np.random.default_rng(0)
    logits = random_logits(rng, (2, 6, 5))
    tokens = jnp.asarray(rng.integers(0, 5, (2, 6)), jnp.int32)
    mask = jnp.ones((2, 6))
    np.testing.assert_allclose(jitted(signals.persistence_gate)(logits, logits, tokens, mask), 0.5)


OPTIONS = [{}, {"n_max": 4, "alpha": 0.5, "variance_direction": "grow"},
           {"n_max": 3, "n_min": 2, "tau_low": 0.1, "tau_high": 2.0, "beta_gate": 2.0,
            "gamma": 0.3}]


@pytest.mark.parametrize("shape,options", [((1, 3), OPTIONS[0]), ((3, 10), OPTIONS[0]),
                                           ((2, 17), OPTIONS[1]), ((3, 10), OPTIONS[2])])
def test_gate_from_gap_matches_reference(shape, options):
    rng = np.random.default_rng(shape[1])
    for right_padded in (True, False):
        gap = jnp.asarray(rng.normal(size=shape) * 0.8, jnp.float32)
        mask = random_mask(rng, *shape, right_padded=right_padded)
        st = jitted(signals.persistence_stats_from_gap, **options)(gap, mask)
        ref = ref_stats(gap, mask, **{("direction" if k == "variance_direction" else k): v
                                      for k, v in options.items()})
        for got, want in zip(st, ref):
            assert got.dtype == jnp.float32 and got.shape == shape
            assert_close(got, want, atol=2e-6)


@pytest.mark.parametrize("loss", ["nll", "rkl", "rkl_sampled"])
def test_gate_and_loss_from_logits(loss):
    rng = np.random.default_rng(3)
    b, t, v = 3, 11, 6
    teacher, student = random_logits(rng, (b, t, v)), random_logits(rng, (b, t, v))
    tokens = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
    mask = random_mask(rng, b, t)
    lt, ls = log_softmax(teacher), log_softmax(student)
    tok = np.asarray(tokens)
    gap = gather(lt, tok) - gather(ls, tok)
    w = ref_stats(gap, mask)[-1]
    assert_close(jitted(signals.persistence_gate)(teacher, student, tokens, mask), w, atol=2e-6)
    per = {"nll": -gather(ls, tok), "rkl": kl(ls, lt),
           "rkl_sampled": (gather(ls, tok) - gather(lt, tok)) * gather(ls, tok)}[loss]
    m = np.asarray(mask, np.float64)
    total, count = jitted(signals.persistence_loss, loss=loss)(teacher, student, tokens, mask)
    assert float(count) == m.sum()
    assert_close(total, (w * per * m).sum())


def _grad_case(rng, b, t, v, scale):
    teacher, student = random_logits(rng, (b, t, v), scale), random_logits(rng, (b, t, v), scale)
    tokens = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
    return teacher, student, tokens, random_mask(rng, b, t)


@pytest.mark.parametrize("loss", ["nll", "rkl", "rkl_sampled"])
def test_grad_finite(loss):
    rng = np.random.default_rng(4)
    b, t, v = 4, 9, 5

    def mean(student, teacher, tokens, mask):
        total, count = signals.persistence_loss(teacher, student, tokens, mask, loss=loss)
        return total / jnp.maximum(count, 1.0)

    value_and_grad = jax.jit(jax.value_and_grad(mean))
    for scale in (2.0, 1e4):
        teacher, student, tokens, mask = _grad_case(rng, b, t, v, scale)
        if scale > 10:
            teacher, student = jnp.sign(teacher) * 1e4, jnp.sign(student) * 1e4
        value, grad = value_and_grad(student, teacher, tokens, mask)
        assert_finite_tree((value, grad))
        np.testing.assert_array_equal(grad[0], 0.0)  # the all-masked row gets no gradient
        assert scale > 10 or np.any(np.asarray(grad[1]))  # the one-token row does
        gate = jitted(signals.persistence_gate)(teacher, student, tokens, mask)
        assert_finite_tree(gate)
        assert np.all((np.asarray(gate) >= 0) & (np.asarray(gate) <= 1))


def test_vmap():
    rng = np.random.default_rng(5)
    stacked = [_grad_case(rng, 4, 9, 5, 2.0) for _ in range(2)]
    args = [jnp.stack(x) for x in zip(*stacked)]
    gates = jax.jit(jax.vmap(signals.persistence_gate))(*args)
    one = jitted(signals.persistence_gate)
    assert_close(gates, np.stack([one(*c) for c in stacked]), 1e-6, 1e-7)
    fn = jitted(signals.persistence_loss, loss="rkl")
    losses = jax.jit(jax.vmap(fn))(*args)
    assert_close(np.stack(losses, -1), np.stack([np.stack(fn(*c)) for c in stacked]), 1e-6, 1e-6)


def test_bf16_and_padding_invariance():
    rng = np.random.default_rng(6)
    b, t, v, pad = 3, 10, 7, 6
    teacher, student, tokens, mask = _grad_case(rng, b, t, v, 2.0)
    gate_fn = jitted(signals.persistence_gate)
    gate = gate_fn(teacher, student, tokens, mask)
    bf = gate_fn(teacher.astype(jnp.bfloat16), student.astype(jnp.bfloat16), tokens, mask)
    assert bf.dtype == jnp.float32
    assert_close(bf, gate_fn(bf16_round(teacher), bf16_round(student), tokens, mask), 1e-6, 1e-6)
    assert_close(bf, gate, 0, 0.1)
    cat = lambda x, y: jnp.concatenate([x, y], axis=1)
    t2 = cat(teacher, random_logits(rng, (b, pad, v)))
    s2 = cat(student, random_logits(rng, (b, pad, v)))
    tok2 = cat(tokens, jnp.asarray(rng.integers(0, v, (b, pad)), jnp.int32))
    mask2 = cat(mask, jnp.zeros((b, pad), bool))
    gate2 = gate_fn(t2, s2, tok2, mask2)
    assert_close(gate2[:, :t], gate, 1e-6, 1e-7)
    np.testing.assert_array_equal(gate2[:, t:], 0.0)
    loss_fn = jitted(signals.persistence_loss, loss="rkl")
    one, two = loss_fn(teacher, student, tokens, mask), loss_fn(t2, s2, tok2, mask2)
    assert_close(np.stack(two), np.stack(one), 1e-6, 1e-7)


def test_bad_input():
    x = jnp.zeros((2, 3, 5))
    tokens, mask = jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 3))
    with pytest.raises(ValueError, match="vocab mismatch.*student_logits"):
        signals.persistence_gate(x, jnp.zeros((2, 3, 4)), tokens, mask)
    with pytest.raises(ValueError, match="`teacher_logits` must have rank 3"):
        signals.persistence_gate(x[0], x[0], tokens, mask)
    with pytest.raises(ValueError, match="`tokens` holds ids"):
        signals.persistence_gate(x, x, tokens - 1, mask)
    with pytest.raises(ValueError, match="`mask` has shape"):
        signals.persistence_gate_from_gap(jnp.zeros((2, 3)), jnp.ones((2, 4)))
    with pytest.raises(ValueError, match="n_min"):
        signals.persistence_gate_from_gap(jnp.zeros((2, 3)), mask, n_min=9)
    with pytest.raises(ValueError, match="variance_direction"):
        signals.persistence_gate_from_gap(jnp.zeros((2, 3)), mask, variance_direction="up")
    with pytest.raises(ValueError, match="teacher_logp"):
        signals.pcsd_loss(jnp.zeros((2, 3)), jnp.zeros((2, 3)), mask, loss="rkl_sampled")
