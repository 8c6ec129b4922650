"""Which compute dtype ``model.dtype="auto"`` means on this machine.

bf16 operands with float32 accumulation run a matmul about 4x faster than float32 on a CPU with
AMX (Sapphire Rapids and later: the ``amx_bf16`` flag), and a train step of SmolLM2-135M 2.1x
faster (``experiments.bench.train_step``). A CPU with AVX-512 BF16 instructions (``avx512_bf16``,
e.g. AMD Zen 4 / 5) runs them about 2x faster (measured on a 2-core AMD EPYC Zen 5 only: 936 vs
482 GFLOP/s, the demo-sized train step 1.67x, decode 1.45-1.47x). Without either a CPU has
no bf16 matmul units (an AVX2-only AMD EPYC: bf16 decode 0.79x float32 at 64 rows), so ``auto``
keeps float32 there. On GPUs and TPUs ``auto`` also means float32: set ``model.dtype`` to choose.
"""
from __future__ import annotations

import functools

import jax

# /proc/cpuinfo flags of the CPUs whose bf16 matmuls beat float32 (measured: see above)
BF16_MATMUL_FLAGS = ("amx_bf16", "avx512_bf16")


@functools.cache
def cpu_has_bf16_matmul(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True when the CPU advertises bf16 matmul instructions (AMX tiles or AVX-512 BF16: one of
    `BF16_MATMUL_FLAGS` in ``cpuinfo``'s flags)."""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            return any(line.startswith("flags") and not set(BF16_MATMUL_FLAGS).isdisjoint(line.split())
                       for line in f)
    except OSError:   # not Linux: no way to tell, keep float32
        return False


def auto_compute_dtype(backend: str | None = None) -> str:
    """``"bfloat16"`` on a CPU backend whose CPU has bf16 matmul instructions, else ``"float32"``."""
    backend = jax.default_backend() if backend is None else backend
    return "bfloat16" if backend == "cpu" and cpu_has_bf16_matmul() else "float32"
