"""`make demo`, the main job: GRPO and HDL on the embedded SmolLM2-135M-Instruct, a few steps each,
then a report.

    python -m experiments.demo [--steps 3] [--task count_letters] [--out runs/demo] [--fresh]

Both methods run ``configs/<method>.py:demo`` (same task, prompts per step, response cap and
engine slots; GRPO samples 16 independent rows per prompt, HDL a tree of 16) through the launcher's
loop (:func:`hindsight.train.loop.run`), each in its own run directory under ``--out``; an
existing complete run is reported as is (``--fresh`` deletes it first; compiled programs are
kept in ``<out>/xla-cache``). Writes
``<out>/report.md`` (+ ``curves.png``, ``trajectory.png``) and ``<out>/summary.json`` with
``hdl_token_saving`` / ``hdl_wallclock_saving`` (fractions of GRPO's generated tokens and rollout
seconds per group, over the steps after the first, whose rollout includes most compilation;
``hdl_wallclock_saving_without_compiles`` leaves out the compiles the later steps still meet),
``grpo_reward`` / ``hdl_reward`` (train reward per step) and the held-out evaluations. Both runs
start from the same weights, seed and held-out examples, so the evaluation before the first step
runs once, in GRPO's run (``eval.at_start`` off for HDL's), and stands for both.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import time

METHODS = ("grpo", "hdl")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="steps per method (config: 3)")
    parser.add_argument("--task", default=None, help="synthetic task (config: count_letters)")
    parser.add_argument("--out", default=os.path.join("runs", "demo"))
    parser.add_argument("--fresh", action="store_true", help="delete earlier demo runs first")
    args = parser.parse_args(argv)
    # XLA's persistent compilation cache (read when jax is first imported, below): HDL's run
    # reuses the programs GRPO's run compiled where they are the same (the evaluation's and the
    # engine's at equal shapes), and a second `make demo` skips most compiles. Entries are keyed
    # by the program, the options and the jax version. An explicit JAX_COMPILATION_CACHE_DIR wins.
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(args.out, "xla-cache"))

    from absl import logging
    logging.set_verbosity(logging.WARNING)

    from experiments.report import read_run, token_economics, write_report
    from hindsight.train.loop import run

    start = time.perf_counter()
    workdirs, starts = {}, []
    for method in METHODS:
        config = importlib.import_module(f"configs.{method}").get_config("demo")
        if args.steps is not None:
            config.train.num_steps = config.train.save_every = args.steps
        if args.task is not None:
            config.task.name = args.task
        starts.append(_start_point(config))
        if starts[-1] == starts[0] and method != METHODS[0]:
            # the same weights, seed, task and held-out examples as the first method's run: its
            # evaluation before the first step is this run's too (one evaluation, not two)
            config.eval.at_start = False
        workdirs[method] = os.path.join(args.out, method)
        if args.fresh and os.path.exists(workdirs[method]):
            shutil.rmtree(workdirs[method])
        print(f"[demo] {method}: {config.train.num_steps} steps of {config.task.name} on "
              f"{config.model.name} -> {workdirs[method]}", flush=True)
        run(config, workdirs[method])
    grpo, hdl = read_run(workdirs["grpo"]), read_run(workdirs["hdl"])
    if (starts[1] == starts[0] and grpo["evals"] and grpo["evals"][0][0] == 0
            and not (hdl["evals"] and hdl["evals"][0][0] == 0)):
        hdl["evals"] = grpo["evals"][:1] + hdl["evals"]   # the shared start (see above)
    summary = {
        **token_economics(grpo, hdl),
        "grpo_reward": [r["reward"] for r in grpo["steps"]],
        "hdl_reward": [r["reward"] for r in hdl["steps"]],
        "grpo_eval_reward": grpo["evals"], "hdl_eval_reward": hdl["evals"],
        "grpo_response_length": [r["response_length"] for r in grpo["steps"]],
        "hdl_reflection_tokens_per_group": [r.get("reflection_tokens_per_group")
                                            for r in hdl["steps"]],
        "demo_seconds": round(time.perf_counter() - start, 1),
        "loadavg_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
    }
    with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    report = write_report([workdirs[m] for m in METHODS], args.out,
                          title="make demo: GRPO vs HDL on SmolLM2-135M-Instruct",
                          headline=headline(summary, grpo, hdl))
    print(f"[demo] HDL token saving {summary['hdl_token_saving']:.3f}, rollout wall-clock saving "
          f"{summary['hdl_wallclock_saving']:.3f} (steps {summary['steps_compared']})")
    print(f"[demo] report: {report}\n[demo] summary: {os.path.join(args.out, 'summary.json')}")
    return summary


def _start_point(config) -> str:
    """What a run's evaluation before its first step depends on (``hindsight.train.loop.evaluate``):
    the model, the seed, the task, the evaluation settings and the rollout keys it samples with."""
    from hindsight.train.loop import EVAL_ROLLOUT_KEYS

    r = config.rollout
    return json.dumps({"model": config.model.to_dict(), "seed": config.seed,
                       "task": config.task.to_dict(),
                       "rollout": {k: r[k] for k in EVAL_ROLLOUT_KEYS},
                       "eval": {k: v for k, v in config.eval.to_dict().items() if k != "at_start"}},
                      sort_keys=True, default=str)


def headline(summary: dict, grpo: dict, hdl: dict) -> str:
    """The report's opening: a table of the figures and one sentence on what they mean."""
    from hindsight.train.loop import TREE_PHASES

    def seconds(run, key):
        later = run["steps"][1:] or run["steps"]
        return sum(r[key] for r in later) / max(len(later), 1)

    def held_out(run):
        evals = run["evals"]
        if not evals:
            return "not evaluated"
        after = f"{evals[-1][1]:.2f}" if len(evals) > 1 else "not evaluated"
        return f"{evals[0][1]:.2f} → {after}"

    rewards = lambda xs: ", ".join(f"{x:.2f}" for x in xs)
    token, wall = summary["hdl_token_saving"], summary["hdl_wallclock_saving"]
    rows = [
        "| | GRPO | HDL |", "|---|---|---|",
        f"| train reward per step | {rewards(summary['grpo_reward'])} | "
        f"{rewards(summary['hdl_reward'])} |",
        f"| held-out greedy reward, before → after | {held_out(grpo)} | {held_out(hdl)} |",
        f"| generated tokens per group (steps {summary['steps_compared']}) | "
        f"{summary['grpo_tokens_per_group']:,.0f} | {summary['hdl_tokens_per_group']:,.0f} "
        f"(**token saving {token:.2f}**) |",
        f"| rollout seconds per group | {summary['grpo_rollout_seconds_per_group']:.1f} | "
        f"{summary['hdl_rollout_seconds_per_group']:.1f} (**wall-clock saving {wall:.2f}**) |",
        *([f"| of which compiling (programs for new shapes), seconds per group | "
           f"{summary['grpo_compile_seconds_per_group']:.2f} | "
           f"{summary['hdl_compile_seconds_per_group']:.2f} (wall-clock saving without them "
           f"{summary['hdl_wallclock_saving_without_compiles']:.2f}) |"]
          if "hdl_compile_seconds_per_group" in summary else []),
        f"| seconds per step: rollout / update | {seconds(grpo, 'rollout_seconds'):.0f} / "
        f"{seconds(grpo, 'update_seconds'):.0f} | {seconds(hdl, 'rollout_seconds'):.0f} / "
        f"{seconds(hdl, 'update_seconds'):.0f} |"]
    phases = {k: seconds(hdl, f"rollout_seconds/{k}") for k in TREE_PHASES
              if all(f"rollout_seconds/{k}" in r for r in hdl["steps"])}
    if phases:
        rows.append("| HDL rollout seconds per step by phase | | " + " / ".join(
            f"{k} {v:.1f}" for k, v in phases.items() if v > 0 or k != "fresh") + " |")
    share = wall / token if token > 0 else float("nan")
    took = (f"took {wall:.0%} less wall-clock time, {share:.2f} of the token saving" if wall >= 0
            else f"took {-wall:.0%} more wall-clock time than GRPO's")
    extra = phases.get("scoring", 0.0) + phases.get("reflection", 0.0)
    rollout = seconds(hdl, "rollout_seconds")
    why = (": the saving shows up in time." if share >= 0.8 else
           ": less than the token saving, because a tree also does work GRPO does not: it "
           "writes a reflection per root and scores each root under its hindsight context (a "
           f"forward pass over the root), {extra:.1f} of its {rollout:.1f} s per step here, "
           "and its phases (roots, then reflections and scoring, then continuations) leave "
           "slots idle unless a step has more rows than the engine has slots.")
    sentence = (f"HDL generated {token:.0%} fewer tokens than GRPO for groups of the same size "
                f"(it reuses each root's prefix for its continuations) and its rollout {took}"
                + why + f" Machine: {summary['cpus']} CPUs, load {summary['loadavg_1m']}; "
                  f"{summary['demo_seconds'] / 60:.1f} min in all.")
    return "\n".join(rows) + "\n\n" + sentence


if __name__ == "__main__":
    main()
