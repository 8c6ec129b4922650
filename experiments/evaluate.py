"""Evaluate a policy on its task's held-out split: greedy pass@1 and, with samples, pass@k.

    python -m experiments.evaluate --config=configs/grpo.py:qwen0.5b-humaneval
    python -m experiments.evaluate --config=configs/grpo.py:smollm2-math --config.eval.num_samples=8
    python -m experiments.evaluate --config=configs/grpo.py:qwen0.5b-math --checkpoint=runs/grpo-qwen

The config names the model, the task and its options, the split (``eval.split``), how many
problems (``eval.num_examples``, the first of the split's seeded order; a task with a fixed list of
problems, e.g. HumanEval's 164, is evaluated whole when it is larger than the split) and the
samples for pass@k (``eval.num_samples``: ``n`` samples per problem at the rollout's sampling
parameters; pass@k for every power of two ``k <= n`` by the unbiased estimator). ``--checkpoint``
evaluates the latest checkpoint of a run directory instead of the config's model (the run's own
``config.json`` then gives the model; the task and sampling come from ``--config``).

``--rescore=results.json`` verifies a run's saved greedy responses again under the task's current
verifier (no model): what a verifier or extraction change does to the same responses.

Writes ``results.json`` (the summary and, per problem, rewards and the greedy response and
feedback) and ``results.md`` under ``--output`` (default ``runs/eval-<method>-<variant>``), and
prints one JSON object last: ``pass@1``, ``pass@k`` (when sampled), ``num_problems``,
``seconds``, tokens and tokens/s.
"""
from __future__ import annotations

import json
import os
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

from experiments.cli import check_overrides

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file[:variant]",
                                          lock_config=True)
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "a run directory: evaluate its latest "
                                  "checkpoint's policy")
_OUTPUT = flags.DEFINE_string("output", None, "directory for results.json / results.md")
_PROGRESS = flags.DEFINE_bool("progress", True, "draw a progress bar")
_RESCORE = flags.DEFINE_string("rescore", None, "a results.json of this command: check its saved "
                                "greedy responses again under the task's current verifier (no "
                                "model, no decoding) and report both pass@1s")
_BLOCK = flags.DEFINE_integer("block", 0, "problems per engine run (the progress bar's step); "
                               "0: enough rows for twice the engine's slots, so the slots stay "
                               "full while a block's longest responses finish")


def _problem_id(example, index: int) -> str:
    try:
        return str(example.field("task_id"))
    except KeyError:
        return str(index)


def evaluate(config, *, checkpoint: str | None, progress: bool, block: int) -> dict:
    import jax
    import numpy as np

    from hindsight.rollout.runtime import with_eos
    from hindsight.train.evaluation import pass_at_k, sample_rewards
    from hindsight.train.experiment import resolve
    from hindsight.train.loop import load_policy, preflight, sampling_params, trained_policy
    from hindsight.train.mesh import make_mesh

    xp = resolve(config)
    exp = xp.config
    task, _ = preflight(xp)
    start = time.perf_counter()
    if checkpoint:
        model, tokenizer, step = trained_policy(checkpoint)
        source = f"{checkpoint} (step {step})"
    else:
        model, tokenizer = load_policy(exp.model, make_mesh(exp.train.mesh))
        source = exp.model.name
    load_seconds = time.perf_counter() - start
    e = exp.eval
    split = task.split_examples(e.split) if hasattr(task, "split_examples") else None
    count = min(e.num_examples, len(split)) if split is not None else e.num_examples
    examples = task.examples(split=e.split, count=count, seed=exp.seed)
    key = jax.random.key(exp.seed)
    common = dict(slots=exp.rollout.slots, chunk_steps=exp.rollout.chunk_steps,
                  verify_workers=exp.rollout.verify_workers, progress=progress)
    # a block of fewer rows than slots leaves slots idle (16 HumanEval problems in 32 slots:
    # 26-48 s per problem; 64 per block: 12 s, measured on different loads)
    rows = 2 * (exp.rollout.slots or 64)
    blocks = lambda samples: block or max(1, rows // samples)
    greedy = sample_rewards(model, tokenizer, task, examples, key=key, samples=1,
                            params=with_eos(sampling_params(exp, temperature=0.0), tokenizer),
                            desc="greedy", block=blocks(1), **common)
    out = {"pass@1": float(np.mean(greedy.rewards >= 1.0)), "num_problems": len(examples),
           "task": exp.task.name, "split": e.split, "model": source,
           "greedy_tokens": greedy.tokens, "greedy_seconds": round(greedy.seconds, 2),
           "greedy_tokens_per_s": round(greedy.tokens / greedy.seconds, 2),
           "greedy_verify_wait_seconds": round(greedy.verify_wait, 2),
           "mean_reward": float(greedy.rewards.mean()), "load_seconds": round(load_seconds, 2)}
    sampled = None
    if e.num_samples:
        params = with_eos(sampling_params(exp), tokenizer)
        sampled = sample_rewards(model, tokenizer, task, examples,
                                 key=jax.random.fold_in(key, 1), samples=e.num_samples,
                                 params=params, desc=f"sampled x{e.num_samples}",
                                 block=blocks(e.num_samples), **common)
        correct = sampled.rewards >= 1.0
        ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256) if k <= e.num_samples]
        out["pass@k"] = {str(k): pass_at_k(correct, k=k) for k in ks}
        out["sampling"] = dict(temperature=params.temperature, top_p=params.top_p,
                               top_k=params.top_k, min_p=params.min_p, n=e.num_samples)
        out.update(sampled_tokens=sampled.tokens, sampled_seconds=round(sampled.seconds, 2),
                   sampled_tokens_per_s=round(sampled.tokens / sampled.seconds, 2))
    out["max_new_tokens"] = exp.rollout.max_new_tokens
    out["seconds"] = round(time.perf_counter() - start, 2)
    out["problems"] = [
        {"id": _problem_id(ex, i), "greedy_reward": float(greedy.rewards[i, 0]),
         "greedy_feedback": greedy.feedback[i][0], "greedy_response": greedy.texts[i][0],
         **({"sampled_rewards": sampled.rewards[i].tolist()} if sampled is not None else {})}
        for i, ex in enumerate(examples)]
    return out


def rescore(config, path: str) -> dict:
    """The greedy responses saved in ``path`` (a ``results.json``) verified again by the config's
    task: what a change of the verifier or of the code extraction does to the same responses."""
    from hindsight.train.experiment import resolve
    from hindsight.train.loop import preflight

    with open(path, encoding="utf-8") as f:
        saved = json.load(f)
    xp = resolve(config)
    task, _ = preflight(xp)
    exp = xp.config
    split = task.split_examples(exp.eval.split) if hasattr(task, "split_examples") else None
    examples = split if split is not None else task.examples(
        split=exp.eval.split, count=saved["num_problems"], seed=exp.seed)
    by_id = {_problem_id(ex, i): ex for i, ex in enumerate(examples)}
    missing = [p["id"] for p in saved["problems"] if p["id"] not in by_id]
    if missing:
        raise ValueError(f"{path} holds problems {missing[:5]} that the config's task "
                         f"{saved['task']!r} does not have")
    start = time.perf_counter()
    problems = []
    for p in saved["problems"]:
        verdict = task.verify(by_id[p["id"]], p["greedy_response"])
        problems.append({**p, "saved_reward": p["greedy_reward"], "greedy_reward": verdict.reward,
                         "greedy_feedback": verdict.feedback})
    rewards = [p["greedy_reward"] for p in problems]
    return {**{k: v for k, v in saved.items() if k not in ("problems", "pass@k")},
            "pass@1": sum(r >= 1.0 for r in rewards) / len(rewards),
            "mean_reward": sum(rewards) / len(rewards),
            "saved_pass@1": saved["pass@1"], "rescored_from": path,
            "changed": [p["id"] for p in problems if p["greedy_reward"] != p["saved_reward"]],
            "rescore_seconds": round(time.perf_counter() - start, 2), "problems": problems}


def markdown(result: dict) -> str:
    lines = [f"# {result['task']} ({result['split']} split) — {result['model']}", "",
             "| metric | value |", "|---|---|",
             f"| problems | {result['num_problems']} |",
             f"| pass@1 (greedy) | {result['pass@1']:.4f} |"]
    for k, v in result.get("pass@k", {}).items():
        lines.append(f"| pass@{k} (n={result['sampling']['n']}) | {v:.4f} |")
    lines += [f"| greedy tokens/s | {result['greedy_tokens_per_s']} |",
              f"| seconds | {result['seconds']} |", "", "| problem | greedy | feedback |",
              "|---|---|---|"]
    for p in result["problems"]:
        feedback = p["greedy_feedback"].replace("|", "\\|").replace("\n", " ")[:120]
        lines.append(f"| {p['id']} | {p['greedy_reward']:g} | {feedback} |")
    return "\n".join(lines) + "\n"


def main(argv) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    logging.set_verbosity(logging.WARNING)
    from hindsight.train.experiment import ConfigError

    config = _CONFIG.value
    spec = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--config="))
    variant = spec.partition(":")[2] or "default"
    output = _OUTPUT.value or os.path.join("runs", f"eval-{config.method}-{variant}")
    try:
        if _RESCORE.value:
            result = rescore(config, _RESCORE.value)
            output = _OUTPUT.value or os.path.dirname(os.path.abspath(_RESCORE.value)) + "-rescored"
        else:
            result = evaluate(config, checkpoint=_CHECKPOINT.value, progress=_PROGRESS.value,
                              block=_BLOCK.value)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    os.makedirs(output, exist_ok=True)
    with open(os.path.join(output, "results.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(output, "results.md"), "w", encoding="utf-8") as f:
        f.write(markdown(result))
    print(json.dumps({k: v for k, v in result.items() if k != "problems"}))
    return 0


if __name__ == "__main__":
    error = check_overrides(sys.argv[1:])
    if error:
        print(error, file=sys.stderr)
        sys.exit(2)
    flags.mark_flags_as_required(["config"])
    app.run(main)
