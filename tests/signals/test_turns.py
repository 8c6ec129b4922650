"""Turn segment reductions against float64 NumPy loops, the spec's TurnOPD token-mass numbers, and
no NaN from masked positions or empty turns (values and gradients)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.signals import to_tokens, trajectory_minmax, turn_mean, turn_sums, turn_valid


def _layout(rng, b=3, t=20, k=4):
    turn_id = np.full((b, t), -1, np.int32)
    for r in range(b):
        at, turn = 0, 0
        while at < t and turn < k - (r == 2):  # row 2 leaves its last turn empty
            n = int(rng.integers(1, 5))
            turn_id[r, at:at + n] = turn
            at += n + int(rng.integers(0, 3))  # an observation between turns
            turn += 1
    return turn_id


def test_against_float64_loops():
    rng = np.random.default_rng(0)
    turn_id = _layout(rng)
    x = rng.normal(size=turn_id.shape)
    x[turn_id < 0] = np.nan  # observations: never read
    sums, counts = turn_sums(jnp.asarray(x, jnp.float32), jnp.asarray(turn_id), num_turns=4)
    mean = turn_mean(jnp.asarray(x, jnp.float32), jnp.asarray(turn_id), num_turns=4)
    for b in range(3):
        for k in range(4):
            sel = turn_id[b] == k
            assert counts[b, k] == sel.sum()
            np.testing.assert_allclose(sums[b, k], x[b, sel].sum() if sel.any() else 0.0, atol=1e-5)
            np.testing.assert_allclose(mean[b, k], x[b, sel].mean() if sel.any() else 0.0, atol=1e-5)
    assert not bool(turn_valid(jnp.asarray(turn_id), num_turns=4)[2, 3])
    per_turn = rng.normal(size=(3, 4))
    tok = np.asarray(to_tokens(jnp.asarray(per_turn, jnp.float32), jnp.asarray(turn_id)))
    want = np.where(turn_id >= 0, per_turn[np.arange(3)[:, None], np.clip(turn_id, 0, 3)], 0.0)
    np.testing.assert_allclose(tok, want, atol=1e-6)


def test_turnopd_token_mass_reproduces_the_spec():
    """§9 controller B at alpha = 0: q_t = n_t / sum n, L = sum q_t K̄_t = 0.31 for n = [6, 3, 1],
    K̄ = [0.4, 0.2, 0.1]; at alpha = 1 (q = 1/3 each) 0.23333."""
    turn_id = jnp.asarray([[0] * 6 + [-1] + [1] * 3 + [-1, -1] + [2]])
    kl = jnp.where(turn_id == 0, 0.4, jnp.where(turn_id == 1, 0.2, jnp.where(turn_id == 2, 0.1, jnp.nan)))
    _, n = turn_sums(kl, turn_id, num_turns=3)
    k_bar = turn_mean(kl, turn_id, num_turns=3)
    q = n / n.sum(-1, keepdims=True)
    np.testing.assert_allclose(float((q * k_bar).sum()), 0.31, atol=1e-6)
    np.testing.assert_allclose(float(k_bar.mean()), 0.233333, atol=1e-6)


def test_trajectory_minmax():
    v = jnp.asarray([[1.0, 3.0, 2.0, 9.0], [5.0, 5.0, 0.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    valid = jnp.asarray([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]], bool)
    out = np.asarray(trajectory_minmax(v, valid))
    np.testing.assert_allclose(out[0], [0.0, 2 / (2 + 1e-6), 1 / (2 + 1e-6), 0.0], atol=1e-6)
    assert (out[1:] == 0).all()  # equal values, a single valid turn: no spread, 0
    none = trajectory_minmax(v, jnp.zeros_like(valid))
    assert (np.asarray(none) == 0).all()


def test_gradients_stay_finite_with_nan_outside_turns_and_empty_turns():
    turn_id = jnp.asarray([[0, 0, -1, -1, 2, 2], [-1, -1, -1, -1, -1, -1]])
    x = jnp.asarray([[1.0, 2.0, jnp.nan, jnp.inf, 3.0, 5.0], [jnp.nan] * 6])

    def f(x):
        m = turn_mean(x, turn_id, num_turns=3)
        return (trajectory_minmax(m, turn_valid(turn_id, num_turns=3)) + m).sum() \
            + to_tokens(m, turn_id).sum()

    value, grad = jax.value_and_grad(f)(x)
    assert np.isfinite(float(value)) and np.isfinite(np.asarray(grad)).all()
    assert (np.asarray(grad)[turn_id < 0] == 0).all()
    with pytest.raises(ValueError, match="num_turns"):
        turn_mean(x, turn_id, num_turns=0)
