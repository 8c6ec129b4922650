"""Throughput, model FLOPs utilisation and memory of a GRPO train step on SmolLM2-135M (CPU), in
float32 and bf16 compute, with a dense and a chunked LM head.

What is measured: one :class:`hindsight.train.TrainStep` (forward + backward + AdamW, one
micro-batch, single device) of the GRPO method's own loss (``get_method("grpo").loss_fn``: the
clipped-surrogate ``policy`` term plus its metrics, entropy included) on a random teacher-forced
batch in the :mod:`hindsight.batch` layout, ``B`` rows of ``S`` tokens (an ``S / 16``-token
prompt, the rest response tokens, all in the loss), with the step's LM head (``make_train_step(head=LMHead(backend=...))``)
in two forms:

* ``dense``: ``LMHead(backend="dense")``, float32 ``[B, T, V]`` logits at once;
* ``chunked``: ``LMHead(backend=--backend)`` (default: the training default,
  ``LMHead().backend``), so that ``[B, T, V]`` logits never exist;

each in float32 and in bfloat16 compute (float32 parameters, i.e. mixed precision). Layers are
rematerialised in the backward pass (``remat=True``, the usual memory setting for training; the
saved activations are then one ``[B, S, D]`` per layer, and the LM head's ``[B, T, V]`` float32
logits are the largest tensor of the step); ``--no-remat`` keeps every layer's activations.

How. Each dtype runs in a fresh child process that loads the model once, builds one train state
and two train steps (dense, chunked), compiles both gradient programs ahead of time and reads XLA's
buffer plan for each (``memory_analysis().temp_size_in_bytes``: the peak of the program's live
temporaries, i.e. the memory the step needs beyond its inputs and outputs, which both forms share).
It then alternates timed steps of the two forms (``dense, chunked, dense, ...``) so that both see
the same machine load, and reports the median step time; tokens/s counts every token of the batch
(``B * S``). The process's peak resident set is reported too (both forms together).

MFU. Each child also times this machine's best matmul in its dtype (float32 accumulation) at the
step's own MLP shape ``[B*S, D] x [D, F]`` (the fastest of 7 calls): the ceiling. Model FLOPs per
step are ``6 N B S`` (N every parameter, the tied unembedding included) plus ``2 N_layers B S``
for the rematerialised forward; ``mfu`` = model FLOPs / chunked step time / ceiling. Both
children start from the same weights and batch, so the first step's loss and gradient norm (the
dense form's, taken first) show what bf16 compute changes. The default size is the demo's update (32 rows of 160 tokens).

The last stdout line is one JSON object: ``mfu`` (for ``default_dtype``, what ``model.dtype="auto"``
resolves to on this machine), per-dtype keys (``mfu_float32``, ``mfu_bfloat16``,
``step_time_s_<dtype>``, ``first_loss_<dtype>``, ``first_grad_norm_<dtype>``, ...), ``bf16_speedup`` (float32 / bf16 step time),
``bf16_first_loss_abs_diff``, ``bf16_first_grad_norm_rel_diff``, ``backend`` (the chunked form's backend),
``chunked_time_ratio`` (chunked / dense step time) and ``chunked_peak_mem_ratio`` (chunked / dense
peak temporaries), both for float32, the same two with a ``_bfloat16`` suffix, every measurement
and the machine (with the load average before and after).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from experiments.bench import matmul_ceiling

GIB = 2.0 ** 30
IMPLS = ("dense", "chunked")


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def make_rows(vocab: int, b: int, s: int, seed: int = 0) -> dict:
    """``b`` rows of ``s`` random tokens in the :mod:`hindsight.batch` layout: an ``s // 16``-token
    prompt, the rest the response (every response token in the loss); ``logp_old`` near the
    log-prob of a uniform policy, advantages ~ N(0, 1)."""
    import numpy as np

    from hindsight.batch import build_batch

    rng = np.random.default_rng(seed)
    prompt = s // 16
    t = s - prompt
    tokens = rng.integers(0, vocab, (b, s), dtype=np.int32)
    return build_batch(
        tokens=tokens, positions=np.broadcast_to(np.arange(s, dtype=np.int32), (b, s)).copy(),
        attention_mask=np.ones((b, s), np.int32), targets=tokens[:, prompt:].copy(),
        target_index=np.broadcast_to(prompt - 1 + np.arange(t, dtype=np.int32), (b, t)).copy(),
        mask=np.ones((b, t), np.float32),
        logp_old=(-np.log(vocab) + rng.standard_normal((b, t))).astype(np.float32),
        advantages=rng.standard_normal(b).astype(np.float32))


def run_child(cfg: dict) -> dict:
    """Both LM-head forms for one dtype, in this fresh process; returns their measurements."""
    import jax
    import jax.numpy as jnp

    from flax import nnx

    import hindsight.models as models
    import hindsight.train as ht
    from hindsight.methods import LMHead, get_method

    dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[cfg["dtype"]]
    t0 = time.perf_counter()
    model, _ = models.load("smollm2-135m-instruct", dtype=dtype, param_dtype=jnp.float32,
                           remat=cfg["remat"], tokenizer=False)
    load_s = time.perf_counter() - t0
    b, s, vocab = cfg["batch"], cfg["seq"], model.config.vocab_size
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    n_embed = model.embed[...].size
    ceiling = matmul_ceiling(jnp, b * s, model.config.hidden_size,
                             model.config.intermediate_size, dtype)
    rows = make_rows(vocab, b, s)
    method = get_method("grpo")
    impls = {"dense": "dense", "chunked": cfg["backend"]}

    mesh = ht.make_mesh(ht.MeshConfig(data=1), devices=jax.devices()[:1])
    optim = ht.OptimConfig(learning_rate=1e-6)
    tx = ht.make_optimizer(optim)
    state, shardings, model_def = ht.create_train_state(model, tx, mesh=mesh)
    del model
    steps, out = {}, {}
    for impl in IMPLS:
        steps[impl] = ht.make_train_step(
            method.loss_fn, model_def=model_def, optimizer=tx, mesh=mesh, shardings=shardings,
            config=ht.StepConfig(batch_size=b), loss_kwargs={"config": method.config},
            head=LMHead(backend=impls[impl]), schedule=ht.make_schedule(optim),
            max_grad_norm=optim.max_grad_norm)
        t0 = time.perf_counter()
        compiled = steps[impl].lower(state, rows).compile()  # cached: no recompile on call
        mem = compiled.memory_analysis()
        out[impl] = {**cfg, "impl": impl, "backend": impls[impl],
                     "compile_s": time.perf_counter() - t0, "load_s": load_s,
                     "xla_temp_gib": mem.temp_size_in_bytes / GIB, "times_s": []}
        state, metrics = steps[impl](state, rows)  # warm-up (also compiles the update program)
        out[impl]["first_loss"] = float(metrics["loss"])
        out[impl]["first_grad_norm"] = float(metrics["grad_norm"])
    # Alternate the two forms so that both see the same machine load; one state flows through
    # both steps (same structure and shardings), so memory holds a single copy of it.
    for _ in range(cfg["repeats"]):
        for impl in IMPLS:
            t0 = time.perf_counter()
            state, metrics = steps[impl](state, rows)
            jax.block_until_ready(metrics)
            out[impl]["times_s"].append(time.perf_counter() - t0)
    # Model FLOPs: 6 N per token (forward 2, backward 4) over every parameter, the tied
    # unembedding included, plus the rematerialised forward of the layers (2 N_layers per token)
    flops = 6 * n_params * b * s + (2 * (n_params - n_embed) * b * s if cfg["remat"] else 0)
    for r in out.values():
        r["step_time_s"] = statistics.median(r["times_s"])
        r["tokens_per_s"] = b * s / r["step_time_s"]
        r["model_flops"] = flops
        r["matmul_ceiling_gflops"] = ceiling / 1e9
        r["mfu"] = flops / r["step_time_s"] / ceiling
    out["peak_rss_gib"] = _status_bytes("VmHWM") / GIB
    return out


def run_config(cfg: dict, *, timeout: float) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-m", "experiments.bench.train_step", "--child",
                           json.dumps(cfg)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"child {cfg} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    from hindsight.methods import LMHead
    from hindsight.models.precision import auto_compute_dtype

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI size: B=4, S=256, 2 repeats")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--seq", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--backend", default=LMHead().backend, choices=("scan", "fused"),
                        help="the chunked form's LM-head backend (default: the training default)")
    parser.add_argument("--no-remat", dest="remat", action="store_false",
                        help="keep every layer's activations instead of rematerialising them")
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(run_child(json.loads(args.child))))
        return {}
    # Logits outweigh the tied embedding's two [V, D] float32 gradient buffers only from about
    # 2 * D = 1152 tokens per step on, so even the quick size keeps 1024 tokens. The full size is
    # the demo's update: 32 rows (2 prompts x 16) of about 160 tokens.
    batch = args.batch or (4 if args.quick else 32)
    seq = args.seq or (256 if args.quick else 160)
    repeats = args.repeats or (2 if args.quick else 3)
    load_start = os.getloadavg()
    results, summary = [], {"benchmark": "train_step", "model": "smollm2-135m-instruct",
                            "loss_fn": "grpo", "backend": args.backend, "batch": batch,
                            "seq": seq, "remat": args.remat, "quick": args.quick}
    for dtype in args.dtypes.split(","):
        out = run_config({"dtype": dtype, "batch": batch, "seq": seq, "repeats": repeats,
                          "remat": args.remat, "backend": args.backend},
                         timeout=args.timeout)
        dense, chunked = out["dense"], out["chunked"]
        for r in (dense, chunked):
            print(f"{dtype:>8} {r['impl']:>7} ({r['backend']:5s}): {r['tokens_per_s']:8.1f} tok/s"
                  f"  step "
                  f"{r['step_time_s']:.3f} s  XLA peak temporaries {r['xla_temp_gib']:.3f} GiB  "
                  f"(compile {r['compile_s']:.1f} s)", flush=True)
        suffix = "" if dtype == "float32" else f"_{dtype}"
        summary[f"chunked_time_ratio{suffix}"] = chunked["step_time_s"] / dense["step_time_s"]
        summary[f"chunked_peak_mem_ratio{suffix}"] = chunked["xla_temp_gib"] / dense["xla_temp_gib"]
        summary[f"tokens_per_s_dense{suffix}"] = dense["tokens_per_s"]
        summary[f"tokens_per_s_chunked{suffix}"] = chunked["tokens_per_s"]
        summary[f"peak_mem_gib_dense{suffix}"] = dense["xla_temp_gib"]
        summary[f"peak_mem_gib_chunked{suffix}"] = chunked["xla_temp_gib"]
        summary[f"process_peak_rss_gib{suffix}"] = out["peak_rss_gib"]
        summary[f"mfu_{dtype}"] = chunked["mfu"]
        summary[f"matmul_ceiling_gflops_{dtype}"] = chunked["matmul_ceiling_gflops"]
        summary[f"step_time_s_{dtype}"] = chunked["step_time_s"]
        # the dense form's first step is the one taken from the initial state (the chunked form
        # steps after it), the same state and batch in both dtypes
        summary[f"first_loss_{dtype}"] = dense["first_loss"]
        summary[f"first_grad_norm_{dtype}"] = dense["first_grad_norm"]
        print(f"{dtype:>8} MFU {chunked['mfu']:.2f} of the measured {dtype} matmul ceiling "
              f"({chunked['matmul_ceiling_gflops']:.0f} GFLOP/s; model FLOPs "
              f"{chunked['model_flops'] / 1e12:.2f} T per step)", flush=True)
        results += [dense, chunked]
    default = auto_compute_dtype()
    summary["default_dtype"] = default   # what model.dtype="auto" resolves to here
    if default in args.dtypes.split(","):
        summary["mfu"] = summary[f"mfu_{default}"]
    if {"float32", "bfloat16"} <= set(args.dtypes.split(",")):
        # same weights, same batch, same first step: what bf16 compute changes
        summary["bf16_speedup"] = summary["step_time_s_float32"] / summary["step_time_s_bfloat16"]
        summary["bf16_first_loss_abs_diff"] = abs(summary["first_loss_bfloat16"]
                                                  - summary["first_loss_float32"])
        summary["bf16_first_grad_norm_rel_diff"] = abs(
            summary["first_grad_norm_bfloat16"] / summary["first_grad_norm_float32"] - 1)
    summary["runs"] = results
    summary["machine"] = {"platform": platform.platform(), "python": platform.python_version(),
                          "cpus": os.cpu_count(), "load_avg_start": load_start,
                          "load_avg_end": os.getloadavg()}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
