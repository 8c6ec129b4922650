"""Episodes on SmolLM2-135M-Instruct (``--model``: or Qwen2.5-Coder-0.5B) through the real rollout
layer: how fast episodes are played, how full the engine's slots stay while environments step, and
how long decoding waited for them.

GRPO groups of ``G`` episodes per prompt (``hindsight.rollout.collect`` on an episode task: one
environment worker per episode, each turn continued from the row's cache), on ScienceWorld's
CPU-sized subset by default (``--task textgame`` for the test game; ``--quick``: textgame, 1 prompt
x 6 episodes (an HDL tree of 2 x (1 + 1 + 1)), 3 turns). One untimed warm-up rollout on other
prompts compiles the shapes, then one timed rollout. Reported: ``episodes_per_minute``, ``slot_occupancy`` (fraction of the engine's
slot-steps that decoded an active row), ``env_wait_fraction`` (the share of the rollout's
wall-clock in which decoding waited for environments: every slot idle, replies pending),
``env_seconds`` (host time handling replies), ``turns_per_episode``, the episodes' end statuses and
mean return, generated tokens, and ``compile_seconds`` (XLA compiles inside the timed rollout:
turn extensions, decode chunks and prefills at shapes the warm-up did not reach).

HDL vs GRPO on the same prompts, side by side in one run: the GRPO arm plays ``G`` episodes per
prompt where ``G`` is the HDL tree's size (``--counts``: ``2 x (1 + sum(counts))`` rows; default
``2,1``: 8), the HDL arm plays the trees (2 root episodes -> a reflection after each root's last turn
-> hindsight scores over the roots' action tokens -> branch points inside any turn -> continuations
from the roots' cached turns, their environments replaying the earlier actions). Both arms get an
untimed warm-up on other prompts, then one timed rollout each. ``hdl_token_saving = 1 -
tokens_HDL / tokens_GRPO`` (generated tokens: actions, and HDL's reflections; a continuation counts
only what it sampled after its branch point) and ``hdl_wallclock_saving = 1 - seconds_HDL /
seconds_GRPO`` (rollout seconds), and ``hdl_wallclock_saving_without_compiles`` with each arm's
``compile_seconds`` left out (the arms compile different amounts of what the warm-up did not
reach); the episode figures above are the GRPO arm's, HDL's are under ``hdl``.

    python -m experiments.bench.episodes [--quick] [--task scienceworld|textgame|search_qa]
        [--model qwen2.5-coder-0.5b-instruct] [--counts 2,1]

The last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import sys
import time

from experiments.bench import CompileClock


def _log(*msg) -> None:
    print(time.strftime("%H:%M:%S"), *msg, file=sys.stderr, flush=True)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized run")
    parser.add_argument("--task", help="episode task (default scienceworld; --quick textgame)")
    parser.add_argument("--prompts", type=int, help="P (default 2; --quick 1)")
    parser.add_argument("--group", type=int,
                        help="GRPO episodes per prompt G (default: the HDL tree's size)")
    parser.add_argument("--turns", type=int, help="max turns (default 8; --quick 3)")
    parser.add_argument("--turn-tokens", type=int, default=48, help="tokens per turn at most")
    parser.add_argument("--episode-tokens", type=int, default=1536)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="smollm2-135m-instruct",
                        help="smollm2-135m-instruct (temperature 0.7, min-p 0.2) or "
                             "qwen2.5-coder-0.5b-instruct (make qwen; 0.7, top-p 0.8, top-k 20)")
    parser.add_argument("--counts", default=None,
                        help="HDL continuations per branch point, best first (default 2,1; "
                             "--quick 1,1)")
    args = parser.parse_args(argv)
    task_name = args.task or ("textgame" if args.quick else "scienceworld")
    p = args.prompts or (1 if args.quick else 2)
    turns = args.turns or (3 if args.quick else 8)
    counts = tuple(int(c) for c in (args.counts or ("1,1" if args.quick else "2,1")).split(","))

    import jax

    from hindsight.methods import RolloutShape, get_method
    from hindsight.models import load
    from hindsight.rollout import EpisodeOptions, RolloutConfig, TreeOptions, collect
    from hindsight.sampling import SamplingParams
    from hindsight.tasks import get_task

    load_start = os.getloadavg()
    compiles = CompileClock()
    shape = lambda g: RolloutShape(group_size=g, max_new_tokens=args.turn_tokens, temperature=0.7)
    hdl = get_method("hdl").configure({"counts": counts, "num_points": len(counts)},
                                      rollout=shape(None))
    g = args.group or hdl.group_size
    methods = {"grpo": get_method("grpo").configure(rollout=shape(g)), "hdl": hdl}
    model, tok = load(args.model)
    task = get_task(task_name)
    truncation = dict(top_p=0.8, top_k=20) if args.model.startswith("qwen") else dict(min_p=0.2)
    params = SamplingParams(temperature=0.7, max_new_tokens=args.turn_tokens, **truncation)
    rollout = RolloutConfig(slots=args.slots, episodes=EpisodeOptions(
        max_turns=turns, episode_tokens=args.episode_tokens),
        tree=TreeOptions(reflection_max_tokens=32, feedback_max_tokens=64))
    warm = task.examples(split="train", count=p, seed=args.seed + 1)
    examples = task.examples(split="train", count=p, seed=args.seed)
    _log(f"{task_name}: P={p} G={g} (HDL tree {hdl.group_size}) turns<={turns} "
         f"turn tokens<={args.turn_tokens}")
    for name, method in methods.items():
        _log(f"warm-up {name}")
        collect(method, model, tok, task, warm, key=jax.random.key(args.seed + 100),
                sampling=params, rollout=rollout)
    stats, walls, compiled = {}, {}, {}
    for name, method in methods.items():
        _log(f"timed {name}")
        start, before = time.perf_counter(), compiles.seconds
        _, stats[name] = collect(method, model, tok, task, examples,
                                 key=jax.random.key(args.seed), sampling=params, rollout=rollout)
        walls[name], compiled[name] = time.perf_counter() - start, compiles.seconds - before
        _log(f"{name}: {sum(stats[name].generated_tokens)} tokens, "
             f"{stats[name].seconds['total']:.1f} s ({compiled[name]:.1f} s compiling)")
    result = {"bench": "episodes", "quick": args.quick, "model": args.model, "task": task_name,
              "prompts": p,
              "group": g, "max_turns": turns, "turn_tokens": args.turn_tokens,
              "episode_tokens": args.episode_tokens, "slots": args.slots,
              **_arm(stats["grpo"], walls["grpo"], p * g, compiled["grpo"])}
    h = _arm(stats["hdl"], walls["hdl"], p * hdl.group_size, compiled["hdl"])
    h.update(counts=list(counts), group=hdl.group_size,
             reflection_tokens=int(sum(stats["hdl"].reflection_tokens)),
             branch_positions=stats["hdl"].branch_positions,
             branch_sources=stats["hdl"].branch_sources,
             phase_tokens=stats["hdl"].phase_tokens)
    per_row = lambda name, n: sum(stats[name].generated_tokens) / n
    token_saving = 1.0 - per_row("hdl", p * hdl.group_size) / per_row("grpo", p * g)
    sec = lambda name, n: stats[name].seconds["total"] / n
    wall_saving = 1.0 - sec("hdl", p * hdl.group_size) / sec("grpo", p * g)
    # the arms compile different amounts of what the warm-up did not reach: the steady state's
    # saving leaves each arm's compile seconds out
    steady = lambda name, n: (stats[name].seconds["total"] - compiled[name]) / n
    steady_saving = 1.0 - steady("hdl", p * hdl.group_size) / steady("grpo", p * g)
    result.update({
        "hdl": h, "hdl_token_saving": round(token_saving, 4),
        "hdl_wallclock_saving": round(wall_saving, 4),
        "hdl_wallclock_saving_without_compiles": round(steady_saving, 4),
        "hdl_sample": [t for t in stats["hdl"].sample_texts if "[branch]" in t][:1],
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "load_avg_start": load_start, "load_avg_end": os.getloadavg()}})
    print(json.dumps(result))
    return result


def _arm(stats, wall: float, episodes: int, compiled: float) -> dict:
    """One arm's episode figures (per-row savings divide by ``episodes``: the arms' group sizes
    may differ when ``--group`` is given); ``compile_seconds``: XLA compiles inside the timed
    rollout (shapes the warm-up on other prompts did not reach)."""
    seconds = stats.seconds
    return {
        "episodes": episodes, "rollout_seconds": round(seconds["total"], 2),
        "compile_seconds": round(compiled, 2),
        "collect_wall_seconds": round(wall, 2),
        "episodes_per_minute": round(60.0 * episodes / seconds["total"], 2),
        "slot_occupancy": stats.engines["main"]["occupancy"],
        "env_wait_seconds": round(seconds.get("env_wait", 0.0), 3),
        "env_wait_fraction": round(seconds.get("env_wait", 0.0) / seconds["total"], 4),
        "env_reset_seconds": round(seconds.get("env_reset", 0.0), 3),
        "env_seconds": round(seconds.get("env", 0.0), 3),
        "turns_per_episode": stats.turns_per_episode,
        "statuses": dict(collections.Counter(stats.episode_statuses)),
        "reward_mean": stats.reward_mean,
        "generated_tokens": int(sum(stats.generated_tokens)),
        "response_length_mean": stats.response_length_mean,
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "engine": stats.engines["main"],
        "sample": stats.sample_texts[:1],
    }


if __name__ == "__main__":
    main()
