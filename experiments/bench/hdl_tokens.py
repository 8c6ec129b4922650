"""HDL trees vs GRPO-16 groups on SmolLM2-135M-Instruct: generated tokens and rollout wall-clock per
group, through the real rollout layer (`hindsight.rollout.collect`).

Both arms sample P prompts of ``arithmetic`` with ``style="reasoning"`` (step-by-step answers, so
responses are long; their measured mean length is reported) at temperature 1 with the same
response cap and the same engine slot batch:

* GRPO: P x 16 independent samples (one engine request per prompt, prefilled once).
* HDL: per prompt 2 roots -> verifier -> a reflection per root (capped, counted as generated
  tokens, as the paper counts) -> hindsight scoring of the roots -> 2 branch points per root ->
  4 + 3 continuations from the cached prefix (2 x (1 + 4 + 3) = 16 rows); all prompts' stages
  share the continuous-batching engine.

Each arm first runs untimed on one other prompt (compiles), then timed on the P prompts. With
``slots`` below the 2P roots of the HDL arm, every stage keeps the slot batch full (the
throughput-bound regime a training run is in); with more slots than roots a tree is latency-bound
(roots, reflection, continuations run one after the other) and its wall-clock saving shrinks. Wall-clock per group = the arm's rollout
time (decode, verification, reflection, scoring; batch assembly excluded) / P. Savings are
fractions of the GRPO arm: ``hdl_token_saving = 1 - tokens_HDL / tokens_GRPO`` and
``hdl_wallclock_saving = 1 - seconds_HDL / seconds_GRPO``. The issue's goal: token saving in
[0.35, 0.61] and wall-clock saving >= 0.8 x token saving. The CPUs may be shared with other work:
the 1-minute load average before and after is in the JSON.

    python -m experiments.bench.hdl_tokens [--quick]

The last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time


def _log(*msg) -> None:
    print(time.strftime("%H:%M:%S"), *msg, file=sys.stderr, flush=True)


def _arm(method, model, tok, task, examples, *, key, params, rollout):
    from hindsight.rollout import collect

    start = time.perf_counter()
    _, stats = collect(method, model, tok, task, examples, key=key, sampling=params,
                       rollout=rollout)
    return stats, time.perf_counter() - start


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized run")
    parser.add_argument("--prompts", type=int, help="P (default 4; --quick 2)")
    parser.add_argument("--max-new", type=int, help="response cap (default 128; --quick 64)")
    parser.add_argument("--reflection", type=int, help="reflection cap (default 32; --quick 16)")
    parser.add_argument("--slots", type=int, help="engine slots, both arms (default 8; --quick 4)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    p = args.prompts or (2 if args.quick else 4)
    max_new = args.max_new or (64 if args.quick else 128)
    refl = args.reflection or (16 if args.quick else 32)
    slots = args.slots or (4 if args.quick else 8)

    import jax

    from hindsight.models import load
    from hindsight.rollout import RolloutConfig, TreeOptions
    from hindsight.sampling import SamplingParams
    from hindsight.tasks import get_task

    load_start = os.getloadavg()[0]
    _log(f"P={p} max_new={max_new} reflection={refl} slots={slots} load={load_start:.1f}")
    model, tok = load("smollm2-135m-instruct")
    task = get_task("arithmetic", style="reasoning")
    warm = task.examples(split="train", count=1, seed=args.seed + 1)
    examples = task.examples(split="train", count=p, seed=args.seed)
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new)
    grpo_cfg = RolloutConfig(group_size=16, slots=slots)
    hdl_cfg = RolloutConfig(group_size=None, slots=slots,
                            tree=TreeOptions(reflection_max_tokens=refl,
                                             hindsight_reflection_tokens=refl))
    arms = {"grpo": grpo_cfg, "hdl": hdl_cfg}
    for name, cfg in arms.items():
        _log(f"warm-up {name}")
        _arm(name, model, tok, task, warm, key=jax.random.key(args.seed + 100), params=params,
             rollout=cfg)
    out = {}
    for name, cfg in arms.items():
        _log(f"timed {name}")
        out[name] = _arm(name, model, tok, task, examples, key=jax.random.key(args.seed),
                         params=params, rollout=cfg)
        _log(f"{name}: {sum(out[name][0].generated_tokens)} tokens, "
             f"{out[name][0].seconds['total']:.1f} s rollout")
    (grpo, grpo_wall), (hdl, hdl_wall) = out["grpo"], out["hdl"]
    per = lambda xs: sum(xs) / len(xs)
    g_tok, h_tok = per(grpo.generated_tokens), per(hdl.generated_tokens)
    g_sec, h_sec = grpo.seconds["total"] / p, hdl.seconds["total"] / p
    token_saving = 1.0 - h_tok / g_tok
    wall_saving = 1.0 - h_sec / g_sec
    sources = [s for group in hdl.branch_sources for s in group]
    result = {
        "bench": "hdl_tokens", "quick": args.quick, "model": "smollm2-135m-instruct",
        "task": "arithmetic(style=reasoning)", "prompts": p, "group_size": 16,
        "max_new_tokens": max_new, "reflection_max_tokens": refl, "slots": slots,
        "response_len_mean_grpo": round(grpo.response_length_mean, 1),
        "grpo_tokens_per_group": round(g_tok, 1), "hdl_tokens_per_group": round(h_tok, 1),
        "hdl_reflection_tokens_per_group": round(per(hdl.reflection_tokens), 1),
        "hdl_phase_tokens": hdl.phase_tokens,
        "grpo_seconds_per_group": round(g_sec, 3), "hdl_seconds_per_group": round(h_sec, 3),
        "hdl_seconds_by_phase": {k: round(v, 2) for k, v in hdl.seconds.items()},
        "grpo_tokens_per_second": round(sum(grpo.generated_tokens) / grpo.seconds["total"], 1),
        "hdl_tokens_per_second": round(sum(hdl.generated_tokens) / hdl.seconds["total"], 1),
        "hdl_token_saving": round(token_saving, 4),
        "hdl_wallclock_saving": round(wall_saving, 4),
        "wallclock_over_token_saving": round(wall_saving / token_saving, 3)
        if token_saving > 0 else None,
        "goal_token_saving_in_0.35_0.61": 0.35 <= token_saving <= 0.61,
        "goal_wallclock_at_least_0.8x_token": wall_saving >= 0.8 * token_saving,
        "hdl_branch_sources": {s: sources.count(s) for s in sorted(set(sources))},
        "reward_mean": {"grpo": round(grpo.reward_mean, 3), "hdl": round(hdl.reward_mean, 3)},
        "collect_seconds": {"grpo": round(grpo_wall, 2), "hdl": round(hdl_wall, 2)},
        "loadavg_1m": {"start": round(load_start, 2), "end": round(os.getloadavg()[0], 2)},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "jax_backend": jax.default_backend()},
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
