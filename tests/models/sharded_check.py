"""Subprocess body of test_partition: needs 8 fake CPU devices, so XLA_FLAGS is set before jax loads.

Usage: python -m tests.models.sharded_check FOLDER [FOLDER ...]; prints one JSON object per folder.
"""
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from hindsight.models import load_hf_folder, partition_specs  # noqa: E402
from hindsight.models.partition import param_path  # noqa: E402

# The rules written out independently: unstacked spec by parameter-name suffix.
EXPECTED = {
    "embed": ("tensor", "fsdp"), "lm_head": ("fsdp", "tensor"),
    "q_proj/kernel": ("fsdp", "tensor"), "k_proj/kernel": ("fsdp", "tensor"),
    "v_proj/kernel": ("fsdp", "tensor"), "o_proj/kernel": ("tensor", "fsdp"),
    "q_proj/bias": ("tensor",), "k_proj/bias": ("tensor",), "v_proj/bias": ("tensor",),
    "gate_proj/kernel": ("fsdp", "tensor"), "up_proj/kernel": ("fsdp", "tensor"),
    "down_proj/kernel": ("tensor", "fsdp"), "_norm/scale": (),
}
MESHES = {"data2_fsdp2_tensor2": ((2, 2, 2), ("data", "fsdp", "tensor")), "data8": ((8,), ("data",))}
RUNS = (("data2_fsdp2_tensor2", True), ("data2_fsdp2_tensor2", False), ("data8", True))  # (mesh, scan_layers)


def expected_spec(path: str, ndim: int, axes: tuple) -> tuple:
    rule = next(v for k, v in EXPECTED.items() if path.endswith(k))
    rule = tuple(a if a in axes else None for a in rule)
    return (None,) * (ndim - len(rule)) + rule


def normalize(spec) -> tuple:
    spec = tuple(spec)
    while spec and spec[-1] is None:
        spec = spec[:-1]
    return spec


@nnx.jit
def forward(model, tokens, positions):
    return model(tokens, positions)[0]


def check(folder: str) -> dict:
    rng = np.random.RandomState(0)
    tokens = jnp.asarray(rng.randint(0, 128, (8, 12)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(12, dtype=jnp.int32), (8, 12))
    reference = np.asarray(forward(load_hf_folder(folder), tokens, positions))
    result = {"folder": folder, "devices": jax.device_count(), "meshes": {}}
    for name, scan_layers in RUNS:
        shape, axes = MESHES[name]
        mesh = Mesh(np.asarray(jax.devices()).reshape(shape), axes)
        model = load_hf_folder(folder, mesh=mesh, scan_layers=scan_layers)
        state = nnx.state(model)
        specs = dict((param_path(p), v.get_value()) for p, v in nnx.to_flat_state(
            partition_specs(state, mesh=mesh)))
        wrong, sharded = [], 0
        for p, var in nnx.to_flat_state(state):
            path, arr = param_path(p), var.get_value()
            want = normalize(expected_spec(path, arr.ndim, axes))
            got = normalize(arr.sharding.spec)
            sharded += any(a is not None for a in got)
            if got != want or normalize(specs[path]) != want or arr.sharding.mesh.shape != mesh.shape:
                wrong.append(f"{path}: got {got}, partition_specs {tuple(specs[path])}, want {want}")
        batch = NamedSharding(mesh, P("data"))
        out = np.asarray(forward(model, jax.device_put(tokens, batch), jax.device_put(positions, batch)))
        err = float(np.abs(out - reference).max() / np.abs(reference).max())
        result["meshes"][f"{name}/{'scan' if scan_layers else 'unrolled'}"] = {
            "wrong_specs": wrong, "num_sharded_params": sharded, "max_rel_err": err}
    return result


if __name__ == "__main__":
    for folder in sys.argv[1:]:
        print(json.dumps(check(folder)))
