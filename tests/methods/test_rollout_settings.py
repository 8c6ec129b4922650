"""Settings and helpers the rollout layer reads from the methods (DAPO, Dr.GRPO, HDL)."""
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.methods import dapo, get_method, hdl


def test_dapo_overlong_shaping():
    cfg = get_method("dapo").config
    out = dapo.shaped_rewards(jnp.array([1.0, 1.0, 0.0]), jnp.array([100, 18432, 20480]), cfg)
    np.testing.assert_allclose(out, [1.0, 0.5, -1.0])  # spec §1.2 test 4: -0.5 at 18432
    off = get_method("dapo").make_config(overlong=False)
    np.testing.assert_array_equal(dapo.shaped_rewards(jnp.ones(2), jnp.array([0, 10 ** 6]), off),
                                  [1.0, 1.0])
    with pytest.raises(ValueError, match="lengths"):
        dapo.shaped_rewards(jnp.ones(2), jnp.ones(3), cfg)


def test_dapo_dynamic_sampling_filter():
    keep = dapo.keep_groups(jnp.array([0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0.0]), 4)
    np.testing.assert_array_equal(keep, [True, False, False])
    with pytest.raises(ValueError, match="does not divide"):
        dapo.keep_groups(jnp.zeros(6), 4)


def test_hdl_min_gap_and_group():
    cfg = get_method("hdl").config
    assert hdl.min_gap(100, cfg) == 16 and hdl.min_gap(1000, cfg) == 50
    assert cfg.group_size == 16
    assert get_method("drgrpo").config.advantage_scale == "none"
