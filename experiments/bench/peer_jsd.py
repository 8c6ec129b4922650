"""Our dense ``generalized_jsd`` (JAX) vs TRL's ``GKDTrainer.generalized_jsd_loss`` (PyTorch), on CPU.

Both get the same float32 student and teacher logits ``[B, T, V]`` and compute TRL's loss: the
generalized JSD summed over the vocabulary and the positions and divided by ``B`` (TRL's
``reduction="batchmean"`` without labels), then its gradient w.r.t. the student logits.

Correctness (in this process): per-position values (TRL ``reduction="none"`` summed over V), the
batch-mean loss and the student gradient, for ``beta`` in {0, 0.1, 0.5, 0.9, 1}; ``max_rel_err`` is
the largest relative difference of the values.

Time and memory: each implementation runs in a fresh child process (one after the other, so both see
the same machine load), with glibc's mmap threshold pinned at 128 KiB so freed buffers leave the
resident set at once. The child builds the inputs, warms up (JAX: ahead-of-time compilation; torch:
one untimed call), reads ``VmRSS`` as the baseline, resets the peak counter
(``echo 5 > /proc/self/clear_refs``), runs the timed forward+backward calls and reads ``VmHWM``.
Working memory = peak - baseline - the gradient output. Time is the median of the timed calls.

TRL is imported, not re-implemented. ``trl.experimental.gkd.gkd_trainer`` imports ``datasets`` (and,
through ``trl.models``, ``pyarrow`` and ``pandas``) only for type names used by the trainer class; when
those packages are absent, empty placeholder modules stand in for them so that the module (and the
static loss method under test) can be imported without them.

The last line printed is a JSON object with ``max_rel_err``, ``time_ratio`` (ours / TRL, forward +
backward), the memory figures and the machine.
"""
from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import types

from experiments.bench.logits_memory import GIB, _status_kib, machine

BETAS = (0.0, 0.1, 0.5, 0.9, 1.0)
TRL_OPTIONAL = ("datasets", "pyarrow", "pandas")


class _Placeholder(types.ModuleType):
    """A module whose every attribute is a fresh empty class (enough for import-time type names)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots):
        self.roots = set(roots)

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _Placeholder(spec.name)

    def exec_module(self, module):
        module.__path__ = []


def trl_generalized_jsd_loss():
    """TRL's ``GKDTrainer.generalized_jsd_loss`` and TRL's version."""
    missing = [m for m in TRL_OPTIONAL if importlib.util.find_spec(m) is None]
    if missing:
        sys.meta_path.insert(0, _PlaceholderFinder(missing))
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import trl
    from trl.experimental.gkd.gkd_trainer import GKDTrainer

    return GKDTrainer.generalized_jsd_loss, trl.__version__


def make_logits(b: int, t: int, v: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return ((rng.standard_normal((b, t, v)) * 2).astype(np.float32),
            (rng.standard_normal((b, t, v)) * 2).astype(np.float32))


def ours_fn(beta: float, batch: int):
    import jax
    import jax.numpy as jnp

    import hindsight.ops as ops

    return jax.jit(jax.value_and_grad(lambda s, t: jnp.sum(ops.generalized_jsd(s, t, beta)) / batch))


def check_correctness(b: int, t: int, v: int) -> dict:
    """Values and gradients of both implementations, same process, several betas."""
    import jax.numpy as jnp
    import numpy as np
    import torch

    import hindsight.ops as ops

    trl_loss, _ = trl_generalized_jsd_loss()
    s_np, t_np = make_logits(b, t, v, seed=1)
    errs, grad_errs = {}, {}
    for beta in BETAS:
        ours_pos = np.asarray(ops.generalized_jsd(jnp.asarray(s_np), jnp.asarray(t_np), beta), np.float64)
        ours_val, ours_grad = ours_fn(beta, b)(jnp.asarray(s_np), jnp.asarray(t_np))
        st = torch.tensor(s_np, requires_grad=True)
        tt = torch.tensor(t_np)
        trl_pos = trl_loss(st, tt, beta=beta, reduction="none").sum(-1).detach().double().numpy()
        trl_val = trl_loss(st, tt, beta=beta)
        trl_val.backward()
        rel = lambda a, r: float(np.max(np.abs(np.asarray(a, np.float64) - r) / np.maximum(np.abs(r), 1e-12)))
        errs[str(beta)] = max(rel(ours_pos, trl_pos), rel(float(ours_val), float(trl_val)))
        g_ref = st.grad.double().numpy()
        grad_errs[str(beta)] = float(np.max(np.abs(np.asarray(ours_grad, np.float64) - g_ref))
                                     / np.max(np.abs(g_ref)))
    return {"value_rel_err": errs, "grad_err_rel_to_max": grad_errs}


def run_child(cfg: dict) -> dict:
    b, t, v, beta, repeats = cfg["batch"], cfg["seq"], cfg["vocab"], cfg["beta"], cfg["repeats"]
    s_np, t_np = make_logits(b, t, v)
    if cfg["impl"] == "ours":
        import jax
        import jax.numpy as jnp

        s, te = jax.block_until_ready((jnp.asarray(s_np), jnp.asarray(t_np)))
        step = ours_fn(beta, b).lower(s, te).compile()

        def call():
            val, grad = jax.block_until_ready(step(s, te))
            return float(val)
    else:
        import torch

        torch.set_num_threads(os.cpu_count())
        trl_loss, _ = trl_generalized_jsd_loss()
        s, te = torch.tensor(s_np, requires_grad=True), torch.tensor(t_np)

        def call():
            s.grad = None
            loss = trl_loss(s, te, beta=beta)
            loss.backward()
            return float(loss)
        call()                      # warm-up (first-call allocations, thread pool)
    del s_np, t_np
    baseline = _status_kib("VmRSS") * 1024
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = call()
        times.append(time.perf_counter() - t0)
    peak = _status_kib("VmHWM") * 1024
    out_bytes = 4 * b * t * v           # the student-logits gradient, which both must return
    return {**cfg, "value": value, "time_s": statistics.median(times), "times_s": times,
            "baseline_gib": baseline / GIB, "peak_gib": peak / GIB,
            "working_gib": (peak - baseline - out_bytes) / GIB}


def measure(cfg: dict) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072",
               TRL_EXPERIMENTAL_SILENCE="1")
    proc = subprocess.run([sys.executable, "-m", "experiments.bench.peer_jsd", "--child",
                           json.dumps(cfg)], capture_output=True, text=True, env=env)
    if proc.returncode:
        raise RuntimeError(f"child {cfg} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="CI-sized run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--beta", type=float, default=0.5)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))))
        return

    b, t, v = (2, 32, 8_192) if args.quick else (2, 128, 151_936)
    correctness = check_correctness(2, 8, 1_000 if args.quick else 32_000)
    _, trl_version = trl_generalized_jsd_loss()
    cfg = {"batch": b, "seq": t, "vocab": v, "beta": args.beta, "repeats": args.repeats}
    ours, trl = measure({**cfg, "impl": "ours"}), measure({**cfg, "impl": "trl"})
    for r in (ours, trl):
        print(f"{r['impl']:4s} [{b},{t},{v}] beta {args.beta}: fwd+bwd {r['time_s']:.3f} s  "
              f"peak {r['peak_gib']:.2f} GiB  working {r['working_gib']:.3f} GiB  value {r['value']:.7g}",
              flush=True)
    summary = {
        "bench": "peer_jsd", "quick": args.quick, "shape": [b, t, v], "beta": args.beta,
        "trl_version": trl_version, "trl_function": "trl.experimental.gkd.gkd_trainer.GKDTrainer.generalized_jsd_loss",
        "max_rel_err": max(correctness["value_rel_err"].values()),
        "time_ratio": ours["time_s"] / trl["time_s"],
        "working_mem_ratio": ours["working_gib"] / trl["working_gib"],
        "bench_value_rel_diff": abs(ours["value"] - trl["value"]) / abs(trl["value"]),
        "correctness": correctness, "ours": ours, "trl": trl, "machine": machine(),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
