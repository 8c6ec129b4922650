"""Sharded train step == single-device train step (8 forced CPU devices, in a child process)."""
import pytest
from jax.sharding import PartitionSpec as P

from tests.train.helpers import run_script


@pytest.mark.slow
def test_sharded_step_matches_single_device():
    out = run_script("tests.train.run_sharded", num_devices=8, timeout=600)
    assert out["metrics"]["count/policy"] > 0 and out["metrics"]["clip_high_frac"] >= 0
    for name in ("d2f2t2", "d8"):
        r = out[name]
        assert r["loss_rel"] < 1e-5, (name, r)
        assert r["grads_rel"] < 1e-5, (name, r)
        assert r["params_rel"] < 1e-5, (name, r)
        assert r["metrics_rel"] < 1e-5, (name, r)
    # The (2, 2, 2) mesh really shards the weights: [L, D, H*hd] over fsdp and tensor.
    assert out["d2f2t2"]["q_proj_spec"] == str(P(None, "fsdp", "tensor"))
    assert out["metrics"]["grad_clipped"] == 1.0  # the global norm is taken over all shards
