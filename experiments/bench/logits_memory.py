"""Working memory and time of the methods' own losses + gradient: chunked LM-head backends vs dense.

What is measured: ``value_and_grad`` of ``method.loss_fn(model, batch, head=LMHead(backend),
reference=...).value()`` (the loss metrics as aux, as the train step returns them) w.r.t. the
model's parameters, for the methods ``opsd`` (generalized-JSD self-distillation against a frozen
reference teacher, its default), ``pcsd`` (GRPO + gated distillation from the teacher context,
teacher ``"self"``) and ``grpo`` (the clipped-surrogate policy term), each with the LM-head
backends ``scan``, ``fused`` and ``dense`` (:func:`hindsight.ops.lm_head_map`).

The "model" is :class:`HeadOnly`: a float32 embedding table ``[V, D]`` (tied: ``unembedding() =
embed.T``, so the LM head's gradient flows into the table) and a trivial body (the hidden state of
a token is its embedding times a fixed random sign per feature, so a row's logits are not
dominated by its own token); it obeys the decoder interface the methods call, ``model(tokens,
positions, *, attention_mask, return_hidden) -> (hidden [B, S, D], None)``,
``model.unembedding() -> [D, V]``, ``model.config.vocab_size``. So what is measured is the LM head
and the loss, not a decoder; the hidden states ``[N, D]`` of each side and their gradient are
temporaries of the measured program (every backend holds them, and they grow with ``N``: at
8,192 tokens and ``D = 1,024`` each float32 one is 32 MiB). The
batch (:func:`hindsight.batch.build_batch`) has ``B = 2`` rows (one group) of ``N / 2`` response
tokens after a 16-token prompt; the ``teacher`` context has a 24-token prompt before the same
response; ``logp_old`` is the model's own log-prob plus N(0, 0.1) noise (so ratios are near 1 and
some tokens clip), advantages are +-1. ``N`` (``tokens``) counts the LM-head rows of one side.

How memory is measured. Each configuration runs in a fresh child process (so no configuration sees
another's caches or allocator state) with ``RLIMIT_AS`` capped as a safety net and glibc's mmap
threshold pinned at 128 KiB (``MALLOC_MMAP_THRESHOLD_``), so every large buffer XLA frees goes back
to the OS at once and the resident set tracks live memory. The child creates the parameters (and
the reference copy) and the batch, compiles the jitted ``value_and_grad`` ahead of time, and reads
its current resident set (``VmRSS``): the *baseline* (runtime + compiled code + inputs and
parameters). It then resets the kernel's peak counter (``echo 5 > /proc/self/clear_refs``), runs
one call, and reads the peak resident set (``VmHWM``). *Working memory* = peak - baseline -
the bytes of the outputs (the loss, its metrics and the ``[V, D]`` gradient, which every backend
holds). XLA's own buffer plan (``memory_analysis().temp_size_in_bytes``) is reported next to it as
a cross-check.

Time. The first call (the memory measurement) runs with every large buffer mmapped fresh, which
also makes the matmul kernels' own scratch allocations page-fault on every call (on this class of
machine a ``[64, D] @ [D, V]`` product then takes 2.5 times as long); it is reported as
``time_s_low_mmap``. The timed calls then run with glibc's steady-state thresholds (``mallopt``:
mmap threshold 32 MiB, the largest its dynamic default reaches, trim threshold 64 MiB), as in a
long-running training process: one warm-up call, then ``--repeats`` timed calls (3 with
``--quick``, 2 at full size); ``time_s`` is their median, ``time_s_min`` their minimum. Backends
run one child after the other; every backend runs at the reference size, the larger sizes run for
``--growth-backends`` (default: the measured ``--backend``), memory only. With ``opsd``, OPSD's
loss value also runs through :func:`hindsight.ops.fused_distillation_loss` (backend
``closed_form``: the gradient built in the forward scan, no recomputation; the loss value only,
without OPSD's metrics), for comparison.

The last line printed is a JSON object: ``loss_fns`` (the method names) and ``backend`` (the one
the headline figures are for: ``--backend``, default the training default ``LMHead().backend``);
``peak_mem_ratio`` (dense / backend working memory at the reference size, the worst method),
``time_ratio`` (backend / dense median time there, the worst method), ``chunked_mem_growth``
(backend working memory at the largest / the reference size, the worst method); ``goals`` (each
goal and whether it was met); ``per_method`` with, per backend, working memory, XLA temporaries,
times and the ratios (``xla_temp_ratio``, ``time_ratio_min``, ``time_ratio_low_mmap``,
``xla_temp_growth`` besides the three above); every measurement with the load average when it
started, and the machine (with the load average before and after the run).
"""
from __future__ import annotations

import argparse
import dataclasses
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
# resident peak (XLA's CPU kernels reserve address space)
METHODS = ("opsd", "pcsd", "grpo")
BACKENDS = ("scan", "fused", "dense")
CLOSED_FORM = "closed_form"    # OPSD only: hindsight.ops.fused_distillation_loss, for comparison
GOALS = {"peak_mem_ratio": 8.0, "chunked_mem_growth": 1.5, "time_ratio": 1.3}
PROMPT, TEACHER_PROMPT, ROWS = 16, 24, 2


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3       # glibc <malloc.h>
STEADY_MMAP_THRESHOLD = 32 * 2 ** 20
"""glibc's largest dynamic mmap threshold on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``): by default a
freed mmapped chunk raises the threshold up to this, so a long-running process serves repeated
allocations below it from the heap, without fresh page faults."""


def _mallopt(param: int, value: int) -> None:
    import ctypes

    if not ctypes.CDLL("libc.so.6").mallopt(param, value):
        raise RuntimeError(f"mallopt({param}, {value}) failed")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


@dataclasses.dataclass(frozen=True)
class HeadOnlyConfig:
    vocab_size: int
    hidden_size: int


def head_only_model(vocab: int, hidden: int, seed: int = 0):
    """A :class:`HeadOnly` model: float32 ``[V, D]`` table, logits ~ N(0, 4)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    class HeadOnly(nnx.Module):
        """Tied embedding table and a trivial body: the decoder interface, nothing else."""

        def __init__(self, cfg: HeadOnlyConfig, key):
            self.config = cfg
            # entries ~ N(0, 2 / sqrt(D)): a logit (a D-term dot product of two entries) ~ N(0, 4)
            scale = (2.0 / cfg.hidden_size ** 0.5) ** 0.5
            self.embed = nnx.Param(jax.random.normal(key, (cfg.vocab_size, cfg.hidden_size),
                                                     jnp.float32) * scale)

        def __call__(self, tokens, positions, *, attention_mask=None, return_hidden=False,
                     cache=None):
            # a fixed random sign per feature: a row's logit for its own token is then no larger
            # than the others (|e|^2 would dominate), and the body stays elementwise
            signs = jax.random.rademacher(jax.random.key(0), (self.config.hidden_size,),
                                          jnp.float32)
            hidden = jnp.take(self.embed[...], tokens, axis=0) * signs
            return (hidden if return_hidden else hidden @ self.unembedding()), None

        def unembedding(self):
            return self.embed[...].T

    return HeadOnly(HeadOnlyConfig(vocab, hidden), jax.random.key(seed))


def make_batch(graphdef, params, tokens: int, seed: int = 0) -> dict:
    """The :mod:`hindsight.batch` layout for ``ROWS`` rows of ``tokens / ROWS`` response tokens,
    with a ``teacher`` context; ``logp_old`` = the model's log-probs + N(0, 0.1)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from hindsight.batch import build_batch
    from hindsight.ops import chunked_token_logprobs

    rng = np.random.default_rng(seed)
    v, b, t = graphdef_vocab(graphdef, params), ROWS, tokens // ROWS
    targets = rng.integers(0, v, (b, t), dtype=np.int32)

    def context(prompt: int) -> dict:
        toks = np.concatenate([rng.integers(0, v, (b, prompt), dtype=np.int32), targets], 1)
        width = prompt + t
        return {"tokens": toks, "attention_mask": np.ones((b, width), np.int32),
                "positions": np.broadcast_to(np.arange(width, dtype=np.int32), (b, width)).copy(),
                "target_index": np.broadcast_to(prompt - 1 + np.arange(t, dtype=np.int32),
                                                (b, t)).copy()}

    policy, teacher = context(PROMPT), context(TEACHER_PROMPT)

    @jax.jit
    def own_logp(params, toks, index, tgt):
        model = nnx.merge(graphdef, params)
        hidden, _ = model(toks, None, return_hidden=True)
        hidden = jnp.take_along_axis(hidden, index[..., None], axis=1)
        return chunked_token_logprobs(hidden, model.unembedding(), tgt)

    logp = own_logp(params, policy["tokens"], policy["target_index"], targets)
    logp_old = np.asarray(logp + 0.1 * rng.standard_normal((b, t)), np.float32)
    return build_batch(tokens=policy["tokens"], positions=policy["positions"],
                       attention_mask=policy["attention_mask"], targets=targets,
                       target_index=policy["target_index"], mask=np.ones((b, t), np.float32),
                       logp_old=logp_old, advantages=np.array([1.0, -1.0], np.float32),
                       rewards=np.array([1.0, 0.0], np.float32), contexts={"teacher": teacher})


def graphdef_vocab(graphdef, params) -> int:
    from flax import nnx

    return nnx.merge(graphdef, params).config.vocab_size


def opsd_closed_form(model, batch, reference, config, chunk_size):
    """OPSD's ``distill`` term (its loss value) through :func:`hindsight.ops.fused_distillation_loss`
    (closed-form gradient built in the forward scan, no recomputation) instead of the LM head:
    the same value, without OPSD's metrics. For comparison only; no method calls it."""
    import jax.numpy as jnp

    from hindsight.methods.forward import context_hidden
    from hindsight.ops import fused_distillation_loss

    student, teacher = context_hidden(model, batch), context_hidden(reference, batch, "teacher",
                                                                    frozen=True)
    total, count = fused_distillation_loss(
        student.rows(), teacher.rows(), student.unembed, batch["mask"], loss="jsd",
        beta=config.beta, teacher_unembed=teacher.unembed, temperature=config.temperature,
        chunk_size=chunk_size)
    return total / jnp.maximum(count, 1.0), {}


def needs_reference(method) -> bool:
    return bool(method.config.needs_reference)


def run_child(cfg: dict) -> dict:
    """One (method, backend, tokens) configuration, in this (fresh) process."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from hindsight.methods import LMHead, get_method

    method = get_method(cfg["method"])
    graphdef, params = nnx.split(head_only_model(cfg["vocab"], cfg["hidden"]))
    batch = make_batch(graphdef, params, cfg["tokens"])
    with_ref = needs_reference(method)
    # the frozen reference (OPSD's default teacher): the "initial parameters", here a perturbed
    # copy, so that the teacher's distribution differs from the student's
    ref_params = None
    if with_ref:
        ref_params = jax.tree.map(lambda x: x * (1.0 + 0.1 * jax.random.normal(
            jax.random.key(1), x.shape, x.dtype)), params)
    head = None if cfg["backend"] == CLOSED_FORM else LMHead(backend=cfg["backend"],
                                                             chunk_size=cfg["chunk_size"])

    def loss(params, ref_params, batch):
        model = nnx.merge(graphdef, params)
        ref = None if ref_params is None else nnx.merge(graphdef,
                                                        jax.lax.stop_gradient(ref_params))
        if cfg["backend"] == CLOSED_FORM:
            return opsd_closed_form(model, batch, ref, method.config, cfg["chunk_size"])
        out = method.loss_fn(model, batch, head=head, reference=ref)
        return out.value(), out.metrics

    batch = jax.device_put(batch)
    args = jax.block_until_ready((params, ref_params, batch))
    step = jax.jit(jax.value_and_grad(loss, has_aux=True))
    t0 = time.perf_counter()
    compiled = step.lower(*args).compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    xla_temp = getattr(mem, "temp_size_in_bytes", None) if mem is not None else None
    baseline = _status_kib("VmRSS") * 1024
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    # memory: the first call, every large buffer mmapped fresh (MALLOC_MMAP_THRESHOLD_)
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    first_s = time.perf_counter() - t0
    peak = _status_kib("VmHWM") * 1024
    out_bytes = sum(x.nbytes for x in jax.tree.leaves(out))
    (val, _), grads = out
    value = float(val)
    grad_norm = float(jax.jit(lambda g: jnp.sqrt(sum(jnp.sum(jnp.square(x))
                                                     for x in jax.tree.leaves(g))))(grads))
    del out, val, grads
    # time: glibc's steady-state thresholds (what the dynamic defaults settle at), one warm-up
    # call, then the timed calls
    _mallopt(M_MMAP_THRESHOLD, STEADY_MMAP_THRESHOLD)
    _mallopt(M_TRIM_THRESHOLD, 2 * STEADY_MMAP_THRESHOLD)
    times = []
    for i in range(cfg["repeats"] + 1 if cfg["repeats"] else 0):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        if i:
            times.append(time.perf_counter() - t0)
    if cfg["backend"] != "dense":
        from hindsight.ops import default_chunk_size
        cfg = {**cfg, "block_rows": min(cfg["chunk_size"] or default_chunk_size(cfg["vocab"]),
                                        cfg["tokens"])}
    return {**cfg, "time_s": statistics.median(times) if times else None,
            "time_s_min": min(times) if times else None, "times_s": times,
            "time_s_low_mmap": first_s, "value": value,
            "grad_norm": grad_norm, "compile_s": compile_s, "reference": with_ref,
            "baseline_gib": baseline / GIB, "peak_gib": peak / GIB, "out_gib": out_bytes / GIB,
            "working_gib": (peak - baseline - out_bytes) / GIB,
            "xla_temp_gib": None if xla_temp is None else xla_temp / GIB,
            "xla_temp_bytes": xla_temp}


def _limit_child() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_CAP_BYTES, AS_CAP_BYTES))


def measure(cfg: dict) -> dict:
    """Run `cfg` in a fresh child process; returns its measurements (or the failure)."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072",
               XLA_FLAGS=os.environ.get("XLA_FLAGS", ""), JAX_PLATFORMS="cpu")
    load = os.getloadavg()
    proc = subprocess.run([sys.executable, "-m", "experiments.bench.logits_memory", "--child",
                           json.dumps(cfg)], capture_output=True, text=True, env=env,
                          preexec_fn=_limit_child)
    if proc.returncode:
        return {**cfg, "load_avg": load,
                "error": proc.stderr.strip().splitlines()[-1:] or [f"rc {proc.returncode}"]}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "load_avg": load}


def machine() -> dict:
    import jax

    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                  if line.startswith("model name")), platform.processor())
    return {"cpu": model, "cores": os.cpu_count(), "jax": jax.__version__,
            "platform": jax.default_backend(), "python": platform.python_version(),
            "mem_total_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, 1)}


def _fmt(x, nd=3):
    return "-" if x is None else f"{x:.{nd}f}"


def main(argv=None) -> dict:
    from hindsight.methods import LMHead

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="CI-sized run (small V, few tokens)")
    p.add_argument("--backend", default=LMHead().backend, choices=BACKENDS[:2],
                   help="the backend of the headline figures (default: the training default)")
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help="backends measured at the reference size (dense is always included)")
    p.add_argument("--growth-backends", default=None,
                   help="backends also measured at the larger sizes (default: --backend)")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--no-closed-form", action="store_true",
                   help=f"skip OPSD's loss through hindsight.ops.fused_distillation_loss "
                        f"(backend {CLOSED_FORM!r}, a comparison: no method calls it)")
    p.add_argument("--chunk-size", type=int, default=None,
                   help="rows per block of the chunked backends (default: the library default)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed calls at the reference size, after one warm-up call "
                        "(default: 3 with --quick, else 2)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))))
        return {}

    if args.quick:
        vocab, hidden, ref, sizes = 32_768, 256, 1_024, [1_024, 4_096]
    else:
        vocab, hidden, ref, sizes = 151_936, 1_024, 1_024, [1_024, 4_096, 8_192]
    repeats = args.repeats or (3 if args.quick else 2)
    methods = args.methods.split(",")
    backends = list(dict.fromkeys(args.backends.split(",") + [args.backend, "dense"]))
    growth = (args.growth_backends or args.backend).split(",")
    base = {"vocab": vocab, "hidden": hidden, "chunk_size": args.chunk_size}
    plan = []
    for m in methods:
        extra = [CLOSED_FORM] if m == "opsd" and not args.no_closed_form else []
        for b in backends + extra:
            plan += [{**base, "method": m, "backend": b, "tokens": n,
                      "repeats": repeats if n == ref else 0}
                     for n in (sizes if b in growth and b != "dense" else sizes[:1])]
    load_start = os.getloadavg()
    results = []
    for cfg in plan:
        r = measure(cfg)
        results.append(r)
        tag = f"{cfg['method']:5s} {cfg['backend']:11s} N={cfg['tokens']:5d}"
        load = "load " + ",".join(f"{x:.2f}" for x in r["load_avg"])
        if "error" in r:
            print(f"{tag}  FAILED: {r['error']}  ({load})", flush=True)
        else:
            print(f"{tag}  time {_fmt(r['time_s'], 2):>6s} s (first call "
                  f"{r['time_s_low_mmap']:.2f} s)  peak {r['peak_gib']:5.2f} GiB  working "
                  f"{r['working_gib']:6.3f} GiB  (XLA temp {_fmt(r['xla_temp_gib'])} GiB)  "
                  f"value {r['value']:.6g}  |g| {r['grad_norm']:.6g}  ({load})", flush=True)

    def get(m, b, n, key):
        r = next((r for r in results
                  if (r["method"], r["backend"], r["tokens"]) == (m, b, n)), None)
        return None if r is None or "error" in r else r[key]

    def ratio(a, b):
        return None if a is None or b is None or b <= 0 else a / b

    per_method = {}
    for m in methods:
        dense_w, dense_t = get(m, "dense", ref, "working_gib"), get(m, "dense", ref, "time_s")
        per_method[m] = {}
        for b in backends + [CLOSED_FORM] * any(r["method"] == m and r["backend"] == CLOSED_FORM
                                                 for r in results):
            w, t = get(m, b, ref, "working_gib"), get(m, b, ref, "time_s")
            entry = {"working_gib": w, "xla_temp_gib": get(m, b, ref, "xla_temp_gib"),
                     "xla_temp_bytes": get(m, b, ref, "xla_temp_bytes"),
                     "time_s": t, "time_s_min": get(m, b, ref, "time_s_min"),
                     "time_s_low_mmap": get(m, b, ref, "time_s_low_mmap")}
            if b != "dense":
                entry["peak_mem_ratio"] = ratio(dense_w, w)
                entry["xla_temp_ratio"] = ratio(get(m, "dense", ref, "xla_temp_gib"),
                                                get(m, b, ref, "xla_temp_gib"))
                entry["time_ratio"] = ratio(t, dense_t)
                entry["time_ratio_min"] = ratio(entry["time_s_min"],
                                                get(m, "dense", ref, "time_s_min"))
                entry["time_ratio_low_mmap"] = ratio(entry["time_s_low_mmap"],
                                                     get(m, "dense", ref, "time_s_low_mmap"))
                entry["loss_rel_diff"] = ratio(
                    None if get(m, b, ref, "value") is None or get(m, "dense", ref, "value") is None
                    else abs(get(m, b, ref, "value") - get(m, "dense", ref, "value")),
                    abs(get(m, "dense", ref, "value") or 0.0) or None)
                if b in growth:
                    entry["working_gib_by_tokens"] = {n: get(m, b, n, "working_gib") for n in sizes}
                    entry["xla_temp_gib_by_tokens"] = {n: get(m, b, n, "xla_temp_gib")
                                                       for n in sizes}
                    entry["chunked_mem_growth"] = ratio(get(m, b, sizes[-1], "working_gib"), w)
                    entry["xla_temp_growth"] = ratio(get(m, b, sizes[-1], "xla_temp_gib"),
                                                     get(m, b, ref, "xla_temp_gib"))
            per_method[m][b] = entry

    def worst(key, fn):
        vals = [per_method[m][args.backend].get(key) for m in methods]
        return None if any(v is None for v in vals) else fn(vals)

    summary = {
        "bench": "logits_memory", "quick": args.quick, "loss_fns": methods,
        "backend": args.backend, "vocab": vocab, "hidden": hidden, "reference_tokens": ref,
        "chunked_tokens": sizes, "chunk_size": args.chunk_size,
        "peak_mem_ratio": worst("peak_mem_ratio", min),
        "time_ratio": worst("time_ratio", max),
        "chunked_mem_growth": worst("chunked_mem_growth", max),
    }
    summary["goals"] = {
        "peak_mem_ratio >= 8": None if summary["peak_mem_ratio"] is None
        else summary["peak_mem_ratio"] >= GOALS["peak_mem_ratio"],
        "chunked_mem_growth <= 1.5": None if summary["chunked_mem_growth"] is None
        else summary["chunked_mem_growth"] <= GOALS["chunked_mem_growth"],
        "time_ratio <= 1.3": None if summary["time_ratio"] is None
        else summary["time_ratio"] <= GOALS["time_ratio"],
    }
    print(f"\n{'method':6s} {'backend':11s} {'working GiB':>11s} {'XLA temp':>9s} {'time s':>8s} "
          f"{'mem ratio':>9s} {'time ratio':>10s} {'growth':>7s}")
    for m in methods:
        for b in per_method[m]:
            e = per_method[m][b]
            print(f"{m:6s} {b:11s} {_fmt(e['working_gib']):>11s} {_fmt(e['xla_temp_gib']):>9s} "
                  f"{_fmt(e['time_s'], 2):>8s} {_fmt(e.get('peak_mem_ratio'), 1):>9s} "
                  f"{_fmt(e.get('time_ratio'), 2):>10s} {_fmt(e.get('chunked_mem_growth'), 2):>7s}")
    summary.update(per_method=per_method, results=results,
                   machine={**machine(), "load_avg_start": load_start,
                            "load_avg_end": os.getloadavg()})
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
