"""Dense vocabulary ops vs independent float64 NumPy references and the spec's numbers."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hindsight.ops as ops

SHAPES = [(7,), (3, 11), (2, 4, 23)]


def np_lsm(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def np_kl(lp, lq):
    return (np.exp(lp) * (lp - lq)).sum(-1)


def np_gjsd(ls, lt, beta):
    if beta == 0:
        return np_kl(lt, ls)
    if beta == 1:
        return np_kl(ls, lt)
    lm = np.logaddexp(lt + np.log(beta), ls + np.log(1 - beta))
    return beta * np_kl(lt, lm) + (1 - beta) * np_kl(ls, lm)


@pytest.mark.parametrize("shape", SHAPES)
def test_logprobs_entropy_match_numpy(rng, shape):
    x = rng.normal(size=shape) * 3
    tok = rng.integers(0, shape[-1], size=shape[:-1])
    ref = np_lsm(x)
    chex.assert_trees_all_close(np.asarray(ops.log_softmax(jnp.asarray(x, jnp.float32))), ref, rtol=1e-5, atol=1e-6)
    got = ops.token_logprobs(jnp.asarray(x, jnp.float32), jnp.asarray(tok))
    chex.assert_trees_all_close(np.asarray(got), np.take_along_axis(ref, tok[..., None], -1)[..., 0],
                                rtol=1e-5, atol=1e-6)
    ent = -(np.exp(ref) * ref).sum(-1)
    chex.assert_trees_all_close(np.asarray(ops.entropy(jnp.asarray(x, jnp.float32))), ent, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_kl_and_jsd_match_numpy(rng, shape, beta):
    s, t = rng.normal(size=shape) * 2, rng.normal(size=shape) * 2
    js, jt = jnp.asarray(s, jnp.float32), jnp.asarray(t, jnp.float32)
    chex.assert_trees_all_close(np.asarray(ops.kl(js, jt)), np_kl(np_lsm(s), np_lsm(t)), rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(np.asarray(ops.generalized_jsd(js, jt, beta)),
                                np_gjsd(np_lsm(s), np_lsm(t), beta), rtol=1e-5, atol=1e-6)


def test_spec_numbers():
    """core-signals.md §1 tests 5 and 6."""
    S, T = jnp.log(jnp.array([0.7, 0.2, 0.1])), jnp.log(jnp.array([0.5, 0.45, 0.05]))
    assert round(float(ops.generalized_jsd(S, T, 0.0)), 6) == 0.162025   # KL(T||S)
    assert round(float(ops.generalized_jsd(S, T, 1.0)), 6) == 0.142659   # KL(S||T)
    assert round(float(ops.generalized_jsd(S, T, 0.5)), 6) == 0.037289
    assert round(float(ops.kl(T, S)), 6) == 0.162025
    tail = np.exp(np.asarray(ops.topk_tail_logprobs(jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05])), jnp.array([0, 1]))))
    np.testing.assert_allclose(tail, [0.5, 0.3, 0.2], rtol=1e-6)


@pytest.mark.parametrize("support", ["student", "teacher"])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_topk_divergence_matches_numpy(rng, support, beta):
    s, t = rng.normal(size=(3, 5, 13)) * 2, rng.normal(size=(3, 5, 13)) * 2
    k = 4
    ls, lt = np_lsm(s), np_lsm(t)
    idx = np.argsort(-(ls if support == "student" else lt), axis=-1, kind="stable")[..., :k]

    def bucket(lp):
        head = np.take_along_axis(lp, idx, -1)
        return np.concatenate([head, np.log(1 - np.exp(head).sum(-1, keepdims=True))], -1)
    ref = np_gjsd(bucket(ls), bucket(lt), beta)
    got = ops.topk_divergence(jnp.asarray(s, jnp.float32), jnp.asarray(t, jnp.float32), beta, k=k, support=support)
    chex.assert_trees_all_close(np.asarray(got), ref, rtol=1e-5, atol=1e-6)
    assert (np.asarray(got) >= -1e-6).all()


def test_vocab_mask_excludes_padding(rng):
    x = rng.normal(size=(4, 10))
    vm = np.arange(10) < 7
    got = ops.log_softmax(jnp.asarray(x, jnp.float32), vocab_mask=jnp.asarray(vm))
    chex.assert_trees_all_close(np.asarray(got)[:, :7], np_lsm(x[:, :7]), rtol=1e-5, atol=1e-6)
    assert (np.asarray(got)[:, 7:] < -1e8).all()
    y = rng.normal(size=(4, 10)) + 50 * ~vm  # garbage in padded slots must not matter
    chex.assert_trees_all_close(np.asarray(ops.kl(jnp.asarray(x), jnp.asarray(y), vocab_mask=vm)),
                                np_kl(np_lsm(x[:, :7]), np_lsm(y[:, :7])), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn", [
    lambda s, t: ops.kl(s, t), lambda s, t: ops.kl(t, s), lambda s, t: ops.generalized_jsd(s, t, 0.5),
    lambda s, t: ops.generalized_jsd(s, t, 0.0), lambda s, t: ops.entropy(s),
    lambda s, t: ops.topk_divergence(s, t, 0.5, k=3),
    lambda s, t: ops.token_logprobs(s, jnp.zeros(s.shape[:-1], jnp.int32))])
def test_jit_vmap_grad_and_extremes(rng, fn):
    s = jnp.asarray(rng.normal(size=(2, 3, 9)), jnp.float32)
    t = jnp.asarray(rng.normal(size=(2, 3, 9)), jnp.float32)
    chex.assert_trees_all_close(jax.jit(fn)(s, t), fn(s, t), rtol=1e-6)
    chex.assert_trees_all_close(jax.vmap(fn)(s[None], t[None])[0], fn(s, t), rtol=1e-6)
    big = jnp.asarray(rng.choice([-1e4, 1e4], size=(2, 3, 9)), jnp.float32)
    for a, b in [(s, t), (big, t), (s, big), (big, -big)]:
        g = jax.grad(lambda x: fn(x, b).sum())(a)
        v = fn(a, b)
        assert np.isfinite(np.asarray(g)).all() and np.isfinite(np.asarray(v)).all()


def test_bf16_matches_float32(rng):
    s = jnp.asarray(rng.normal(size=(4, 6, 31)), jnp.float32)
    t = jnp.asarray(rng.normal(size=(4, 6, 31)), jnp.float32)
    sb, tb = s.astype(jnp.bfloat16), t.astype(jnp.bfloat16)
    for f in (lambda a, b: ops.generalized_jsd(a, b, 0.5), ops.kl, lambda a, b: ops.entropy(a)):
        out = f(sb, tb)
        assert out.dtype == jnp.float32
        chex.assert_trees_all_close(out, f(sb.astype(jnp.float32), tb.astype(jnp.float32)), rtol=1e-6)
        chex.assert_trees_all_close(out, f(s, t), rtol=3e-2, atol=3e-2)


def test_bad_input_errors():
    with pytest.raises(ValueError, match="vocab mismatch.*student_logits.*teacher_logits"):
        ops.generalized_jsd(jnp.zeros((2, 5)), jnp.zeros((2, 6)))
    with pytest.raises(ValueError, match="tokens.*vocabulary has 5"):
        ops.token_logprobs(jnp.zeros((2, 5)), jnp.array([1, 5]))
    with pytest.raises(ValueError, match="rank"):
        ops.token_logprobs(jnp.zeros((2, 5)), jnp.array([[1, 2]]))
    with pytest.raises(ValueError, match="beta"):
        ops.generalized_jsd(jnp.zeros((2, 5)), jnp.zeros((2, 5)), 1.5)
    with pytest.raises(TypeError, match="beta"):
        jax.jit(lambda b: ops.generalized_jsd(jnp.zeros((2, 5)), jnp.zeros((2, 5)), b))(0.5)
    with pytest.raises(ValueError, match="vocab_mask"):
        ops.log_softmax(jnp.zeros((2, 5)), vocab_mask=jnp.ones(4, bool))
    with pytest.raises(ValueError, match="`k`"):
        ops.topk_divergence(jnp.zeros((2, 5)), jnp.zeros((2, 5)), k=5)
