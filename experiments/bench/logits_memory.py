"""Working memory and time of a distillation loss + gradient: fused chunked LM head vs full logits.

What is measured: ``value_and_grad`` w.r.t. the student hidden states ``[1, N, D]`` and the
unembedding ``[D, V]`` (float32) of ``sum_t mask[t] * f(student[t], teacher[t])`` for ``f`` = reverse
KL and generalized JSD (beta 0.5), the teacher being a constant (``stop_gradient``), in three forms:

* ``naive``: ``h @ W`` materialises ``[N, V]`` logits and the dense :mod:`hindsight.ops` loss runs on
  them (what a training loss does without the chunked path);
* ``fused``: :func:`hindsight.ops.fused_distillation_loss` (one scan over row blocks, closed-form
  ``dlogits`` and the gradients built in the forward pass, no recomputation; its default blocks,
  :func:`hindsight.ops.fused.fused_chunk_size`: 176 rows at 1,024 tokens, 192 at 8,192);
* ``remat``: the scan + ``jax.checkpoint`` path (:func:`hindsight.ops.chunked_kl` /
  :func:`~hindsight.ops.chunked_generalized_jsd` under ``jax.grad``), for reference.

How memory is measured. Each configuration runs in a fresh child process (so no configuration sees
another's caches or allocator state) with ``RLIMIT_AS`` capped as a safety net and glibc's mmap
threshold pinned at 128 KiB (``MALLOC_MMAP_THRESHOLD_``), so every large buffer XLA frees goes back
to the OS at once and the resident set tracks live memory. The child creates the inputs, compiles
the jitted ``value_and_grad`` ahead of time, and reads its current resident set (``VmRSS``): the
*baseline* (runtime + compiled code + inputs and parameters). It then resets the kernel's peak
counter (``echo 5 > /proc/self/clear_refs``), runs the timed calls, and reads the peak resident set
(``VmHWM``). *Working memory* = peak - baseline - the bytes of the outputs (loss, the hidden-state
gradient and the unembedding gradient, which neither version can avoid holding). XLA's own buffer
plan (``memory_analysis().temp_size_in_bytes``) is reported next to it as a cross-check.

Time is the median of the timed calls (after ahead-of-time compilation; ``--repeats``, 3 with
``--quick`` and 1 at full size, where one call takes minutes on 2 CPU cores); naive and fused run
side by side in the same parent, one child after the other. The larger sizes run only for
``--growth-losses`` (default: the JSD, the loss with the largest working set).

The last line printed is a JSON object: ``peak_mem_ratio`` (naive / fused working memory at the
reference size), ``time_ratio`` (fused / naive time there), ``chunked_mem_growth`` (fused working
memory at the largest / the reference size), every measurement and the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

GIB = 2.0 ** 30
AS_CAP_BYTES = 20 * 2 ** 30  # safety net on a shared machine; virtual size, so well above the
# resident peak (XLA's CPU kernels reserve address space: the dense JSD needs more than 12.5 GiB of it)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _loss_fn(impl: str, loss: str, beta: float, chunk_size: int | None):
    import jax
    import jax.numpy as jnp

    import hindsight.ops as ops

    def naive(hs, ht, w, mask):
        zs, zt = hs @ w, jax.lax.stop_gradient(ht @ w)
        f = ops.kl(zs, zt) if loss == "reverse_kl" else ops.generalized_jsd(zs, zt, beta)
        return jnp.sum(mask * f)

    def fused(hs, ht, w, mask):
        return ops.fused_distillation_loss(hs, ht, w, mask, loss=loss, beta=beta,
                                           chunk_size=chunk_size)[0]

    def remat(hs, ht, w, mask):
        ht = jax.lax.stop_gradient(ht)
        if loss == "reverse_kl":
            f = ops.chunked_kl(hs, ht, w, q_unembed=jax.lax.stop_gradient(w), chunk_size=chunk_size)
        else:
            f = ops.chunked_generalized_jsd(hs, ht, w, beta, teacher_unembed=jax.lax.stop_gradient(w),
                                            chunk_size=chunk_size)
        return jnp.sum(mask * f)

    return {"naive": naive, "fused": fused, "remat": remat}[impl]


def run_child(cfg: dict) -> dict:
    """One configuration, in this (fresh) process; returns its measurements."""
    import jax
    import jax.numpy as jnp

    n, d, v = cfg["tokens"], cfg["hidden"], cfg["vocab"]
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    hs = jax.random.normal(k[0], (1, n, d), jnp.float32)
    ht = jax.random.normal(k[1], (1, n, d), jnp.float32)
    # logits ~ N(0, 4), like `randn * 2` logits
    w = jax.random.normal(k[2], (d, v), jnp.float32) * (2.0 / d ** 0.5)
    mask = jnp.ones((1, n), jnp.float32)
    args = jax.block_until_ready((hs, ht, w, mask))
    step = jax.jit(jax.value_and_grad(_loss_fn(cfg["impl"], cfg["loss"], cfg["beta"],
                                               cfg["chunk_size"]), argnums=(0, 2)))
    compiled = step.lower(*args).compile()
    mem = compiled.memory_analysis()
    xla_temp = getattr(mem, "temp_size_in_bytes", None) if mem is not None else None
    baseline = _status_kib("VmRSS") * 1024
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    times, value = [], None
    for _ in range(cfg["repeats"]):
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
        value = float(out[0])
        del out
    peak = _status_kib("VmHWM") * 1024
    out_bytes = 4 + 4 * (n * d + d * v)
    if cfg["impl"] != "naive":
        from hindsight.ops import default_chunk_size
        from hindsight.ops.fused import fused_chunk_size
        rows = cfg["chunk_size"] or (fused_chunk_size(n, v) if cfg["impl"] == "fused"
                                     else default_chunk_size(v))
        cfg = {**cfg, "block_rows": min(rows, n)}
    return {**cfg, "time_s": statistics.median(times), "times_s": times, "value": value,
            "baseline_gib": baseline / GIB, "peak_gib": peak / GIB,
            "working_gib": (peak - baseline - out_bytes) / GIB,
            "xla_temp_gib": None if xla_temp is None else xla_temp / GIB}


def _limit_child() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_CAP_BYTES, AS_CAP_BYTES))


def measure(cfg: dict) -> dict:
    """Run `cfg` in a fresh child process; returns its measurements (or the failure)."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072",
               XLA_FLAGS=os.environ.get("XLA_FLAGS", ""))
    proc = subprocess.run([sys.executable, "-m", "experiments.bench.logits_memory", "--child",
                           json.dumps(cfg)], capture_output=True, text=True, env=env,
                          preexec_fn=_limit_child)
    if proc.returncode:
        return {**cfg, "error": proc.stderr.strip().splitlines()[-1:] or [f"rc {proc.returncode}"]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def machine() -> dict:
    import jax

    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                  if line.startswith("model name")), platform.processor())
    return {"cpu": model, "cores": os.cpu_count(), "jax": jax.__version__,
            "backend": jax.default_backend(), "python": platform.python_version(),
            "mem_total_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, 1)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="CI-sized run (small V, few tokens)")
    p.add_argument("--chunk-size", type=int, default=None,
                   help="rows per block for fused and remat (default: each one's library default)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed calls at the reference size (default: 3 with --quick, else 1)")
    p.add_argument("--losses", default="reverse_kl,jsd")
    p.add_argument("--growth-losses", default="jsd",
                   help="losses whose fused version also runs at the larger sizes")
    p.add_argument("--no-remat", action="store_true", help="skip the scan+remat reference")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))))
        return

    from hindsight.ops import default_chunk_size
    from hindsight.ops.fused import fused_chunk_size

    if args.quick:
        vocab, hidden, ref, sizes = 32_768, 256, 512, [512, 2048]
    else:
        vocab, hidden, ref, sizes = 151_936, 1_024, 1_024, [1_024, 4_096, 8_192]
    repeats = args.repeats or (3 if args.quick else 1)
    growth = args.growth_losses.split(",")
    # None: fused_distillation_loss and the remat path pick their own defaults
    base = {"vocab": vocab, "hidden": hidden, "beta": 0.5, "chunk_size": args.chunk_size}
    plan = []
    for loss in args.losses.split(","):
        plan.append({**base, "impl": "naive", "loss": loss, "tokens": ref, "repeats": repeats})
        plan += [{**base, "impl": "fused", "loss": loss, "tokens": n,
                  "repeats": repeats if n == ref else 1}
                 for n in (sizes if loss in growth else sizes[:1])]
        if not args.no_remat:
            plan.append({**base, "impl": "remat", "loss": loss, "tokens": ref, "repeats": repeats})
    results = []
    for cfg in plan:
        r = measure(cfg)
        results.append(r)
        if "error" in r:
            print(f"{cfg['impl']:5s} {cfg['loss']:10s} N={cfg['tokens']:5d}  FAILED: {r['error']}",
                  flush=True)
        else:
            print(f"{r['impl']:5s} {r['loss']:10s} N={r['tokens']:5d}  time {r['time_s']:7.2f} s  "
                  f"peak {r['peak_gib']:6.2f} GiB  working {r['working_gib']:6.3f} GiB  "
                  f"(XLA temp {r['xla_temp_gib'] if r['xla_temp_gib'] is None else round(r['xla_temp_gib'], 3)} GiB)  "
                  f"value {r['value']:.6g}", flush=True)

    def get(impl, loss, n, key):
        r = next(r for r in results if (r["impl"], r["loss"], r["tokens"]) == (impl, loss, n))
        if "error" in r:
            raise SystemExit(f"{impl} {loss} N={n} failed: {r['error']}")
        return r[key]

    per_loss = {}
    for loss in args.losses.split(","):
        per_loss[loss] = {
            "peak_mem_ratio": get("naive", loss, ref, "working_gib") / get("fused", loss, ref, "working_gib"),
            "time_ratio": get("fused", loss, ref, "time_s") / get("naive", loss, ref, "time_s"),
            "chunked_mem_growth": get("fused", loss, sizes[-1], "working_gib")
            / get("fused", loss, ref, "working_gib") if loss in growth else None,
            "loss_rel_diff": abs(get("fused", loss, ref, "value") - get("naive", loss, ref, "value"))
            / abs(get("naive", loss, ref, "value")),
        }
    # headline figures: the worst case over the losses
    summary = {
        "bench": "logits_memory", "quick": args.quick, "vocab": vocab, "hidden": hidden,
        "reference_tokens": ref, "chunked_tokens": sizes,
        "chunk_size": args.chunk_size or fused_chunk_size(ref, vocab),
        "remat_chunk_size": args.chunk_size or default_chunk_size(vocab),
        "peak_mem_ratio": min(v["peak_mem_ratio"] for v in per_loss.values()),
        "time_ratio": max(v["time_ratio"] for v in per_loss.values()),
        # None when no loss ran at the larger sizes (--growth-losses "")
        "chunked_mem_growth": max((v["chunked_mem_growth"] for v in per_loss.values()
                                   if v["chunked_mem_growth"] is not None), default=None),
        "per_loss": per_loss, "results": results, "machine": machine(),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
