"""Benchmarks: ``python -m experiments.bench.<name>``, each printing one JSON object last."""
from __future__ import annotations

import os
import platform
import time


def load_and_machine(load_start) -> dict:
    """The ``loadavg_1_5_15m`` (at the start, ``load_start``, and now) and ``machine`` keys of a
    benchmark's JSON: how busy the cores were and what ran it."""
    import jax

    return {"loadavg_1_5_15m": {"start": [round(x, 2) for x in load_start],
                                "end": [round(x, 2) for x in os.getloadavg()]},
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                        "jax_backend": jax.default_backend()}}


class CompileClock:
    """Seconds of tracing, lowering and XLA compilation since the clock was made
    (:func:`hindsight.rollout.runtime.compile_seconds`): ``clock.seconds`` read before and after a
    timed call says how much of it compiled shapes a warm-up did not reach."""

    def __init__(self):
        from hindsight.rollout.runtime import compile_seconds

        self._now = compile_seconds
        self._start = compile_seconds()

    @property
    def seconds(self) -> float:
        return self._now() - self._start


def _best_seconds(f, *args, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of the jitted ``f`` (after one untimed call)."""
    import jax

    jax.block_until_ready(f(*args))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_ceiling(jnp, rows: int, dim: int, hidden: int, dtype, *, repeats: int = 7) -> float:
    """FLOP/s of this machine's matmul in ``dtype`` (float32 accumulation) at the shape
    ``[rows, dim] x [dim, hidden]`` (a model's MLP): the fastest of ``repeats`` timed calls."""
    import jax

    x = jax.random.normal(jax.random.key(0), (rows, dim), dtype)
    w = jax.random.normal(jax.random.key(1), (dim, hidden), dtype)
    f = jax.jit(lambda x, w: jnp.matmul(x, w, preferred_element_type=jnp.float32))
    return 2 * rows * dim * hidden / _best_seconds(f, x, w, repeats=repeats)


def read_bandwidth(jnp, *, nbytes: int = 1 << 28, repeats: int = 7) -> float:
    """Bytes/s this machine reads from memory: a sum over a float32 array of ``nbytes`` (default
    256 MiB, far past the caches), the fastest of ``repeats`` timed calls. A decode step must at
    least read every weight once; a pass that also writes a fresh array measures the page faults of
    its output as much as the memory (about a third of this rate on a 2-core AMD EPYC)."""
    import jax

    x = jnp.ones((nbytes // 4,), jnp.float32)
    return nbytes / _best_seconds(jax.jit(jnp.sum), x, repeats=repeats)
