"""Which compute dtype ``model.dtype="auto"`` means on this machine.

bf16 operands with float32 accumulation run a matmul about 4x faster than float32 on a CPU with
AMX (Sapphire Rapids and later: the ``amx_bf16`` flag), and a train step of SmolLM2-135M 2.1x
faster (``experiments.bench.train_step``). Without AMX a CPU has no bf16 matmul units (not
measured here: this machine has AMX), so ``auto`` keeps float32 there. On GPUs and TPUs ``auto`` also means float32: set ``model.dtype`` to choose.
"""
from __future__ import annotations

import functools

import jax


@functools.cache
def cpu_has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True when the CPU advertises AMX bf16 tiles (``amx_bf16`` in ``cpuinfo``'s flags)."""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            return any(line.startswith("flags") and "amx_bf16" in line.split() for line in f)
    except OSError:   # not Linux: no way to tell, keep float32
        return False


def auto_compute_dtype(backend: str | None = None) -> str:
    """``"bfloat16"`` on a CPU backend whose CPU has AMX, else ``"float32"``."""
    backend = jax.default_backend() if backend is None else backend
    return "bfloat16" if backend == "cpu" and cpu_has_amx() else "float32"
