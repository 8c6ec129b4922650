"""Partition rules, and sharded loading on a forced 8-device CPU mesh (in a subprocess, because
`--xla_force_host_platform_device_count` must be set before jax is imported)."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from hindsight.models import spec_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_spec_for_stacked_missing_and_indivisible_axes():
    mesh = Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
    assert spec_for("embed", (128, 64)) == P("tensor", "fsdp")
    assert spec_for("layers/attn/q_proj/kernel", (2, 64, 64)) == P(None, "fsdp", "tensor")
    assert spec_for("layers/3/mlp/down_proj/kernel", (96, 64)) == P("tensor", "fsdp")
    assert spec_for("layers/attn_norm/scale", (2, 64)) == P(None, None)
    assert spec_for("embed", (128, 64), mesh=mesh) == P("tensor", "fsdp")  # size-1 axes are fine
    only_data = Mesh(np.asarray(jax.devices()[:1]), ("data",))
    assert spec_for("embed", (128, 64), mesh=only_data) == P(None, None)
    with pytest.raises(KeyError, match="no partition rule"):
        spec_for("layers/attn/rotary", (4,))


def test_sharded_load_matches_unsharded_on_8_devices(hf_models):
    folders = [hf_models["qwen2"][0], hf_models["qwen3"][0]]  # biases + tied; QK-norm + untied
    env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "tests.models.sharded_check", *folders], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == 2
    for res in results:
        assert res["devices"] == 8
        assert set(res["meshes"]) == {"data2_fsdp2_tensor2/scan", "data2_fsdp2_tensor2/unrolled", "data8/scan"}
        for mesh_name, r in res["meshes"].items():
            assert r["wrong_specs"] == [], (mesh_name, r["wrong_specs"])
            assert r["max_rel_err"] < 1e-5, (mesh_name, r["max_rel_err"])
            if mesh_name.startswith("data8"):
                assert r["num_sharded_params"] == 0
            else:
                assert r["num_sharded_params"] > 0
