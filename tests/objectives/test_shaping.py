import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.objectives import overlong_penalty


def reference(lengths, max_length, buffer, factor):
    exceed = np.asarray(lengths, np.float64) - (max_length - buffer)
    return np.minimum(-exceed / buffer * factor, 0.0)


def test_spec_number():
    out = overlong_penalty(jnp.array([18432]), max_length=20480, buffer=4096)
    np.testing.assert_allclose(out, [-0.5], rtol=1e-7)


def test_matches_reference_jit_vmap():
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 24000, size=(3, 7)).astype(np.int32)
    lengths[0, :3] = [16384, 20480, 0]
    f = jax.jit(jax.vmap(lambda x: overlong_penalty(x, max_length=20480, buffer=4096, factor=0.7)))
    out = f(jnp.asarray(lengths))
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, reference(lengths, 20480, 4096, 0.7), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(out[0, :3], np.array([0.0, -0.7, 0.0], np.float32))
    np.testing.assert_allclose(overlong_penalty(jnp.asarray(lengths, jnp.bfloat16), max_length=20480,
                                                buffer=4096), reference(lengths, 20480, 4096, 1.0),
                               atol=2e-2)


def test_bad_input():
    with pytest.raises(ValueError, match="`buffer` must be positive"):
        overlong_penalty(jnp.zeros(2), max_length=10, buffer=0)
    with pytest.raises(ValueError, match=r"`buffer` must be in \[0.0, 10.0\]"):
        overlong_penalty(jnp.zeros(2), max_length=10, buffer=11)
    with pytest.raises(ValueError, match="`factor`"):
        overlong_penalty(jnp.zeros(2), max_length=10, buffer=4, factor=-1.0)
