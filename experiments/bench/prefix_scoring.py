"""HDL's hindsight scoring pass: from scratch, from the root's cached prefix, and without the
re-score under the prompt (the sampler's temperature-1 log-probs instead), side by side.

Per prompt (``count_letters`` asking for a step-by-step explanation, SmolLM2-135M-Instruct at
temperature 0.7 / min-p 0.2, T = 96): the engine samples HDL's 2 roots and keeps their cache; the
task's verifier gives each root its feedback (clipped as the tree clips it); each root's hindsight
context ``h`` is built with a reflection of ``--reflection`` tokens (the root's own first tokens:
the length matters here, not the text). HDL scores at the spec's temperature 1 while the roots
were sampled at 0.7, so ``logp_orig`` must be at temperature 1 too. Three ways, timed alternately
on the same inputs (``--reps`` calls each per tree, after one untimed call each: compiles):

* ``full``: the roots under ``h`` and re-scored under their own prompt (4 rows), every context
  prefilled (HDL before this benchmark's commit series);
* ``prefix_rescore``: the same 4 rows with ``prefix=CachedPrefix.of(roots, ...)`` (``h``
  continues a copy of the root's cache from the question on; the prompt needs nothing computed);
* ``prefix``: what HDL does now: only the 2 rows under ``h`` from the cached prefix, ``logp_orig``
  being the sampler's ``raw_logprobs`` (recorded while decoding).

Checked on every tree: the ``h`` rows of the three agree, and ``raw_logprobs`` equal the re-score.

    python -m experiments.bench.prefix_scoring [--quick]

The last line printed is one JSON object: ``seconds`` (median per tree per way), ``speedup``
(``full`` over ``prefix``), ``max_abs_logprob_diff`` and the load averages.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from experiments.bench import load_and_machine


def _log(*msg) -> None:
    print(time.strftime("%H:%M:%S"), *msg, file=sys.stderr, flush=True)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized run (2 prompts, 1 rep)")
    parser.add_argument("--prompts", type=int, help="trees (default 4; --quick 2)")
    parser.add_argument("--reps", type=int, help="timed calls per side per tree (default 3)")
    parser.add_argument("--max-new", type=int, default=96)
    parser.add_argument("--reflection", type=int, default=12)
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                        help="compute dtype (auto: bf16 on a CPU with bf16 matmul "
                             "instructions, as model.dtype=auto)")
    args = parser.parse_args(argv)
    prompts = args.prompts or (2 if args.quick else 4)
    reps = args.reps or (1 if args.quick else 3)

    import jax
    import numpy as np

    from hindsight.models import load
    from hindsight.models.precision import auto_compute_dtype
    from hindsight.rollout import TreeOptions
    from hindsight.rollout.prompts import CORRECT_FEEDBACK, hindsight_context, policy_prompt
    from hindsight.rollout.verification import Verifier
    from hindsight.sampling import CachedPrefix, SamplingParams, score_logprobs
    from hindsight.sampling.engine import Engine
    from hindsight.tasks import get_task

    load_start = os.getloadavg()
    dtype = auto_compute_dtype() if args.dtype == "auto" else args.dtype
    model, tok = load("smollm2-135m-instruct", dtype=getattr(jax.numpy, dtype))
    task = get_task("count_letters", style="explain")
    verifier = Verifier(task, tok, workers=0)
    params = SamplingParams(temperature=0.7, min_p=0.2, max_new_tokens=args.max_new,
                            stop_tokens=(tok.eos_token_id,))
    options = TreeOptions(reflection_max_tokens=args.reflection)
    ways = ("full", "prefix_rescore", "prefix")
    seconds, diffs, shapes = {w: [] for w in ways}, [], []
    for k, ex in enumerate(task.examples(split="train", count=prompts, seed=0)):
        prompt = policy_prompt(tok, ex)
        engine = Engine(model, params, slots=8, max_len=384, chunk_steps=16)
        engine.submit(prompt, num_samples=2, key=jax.random.key(k), keep_cache=True, tag="roots")
        roots = engine.run()["roots"]
        checked = []
        verifier.submit(ex, roots.tokens, roots.lengths, checked.append)
        verifier.deliver()
        # as the tree does: the verdict's feedback (clipped), reflection kept to the hindsight cap
        feedback = [options.clip_feedback(tok, CORRECT_FEEDBACK if reward >= 1.0 else text)
                    for reward, text in zip(checked[0].rewards, checked[0].feedback)]
        cap = options.hindsight_cap(args.max_new)
        h = [hindsight_context(tok, ex, feedback[r], list(roots.tokens[r, :cap]),
                               max_reflection_tokens=cap) for r in range(2)]
        resp = [roots.tokens[r, :roots.lengths[r]] for r in range(2)]
        both = h + [prompt, prompt]
        calls = {"full": (both, resp * 2, None),
                 "prefix_rescore": (both, resp * 2, CachedPrefix.of(roots, [0, 1, 0, 1])),
                 "prefix": (h, resp, CachedPrefix.of(roots, [0, 1]))}
        shapes.append({"prompt": len(prompt), "h": [len(c) for c in h],
                       "shared": [int(s) for s in calls["prefix_rescore"][2].shared(
                           [np.asarray(c) for c in both])],
                       "responses": [len(r) for r in resp]})
        call = lambda way: np.asarray(score_logprobs(
            model, calls[way][0], calls[way][1], min_response_len=args.max_new,
            temperature=1.0, prefix=calls[way][2]))
        out = {way: call(way) for way in ways}  # compiles
        width = out["prefix"].shape[1]
        raw = roots.raw_logprobs[:, :width]
        diffs.append(max(float(np.abs(out["full"][:2] - out[w][:2]).max()) for w in ways[1:]))
        diffs.append(float(np.abs(out["full"][2:] - raw).max()))
        for _ in range(reps):
            for way in ways:
                start = time.perf_counter()
                call(way)
                seconds[way].append(time.perf_counter() - start)
        _log(f"tree {k}: {shapes[-1]} " + ", ".join(f"{w} {seconds[w][-1]:.2f} s" for w in ways))
    median = {w: round(statistics.median(seconds[w]), 3) for w in ways}
    result = {
        "bench": "prefix_scoring", "quick": args.quick, "model": "smollm2-135m-instruct",
        "dtype": dtype, "trees": prompts, "reps": reps, "max_new_tokens": args.max_new,
        "reflection_tokens": args.reflection, "shapes": shapes,
        "rows_per_tree": {"full": 4, "prefix_rescore": 4, "prefix": 2},
        "seconds": median,
        "seconds_range": {w: [round(min(seconds[w]), 3), round(max(seconds[w]), 3)] for w in ways},
        "speedup": round(median["full"] / median["prefix"], 3),
        "speedup_prefix_only": round(median["full"] / median["prefix_rescore"], 3),
        "max_abs_logprob_diff": max(diffs),
        **load_and_machine(load_start),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
