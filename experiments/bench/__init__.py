"""Benchmarks: ``python -m experiments.bench.<name>``, each printing one JSON object last."""
from __future__ import annotations

import os
import platform


def load_and_machine(load_start) -> dict:
    """The ``loadavg_1_5_15m`` (at the start, ``load_start``, and now) and ``machine`` keys of a
    benchmark's JSON: how busy the cores were and what ran it."""
    import jax

    return {"loadavg_1_5_15m": {"start": [round(x, 2) for x in load_start],
                                "end": [round(x, 2) for x in os.getloadavg()]},
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                        "jax_backend": jax.default_backend()}}
