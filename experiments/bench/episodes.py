"""Episodes on SmolLM2-135M-Instruct through the real rollout layer: how fast episodes are played,
how full the engine's slots stay while environments step, and how long decoding waited for them.

GRPO groups of ``G`` episodes per prompt (``hindsight.rollout.collect`` on an episode task: one
environment worker per episode, each turn continued from the row's cache), on ScienceWorld's
CPU-sized subset by default (``--task textgame`` for the test game; ``--quick``: textgame, 1 prompt
x 2 episodes, 3 turns). One untimed warm-up rollout on other prompts compiles the shapes, then
one timed rollout. Reported: ``episodes_per_minute``, ``slot_occupancy`` (fraction of the engine's
slot-steps that decoded an active row), ``env_wait_fraction`` (the share of the rollout's
wall-clock in which decoding waited for environments: every slot idle, replies pending),
``env_seconds`` (host time handling replies), ``turns_per_episode``, the episodes' end statuses and
mean return, generated tokens.

HDL on episodes (trees whose branch points fall inside turns, continuations restoring the
environment by replay) is **not built yet**: ``hdl_token_saving`` and ``hdl_wallclock_saving`` are
null, with ``hdl_status`` saying so.

    python -m experiments.bench.episodes [--quick] [--task scienceworld|textgame|search_qa]

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


def _log(*msg) -> None:
    print(time.strftime("%H:%M:%S"), *msg, file=sys.stderr, flush=True)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized run")
    parser.add_argument("--task", help="episode task (default scienceworld; --quick textgame)")
    parser.add_argument("--prompts", type=int, help="P (default 2; --quick 1)")
    parser.add_argument("--group", type=int, help="episodes per prompt G (default 4; --quick 2)")
    parser.add_argument("--turns", type=int, help="max turns (default 8; --quick 3)")
    parser.add_argument("--turn-tokens", type=int, default=48, help="tokens per turn at most")
    parser.add_argument("--episode-tokens", type=int, default=1536)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    task_name = args.task or ("textgame" if args.quick else "scienceworld")
    p = args.prompts or (1 if args.quick else 2)
    g = args.group or (2 if args.quick else 4)
    turns = args.turns or (3 if args.quick else 8)

    import jax

    from hindsight.methods import RolloutShape, get_method
    from hindsight.models import load
    from hindsight.rollout import EpisodeOptions, RolloutConfig, collect
    from hindsight.sampling import SamplingParams
    from hindsight.tasks import get_task

    load_start = os.getloadavg()
    method = get_method("grpo").configure(rollout=RolloutShape(
        group_size=g, max_new_tokens=args.turn_tokens, temperature=0.7))
    model, tok = load("smollm2-135m-instruct")
    task = get_task(task_name)
    params = SamplingParams(temperature=0.7, min_p=0.2, max_new_tokens=args.turn_tokens)
    rollout = RolloutConfig(slots=args.slots, episodes=EpisodeOptions(
        max_turns=turns, episode_tokens=args.episode_tokens))
    warm = task.examples(split="train", count=p, seed=args.seed + 1)
    examples = task.examples(split="train", count=p, seed=args.seed)
    _log(f"{task_name}: P={p} G={g} turns<={turns} turn tokens<={args.turn_tokens} warm-up")
    collect(method, model, tok, task, warm, key=jax.random.key(args.seed + 100), sampling=params,
            rollout=rollout)
    _log("timed rollout")
    start = time.perf_counter()
    _, stats = collect(method, model, tok, task, examples, key=jax.random.key(args.seed),
                       sampling=params, rollout=rollout)
    wall = time.perf_counter() - start
    seconds = stats.seconds
    episodes = p * g
    result = {
        "bench": "episodes", "quick": args.quick, "task": task_name, "prompts": p, "group": g,
        "max_turns": turns, "turn_tokens": args.turn_tokens, "episode_tokens": args.episode_tokens,
        "slots": args.slots, "episodes": episodes, "rollout_seconds": round(seconds["total"], 2),
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
        "hdl_token_saving": None, "hdl_wallclock_saving": None,
        "hdl_status": "not built: HDL trees on episodes (branch points inside turns, environment "
                      "replay for continuations) are the remaining part of the episodes issue",
        "sample": stats.sample_texts[:1],
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "load_avg_start": load_start, "load_avg_end": os.getloadavg()},
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
