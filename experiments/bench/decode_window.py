"""Decode steps that attend over the cache's live front vs over the whole cache, side by side.

The engine gives each decode chunk a window: the smallest power of two (at least 128) above every
position the chunk feeds (:func:`hindsight.sampling.decode.kv_window`), so attention reads those
slots of each layer's K/V instead of all ``M``. This measures what that buys at several cache
lengths: SmolLM2-135M-Instruct, a 32-token prompt fanned out to ``--rows`` rows, ``--new`` tokens
each (no stop token), in an engine of ``M`` slots, once with the engine's windows and once with
the window pinned to ``M`` (what decoding did before), alternating, ``--reps`` timed runs each
after one untimed run (compiles). A cache longer than its rows need is what a multi-turn episode
(``episode_tokens``), a long response cap or an HDL engine sized for reflections holds early on.

    python -m experiments.bench.decode_window [--rows 16] [--new 64] [--lengths 128 512 1024 2048]

The last line printed is one JSON object: per cache length, the median milliseconds per decode
step of both and their ratio (``speedup``: whole / window); the tokens of both must be equal.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from unittest import mock

from experiments.bench import load_and_machine


def _log(*msg) -> None:
    print(time.strftime("%H:%M:%S"), *msg, file=sys.stderr, flush=True)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 1024, 2048])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = parser.parse_args(argv)

    import jax
    import numpy as np

    from hindsight.models import load
    from hindsight.sampling import SamplingParams
    from hindsight.sampling import engine as engine_module

    load_start = os.getloadavg()
    model, _ = load("smollm2-135m-instruct", dtype=getattr(jax.numpy, args.dtype))
    prompt = np.arange(1000, 1032, dtype=np.int32)
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new)
    whole = mock.patch.object(engine_module, "kv_window", lambda max_pos, steps, max_len: max_len)

    def run(m, seed, pinned):
        engine = engine_module.Engine(model, params, slots=args.rows, max_len=m, chunk_steps=16)
        engine.submit(prompt, num_samples=args.rows, key=jax.random.key(seed), tag="x")
        start = time.perf_counter()
        with whole if pinned else contextlib.nullcontext():
            out = engine.run()["x"]
        seconds = time.perf_counter() - start
        return seconds / int(out.lengths.max()), np.asarray(out.tokens)

    rows = []
    for m in args.lengths:
        if m < prompt.size + args.new:
            raise ValueError(f"cache length {m} cannot hold the prompt and {args.new} new tokens")
        times = {"window": [], "whole": []}
        tokens = {}
        for rep in range(args.reps + 1):
            for name in times:
                step_s, tokens[name] = run(m, rep, name == "whole")
                if rep:
                    times[name].append(step_s)
        assert (tokens["window"] == tokens["whole"]).all(), f"M={m}: the two decodes differ"
        median = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        rows.append(dict(max_len=m, ms_per_step=median,
                         ms_per_step_range={k: [round(min(v) * 1e3, 2), round(max(v) * 1e3, 2)]
                                            for k, v in times.items()},
                         speedup=median["whole"] / median["window"]))
        _log(f"M={m}: window {median['window']:.1f} ms/step, whole {median['whole']:.1f} "
             f"({rows[-1]['speedup']:.2f}x)")
    result = {"bench": "decode_window", "model": "smollm2-135m-instruct", "dtype": args.dtype,
              "rows": args.rows, "new_tokens": args.new, "prompt_tokens": int(prompt.size),
              "reps": args.reps, "lengths": rows, **load_and_machine(load_start)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
