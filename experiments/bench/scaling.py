"""The same training run on 1 and on 2 processes (``jax.distributed`` over localhost, one CPU
device each): how the rollout splits (tokens generated per process) and what each step costs,
side by side in one run.

Each process samples only its share of a step's prompts (:mod:`hindsight.train.multihost`), so
on ``N`` hosts the rollout, which dominates an RL step, is ``N`` times smaller per host; the
update is one SPMD program over the global batch. ``--quick``: ``configs/grpo.py:tiny`` (random
2-layer model) with 4 prompts per step, 3 steps; default: ``configs/grpo.py:smollm2-count_letters``
with 4 prompts of 8 rows, 64 new tokens, 3 steps. Step 1 compiles; the figures are the means of
the later steps (from each run's ``metrics.jsonl``: rollout seconds are the slowest process's).

What it can show on this machine: that the split is exact (each process generates its own share
of the tokens, the runs' train rewards and generated tokens agree) and what the per-host rollout
costs and saves when both processes share one 2-core CPU. What it cannot show: scaling across
hosts. Here the single process already uses both cores (XLA's intra-op threads) and the two
processes compete for the same two, so a speed-up near 1 is expected; on separate hosts each
process has its own machine and the rollout time divides by the process count.

    python -m experiments.bench.scaling [--quick] [--steps N] [--prompts P]

The last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time


def _log(*msg) -> None:
    print(time.strftime("%H:%M:%S"), *msg, file=sys.stderr, flush=True)


def _config(quick: bool, steps: int, prompts: int):
    method, variant = ("grpo", "tiny") if quick else ("grpo", "smollm2-count_letters")
    config = importlib.import_module(f"configs.{method}").get_config(variant)
    config.rollout.prompts_per_step = prompts
    if not quick:
        config.rollout.update(group_size=8, max_new_tokens=64)
    config.train.update(num_steps=steps, save_every=steps)
    config.eval.num_examples = 0
    return config


def child(pid: int, processes: int, port: int, workdir: str, quick: bool, steps: int,
          prompts: int) -> None:
    """One process of a run: ``loop.run`` with the ``distributed`` section set (none for one
    process); prints this process's generated tokens and wall-clock as JSON."""
    from hindsight.train.loop import run
    config = _config(quick, steps, prompts)
    if processes > 1:
        config.distributed.update(coordinator_address=f"127.0.0.1:{port}",
                                  num_processes=processes, process_id=pid)
    start = time.perf_counter()
    summary = run(config, workdir, progress=False)
    print(json.dumps({"process": pid, "generated_tokens": summary["process_generated_tokens"],
                      "wall_seconds": round(time.perf_counter() - start, 2)}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(processes: int, workdir: str, args) -> list[dict]:
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env.update(XLA_FLAGS=" ".join(flags + ["--xla_force_host_platform_device_count=1"]),
               JAX_PLATFORMS="cpu")
    port = _free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "experiments.bench.scaling", "--child", str(p), str(processes),
         str(port), workdir, "--steps", str(args.steps), "--prompts", str(args.prompts)]
        + (["--quick"] if args.quick else []), env=env, stdout=subprocess.PIPE, text=True)
        for p in range(processes)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a process of the {processes}-process run failed: "
                           f"{[p.returncode for p in procs]}")
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


def _steps(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
        return [r for r in map(json.loads, f) if "loss" in r]


def _mean(records: list[dict], key: str) -> float:
    later = records[1:] or records   # step 1 compiles
    return round(sum(r[key] for r in later) / len(later), 3)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized run (tiny model)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step (even)")
    parser.add_argument("--child", nargs=4, metavar=("PID", "N", "PORT", "WORKDIR"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        pid, n, port, workdir = args.child
        child(int(pid), int(n), int(port), workdir, args.quick, args.steps, args.prompts)
        return {}
    if args.prompts % 2:
        parser.error("--prompts must be even: each of the 2 processes samples half of them")
    result = {"benchmark": "scaling", "quick": args.quick, "steps": args.steps,
              "prompts_per_step": args.prompts, "machine": platform.machine(),
              "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="hindsight-scaling-") as tmp:
        runs = {}
        for processes in (1, 2):
            workdir = os.path.join(tmp, f"p{processes}")
            _log(f"{processes} process(es) ...")
            load = os.getloadavg()[0]
            reports = _launch(processes, workdir, args)
            steps = _steps(workdir)
            runs[processes] = {
                "generated_tokens_per_process": [r["generated_tokens"] for r in reports],
                "wall_seconds_per_process": [r["wall_seconds"] for r in reports],
                "rollout_seconds": _mean(steps, "rollout_seconds"),
                "update_seconds": _mean(steps, "update_seconds"),
                "step_seconds": _mean(steps, "step_time"),
                "reward_per_step": [round(r["reward"], 4) for r in steps],
                "generated_tokens_per_group": [r["generated_tokens_per_group"] for r in steps],
                "load_avg_at_start": round(load, 2)}
    one, two = runs[1], runs[2]
    result.update(one_process=one, two_processes=two,
                  tokens_split=[round(t / sum(two["generated_tokens_per_process"]), 3)
                                for t in two["generated_tokens_per_process"]],
                  same_rollouts=one["generated_tokens_per_group"]
                  == two["generated_tokens_per_group"],
                  rollout_speedup=round(one["rollout_seconds"] / two["rollout_seconds"], 3),
                  step_speedup=round(one["step_seconds"] / two["step_seconds"], 3))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
