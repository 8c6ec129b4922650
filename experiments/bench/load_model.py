"""Time from nothing to first logits: load a registry model (default: the embedded SmolLM2-135M-Instruct
GGUF) with `hindsight.models.load`, tokenize a chat-templated prompt and run the first (compiling)
forward pass. The GGUF tokenizer is converted once and then cached (see `load_gguf_tokenizer`);
`--cold-tokenizer` measures the conversion. Reports each phase, the total, a second (compiled) forward and the peak resident set.

Run: `python -m experiments.bench.load_model [--model NAME] [--dtype float32|bfloat16] [--unrolled]`.
The last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import tempfile
import time


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--unrolled", action="store_true", help="per-layer layout instead of a layer scan")
    parser.add_argument("--cold-tokenizer", action="store_true",
                        help="convert the GGUF tokenizer from scratch (fresh cache dir) instead of the cached one")
    parser.add_argument("--quick", action="store_true", help="accepted for CI symmetry; the run is already small")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from hindsight.models.loading.gguf import load_gguf, load_gguf_tokenizer
    from hindsight.models.registry import load, resolve
    t_import = time.perf_counter()

    dtype = jnp.dtype(args.dtype)
    path = resolve(args.model)
    if path.endswith(".gguf"):
        model = load_gguf(path, dtype=dtype, param_dtype=dtype, scan_layers=not args.unrolled)
        t_model = time.perf_counter()
        tok = load_gguf_tokenizer(path, cache_dir=tempfile.mkdtemp() if args.cold_tokenizer else None)
    else:
        model, _ = load(path, dtype=dtype, param_dtype=dtype, scan_layers=not args.unrolled, tokenizer=False)
        t_model = time.perf_counter()
        _, tok = load(path, tokenizer=True)
    t_tok = time.perf_counter()

    text = tok.apply_chat_template([{"role": "user", "content": "What is 12+35?"}], add_generation_prompt=True,
                                   tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    tokens = jnp.asarray([ids], jnp.int32)
    positions = jnp.arange(len(ids), dtype=jnp.int32)[None]
    forward = nnx.jit(lambda m, t, p: m(t, p)[0])
    logits = forward(model, tokens, positions).block_until_ready()
    t_first = time.perf_counter()
    forward(model, tokens, positions).block_until_ready()
    t_second = time.perf_counter()

    result = {
        "bench": "load_model",
        "model": args.model,
        "dtype": args.dtype,
        "scan_layers": not args.unrolled,
        "prompt_tokens": len(ids),
        "import_s": round(t_import - t0, 2),
        "model_load_s": round(t_model - t_import, 2),
        "tokenizer_s": round(t_tok - t_model, 2),
        "tokenizer_cache": "cold" if args.cold_tokenizer else "default (converted once, then cached)",
        "first_logits_s": round(t_first - t_tok, 2),
        "total_to_first_logits_s": round(t_first - t0, 2),
        "second_forward_s": round(t_second - t_first, 3),
        # CPU seconds of this process: unlike wall time, barely affected by other load on the machine.
        "process_cpu_s": round(sum(getattr(resource.getrusage(resource.RUSAGE_SELF), f)
                                   for f in ("ru_utime", "ru_stime")), 2),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
        "logits_shape": list(logits.shape),
        "top_next_token": tok.decode([int(logits[0, -1].argmax())]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "jax": jax.__version__,
                    "backend": jax.default_backend(), "load_avg_1m": round(os.getloadavg()[0], 2)},
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
