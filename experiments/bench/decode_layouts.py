"""Which parameter layout should the sampler decode on? One decode step (one token for every slot,
KV cache read and written) of a real architecture, compiled for 8 devices under each layout, with
the collectives XLA puts in it counted from the compiled program, and the bytes each device holds.

    python -m experiments.bench.decode_layouts [--model qwen3-8b] [--slots 64] [--max_len 2048]

Layouts (mesh ``data x fsdp x tensor``; the partition rules of :mod:`hindsight.train.mesh`):
``fsdp 8`` is the training layout (every weight split over 8 devices, rows over ``fsdp``);
``tensor 8`` splits attention heads and MLP columns (and the KV cache's heads), rows replicated;
``data 4 x tensor 2`` keeps 4 tensor-parallel replicas of 2 devices, rows over ``data``; ``data 8``
replicates the weights. Everything is abstract (``jax.ShapeDtypeStruct`` with shardings, the
config-only entries need no weights), so an 8B model is measured on this CPU machine: 8 virtual
CPU devices, compiled, never run. What it measures: the collectives' count and the bytes of
their results per decode step (an all-gather's result is the gathered array; on a ring, a device
receives ``(n - 1) / n`` of it), per-device weight and cache bytes, and the compiled program's
temporaries. What it cannot measure: time (no accelerator here); XLA's CPU backend schedules and
combines collectives like the GPU / TPU backends, but not identically.

The last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

DEVICES = 8
LAYOUTS = {"fsdp 8": (1, 8, 1), "tensor 8": (1, 1, 8), "data 4 x tensor 2": (4, 1, 2),
           "data 8": (8, 1, 1)}
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_ITEMSIZE = {"bf16": 2, "f16": 2, "f32": 4, "f64": 8, "s32": 4, "u32": 4, "s8": 1, "u8": 1,
             "pred": 1, "s64": 8, "u64": 8}
# `%name = bf16[64,4096]{1,0} all-gather(...)` or a tuple result `(bf16[..], f32[..]) all-reduce(`
_OP = re.compile(r"=\s*(\(.*?\)|\S+)\s+(" + "|".join(COLLECTIVES) + r")(-start)?\(")
_SHAPE = re.compile(r"(\w+)\[([\d,]*)\]")


def collectives(hlo: str) -> dict:
    """``{op: {"count", "bytes"}}`` of the collectives in compiled HLO text (result bytes; an
    async ``-start`` counted once, its ``-done`` not)."""
    out = {}
    for line in hlo.splitlines():
        m = _OP.search(line)
        if not m:
            continue
        nbytes = sum(_ITEMSIZE.get(t, 4) * (_elements(d)) for t, d in _SHAPE.findall(m.group(1))
                     if t in _ITEMSIZE)
        entry = out.setdefault(m.group(2), {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += nbytes
    return out


def _elements(dims: str) -> int:
    """The element count of an HLO shape's dims, e.g. "64,4096"."""
    n = 1
    for d in filter(None, dims.split(",")):
        n *= int(d)
    return n


def measure(name: str, axes, *, model_name: str, slots: int, max_len: int) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from hindsight.models import abstract_model
    from hindsight.train.dry_run import CPU_COMPILER_OPTIONS, _sharded, bytes_per_device, kv_cache
    from hindsight.train.mesh import BATCH_AXES, MeshConfig, make_mesh
    from jax.sharding import NamedSharding, PartitionSpec as P

    data, fsdp, tensor = axes
    mesh = make_mesh(MeshConfig(data=data, fsdp=fsdp, tensor=tensor))
    # the sampler decodes an unrolled model (hindsight.sampling.decode.graph_and_weights)
    model = abstract_model(model_name, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16,
                           scan_layers=False)
    model, params, p_sh = _sharded(model, mesh)
    graphdef, weights = nnx.split(model)
    cache, c_sh = kv_cache(model, mesh, slots=slots, max_len=max_len)
    cache = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), cache, c_sh)
    rows = NamedSharding(mesh, P(BATCH_AXES))
    last = jax.ShapeDtypeStruct((slots,), jnp.int32, sharding=rows)
    pos = jax.ShapeDtypeStruct((slots,), jnp.int32, sharding=rows)

    def step(weights, cache, last, pos):
        logits, cache = nnx.merge(graphdef, weights)(last[:, None], pos[:, None], cache=cache)
        return jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32), cache

    start = time.perf_counter()
    compiled = jax.jit(step, donate_argnums=(1,)).lower(weights, cache, last, pos).compile(
        compiler_options=CPU_COMPILER_OPTIONS)
    seconds = time.perf_counter() - start
    ops = collectives(compiled.as_text())
    return {"layout": name, "mesh": {"data": data, "fsdp": fsdp, "tensor": tensor},
            "weights_bytes_per_device": bytes_per_device(params, p_sh),
            "kv_cache_bytes_per_device": bytes_per_device(cache, c_sh),
            "temp_bytes_per_device": int(compiled.memory_analysis().temp_size_in_bytes),
            "collectives": ops,
            "collective_bytes_per_step": sum(v["bytes"] for v in ops.values()),
            "compile_seconds": round(seconds, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-8b", help="a registry name (config-only entries "
                    "qwen3-8b, llama-3.1-8b work offline)")
    ap.add_argument("--slots", type=int, default=64, help="rows decoded together")
    ap.add_argument("--max_len", type=int, default=2048, help="KV-cache length")
    args = ap.parse_args(argv)
    for name in ("slots", "max_len"):
        if getattr(args, name) < DEVICES or getattr(args, name) % DEVICES:
            ap.error(f"--{name} must be a positive multiple of {DEVICES}, got {getattr(args, name)}")
    flag = f"--xla_force_host_platform_device_count={DEVICES}"
    if "jax" in sys.modules:
        raise RuntimeError("run as `python -m experiments.bench.decode_layouts` (JAX must not be "
                           "imported before the device count is set)")
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    results = []
    for name, axes in LAYOUTS.items():
        r = measure(name, axes, model_name=args.model, slots=args.slots, max_len=args.max_len)
        results.append(r)
        gib = lambda n: f"{n / 2**30:7.2f} GiB"
        print(f"{name:<18} weights {gib(r['weights_bytes_per_device'])}  kv "
              f"{gib(r['kv_cache_bytes_per_device'])}  collectives/step "
              f"{r['collective_bytes_per_step'] / 2**20:10.2f} MiB  "
              + ", ".join(f"{k} x{v['count']}" for k, v in sorted(r["collectives"].items())),
              file=sys.stderr, flush=True)
    print(json.dumps({"bench": "decode_layouts", "model": args.model, "devices": DEVICES,
                      "slots": args.slots, "max_len": args.max_len, "dtype": "bfloat16",
                      "layouts": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
