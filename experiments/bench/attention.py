"""Attention that scales: the ``xla`` and ``chunked`` implementations (``model.attention``) side by
side, forward and backward of one attention layer, at growing sequence lengths.

    python -m experiments.bench.attention [--lengths 1024 2048 4096 8192] [--dtype float32]
                                          [--impls xla chunked] [--time-up-to 4096]

Shapes are one SmolLM2 layer's (9 query heads over 3 KV heads of 64), one row, a causal mask. For
each length and implementation: the compiled program's temporaries (``memory_analysis()``: what
XLA allocates beyond the inputs and outputs) for the loss and its gradient w.r.t. q, k and v, and,
up to ``--time-up-to`` tokens, the median seconds of three calls after a warm-up. ``chunked``
equals ``xla``'s values (every implementation's gradient is compared with ``xla``'s at the shortest
length); ``cudnn`` needs a GPU and bf16 (``experiments/bench/accelerator.sh``). The last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--impls", nargs="+", default=["xla", "chunked"],
                   help="implementations of hindsight.models.attention.ATTENTION")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--time-up-to", type=int, default=4096,
                   help="time the calls up to this length (longer: memory only)")
    p.add_argument("--heads", type=int, nargs=3, default=[9, 3, 64], metavar=("H", "KV", "HD"))
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np

    from hindsight.models import attention as att

    h, kv, hd = args.heads
    dtype = jnp.dtype(args.dtype)

    def program(impl):
        def loss(q, k, v, mask):
            return jnp.sum(att.ATTENTION[impl](q, k, v, mask, dtype=dtype).astype(jnp.float32))
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))

    def inputs(s, seed=0):
        r = np.random.default_rng(seed)
        q = jnp.asarray(r.standard_normal((1, s, h, hd)), dtype)
        k = jnp.asarray(r.standard_normal((1, s, kv, hd)), dtype)
        v = jnp.asarray(r.standard_normal((1, s, kv, hd)), dtype)
        pos = jnp.arange(s)[None]
        return q, k, v, att.causal_mask(pos, None)

    rows = []
    for s in args.lengths:
        shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs(8)]
        shapes = [jax.ShapeDtypeStruct((1, s, *x.shape[2:]), x.dtype) for x in shapes[:3]] + [
            jax.ShapeDtypeStruct((1, s, s), jnp.bool_)]
        row = {"tokens": s, "scores_bytes": h * s * s * 4}
        for impl in args.impls:
            compiled = program(impl).lower(*shapes).compile()
            row[f"{impl}_temp_bytes"] = int(compiled.memory_analysis().temp_size_in_bytes)
            if s <= args.time_up_to:
                xs = inputs(s)
                jax.block_until_ready(compiled(*xs))
                times = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    jax.block_until_ready(compiled(*xs))
                    times.append(time.perf_counter() - t0)
                row[f"{impl}_seconds"] = statistics.median(times)
        if "xla" in args.impls and "chunked" in args.impls:
            row["memory_ratio"] = row["xla_temp_bytes"] / max(row["chunked_temp_bytes"], 1)
            if "xla_seconds" in row:
                row["time_ratio"] = row["chunked_seconds"] / row["xla_seconds"]
        rows.append(row)
        print(f"{s:6d} tokens  " + "  ".join(
            f"{impl} {row[f'{impl}_temp_bytes'] / 2**20:9.1f} MiB"
            + (f" {row[f'{impl}_seconds']:.3f} s" if f"{impl}_seconds" in row else "")
            for impl in args.impls), flush=True)

    s = min(args.lengths)
    diffs = {}
    if "xla" in args.impls and s <= args.time_up_to:   # every implementation's gradient vs xla's
        xs = inputs(s, seed=1)
        _, want = program("xla")(*xs)
        for impl in args.impls:
            if impl != "xla":
                _, got = program(impl)(*xs)
                diffs[impl] = float(max(np.max(np.abs(np.asarray(a, np.float32) -
                                                      np.asarray(b, np.float32)))
                                        for a, b in zip(got, want)))
    result = {"bench": "attention", "dtype": args.dtype, "heads": args.heads,
              "query_block": att.QUERY_BLOCK, "rows": rows,
              "max_grad_diff_vs_xla": diffs,
              "load_avg": os.getloadavg()[0], "backend": jax.default_backend()}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
