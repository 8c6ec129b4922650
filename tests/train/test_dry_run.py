"""``python -m experiments.run ... --dry_run``: per-device memory from shapes alone.

The per-device parameter bytes of Qwen3-8B (a config-only entry: no weights anywhere) on 8 virtual
CPU devices equal the analytic count from its architecture, for fsdp=8 and fsdp=4 x tensor=2, in
float32 and bfloat16; the launcher prints the JSON last and creates no run directory. A tiny
model's report is checked element by element in-process."""
import json
import os
import subprocess
import sys

import jax
import pytest

from configs.base import method_file
from hindsight.train.dry_run import KEYS, dry_run, format_table
from tests.train.helpers import subprocess_env

# Qwen3-8B: vocab, hidden, layers, heads, KV heads, head dim, MLP hidden.
V, D, L, H, KV, HD, F = 151936, 4096, 36, 32, 8, 128, 12288
SHARDED = 2 * V * D + L * (D * H * HD + 2 * D * KV * HD + H * HD * D + 3 * D * F)  # untied head
REPLICATED = L * (2 * D + 2 * HD) + D  # RMSNorm scales (partition rule P()): whole on every device
SHAPE = ("model.name=qwen3-8b,rollout.prompts_per_step=1,rollout.group_size=8,"
         "rollout.max_new_tokens=32,rollout.slots=8,train.mesh.data=1")
REQUIRED = ("params_bytes_per_device", "optimizer_bytes_per_device", "grad_bytes_per_device",
            "temp_bytes_per_device", "kv_cache_bytes_per_device", "devices", "mesh",
            "param_dtype", "model")


def _flags(spec: str) -> list[str]:
    return [f"--config.{item}" for item in spec.split(",")]


def _check_8b(report, *, itemsize: int, mesh: dict):
    assert report["devices"] == 8 and report["mesh"] == mesh
    assert report["param_count"] == SHARDED + REPLICATED
    params = (SHARDED * 4 // 8 + REPLICATED * 4) * itemsize // 4
    assert report["params_bytes_per_device"] == params
    assert report["grad_bytes_per_device"] == params
    # K and V, [L, slots=8, max_len=64 (16 + 32 rounded to 64), KV, HD] float32, split 8 ways
    # (rows over fsdp, or over fsdp=4 and KV heads over tensor=2)
    assert report["kv_cache"] == {"slots": 8, "max_len": 64, "dtype": "float32"}
    assert report["kv_cache_bytes_per_device"] == 2 * L * 8 * 64 * KV * HD * 4 // 8
    assert report["temp_bytes_per_device"] > 0


@pytest.mark.slow  # about 50 s: three compiles of the 8B train step (one layer, scanned)
def test_qwen3_8b_dry_run_on_8_devices(tmp_path):
    workdir = tmp_path / "never"
    env = subprocess_env(8)
    root = env["PYTHONPATH"].split(os.pathsep)[0]
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.run", "--config=configs/grpo.py", *_flags(SHAPE),
         "--config.train.mesh.fsdp=8", "--dry_run", "--prompt_tokens=16", f"--workdir={workdir}"],
        env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    fp32 = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "params" in proc.stdout and not workdir.exists()
    assert all(k in fp32 for k in REQUIRED) and fp32["param_dtype"] == "float32"
    _check_8b(fp32, itemsize=4, mesh={"data": 1, "fsdp": 8, "tensor": 1})
    # AdamW: mu and nu like the params, plus replicated int32 step counts
    assert 0 <= fp32["optimizer_bytes_per_device"] - 2 * fp32["params_bytes_per_device"] < 64

    child = subprocess.run(
        [sys.executable, "-m", "tests.train.run_dry_run",
         SHAPE + ",train.mesh.fsdp=4,train.mesh.tensor=2",
         SHAPE + ",train.mesh.fsdp=8,model.param_dtype=bfloat16"],
        env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-4000:]
    tensor, bf16 = json.loads(child.stdout.strip().splitlines()[-1])
    _check_8b(tensor, itemsize=4, mesh={"data": 1, "fsdp": 4, "tensor": 2})
    assert tensor["params_bytes_per_device"] == fp32["params_bytes_per_device"]
    _check_8b(bf16, itemsize=2, mesh={"data": 1, "fsdp": 8, "tensor": 1})
    assert bf16["params_bytes_per_device"] * 2 == fp32["params_bytes_per_device"]
    # the float32 master copy, mu and nu: three float32 copies of the params
    assert 0 <= bf16["optimizer_bytes_per_device"] - 3 * fp32["params_bytes_per_device"] < 64
    assert bf16["master_weights"] and bf16["reference"] is None


def test_tiny_report_counts_every_array():
    config = method_file("grpo", "tiny")
    config.train.reference = "frozen"
    config.train.reference_dtype = "bfloat16"
    report = dry_run(config, prompt_tokens=8)
    from hindsight.testing.models import CHAR_VOCAB, TINY
    d, f, v, n = TINY.hidden_size, TINY.intermediate_size, CHAR_VOCAB, TINY.num_layers
    attn = d * TINY.q_size * 2 + 2 * d * TINY.kv_size
    count = 2 * v * d + n * (attn + 3 * d * f + 2 * d) + d
    assert jax.device_count() == report["devices"] == 1
    assert report["param_count"] == count
    assert report["params_bytes_per_device"] == report["grad_bytes_per_device"] == 4 * count
    assert report["reference_bytes_per_device"] == 2 * count
    assert report["optimizer_bytes_per_device"] == 4  # SGD without momentum: its step count
    slots, length = report["kv_cache"]["slots"], report["kv_cache"]["max_len"]
    assert (slots, length) == (16, 64)  # the tiny variant's rollout.slots; 16 (prompt bucket) + 24
    assert report["kv_cache_bytes_per_device"] == 2 * n * slots * length * TINY.kv_size * 4
    assert report["sampler_weights_bytes_per_device"] == 0  # tiny-random's layers are unrolled
    assert report["peak_bytes_per_device"] == report["state_bytes_per_device"] + max(
        report["grad_bytes_per_device"] + report["temp_bytes_per_device"],
        report["kv_cache_bytes_per_device"])
    table = format_table(report)
    assert all(key in table for key in KEYS)
    assert json.loads(json.dumps(report)) == report


def test_a_bad_config_is_refused_before_compiling():
    config = method_file("grpo", "tiny")
    config.train.mesh.fsdp = 3  # does not divide 1 device
    from hindsight.train.experiment import ConfigError
    with pytest.raises(ConfigError, match="mesh"):
        dry_run(config)
    with pytest.raises(ValueError, match="prompt_tokens"):
        dry_run(method_file("grpo", "tiny"), prompt_tokens=0)
