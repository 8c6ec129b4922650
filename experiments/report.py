"""A Markdown + PNG report comparing runs of :func:`hindsight.train.loop.run` side by side.

    python -m experiments.report runs/demo/grpo runs/demo/hdl --out runs/demo

Reads each run directory's ``config.json``, ``metrics.jsonl`` and ``samples.jsonl``; writes
``report.md``, ``curves.png`` (reward, generated tokens per group and rollout seconds per step)
and, when a run is HDL, ``trajectory.png`` (one root's per-token hindsight score with its branch
points). :func:`token_economics` is the HDL-vs-GRPO saving the demo reports.
"""
from __future__ import annotations

import argparse
import html
import json
import os

import numpy as np

from hindsight import storage


def _shown(workdir: str, out: str) -> str:
    """A run directory as the report names it: relative to the report, or its URI."""
    return os.path.relpath(workdir, out) if storage.is_local(workdir) else workdir


def read_run(workdir: str) -> dict:
    """``{"name", "config", "steps": [metrics rows with a loss], "evals": [(step, reward)],
    "samples": [...]}`` of one run directory."""
    folder = storage.run_path(workdir)
    config = storage.read_json(folder / "config.json")
    metrics = storage.read_jsonl(folder / "metrics.jsonl")
    # A resumed run may repeat a step (the interrupted one): keep the last record of each.
    steps = {r["step"]: r for r in metrics if "loss" in r}
    evals = {r["step"]: r["eval_reward"] for r in metrics if "eval_reward" in r}
    return {"name": config["method"], "config": config,
            "steps": [steps[k] for k in sorted(steps)], "evals": sorted(evals.items()),
            "samples": storage.read_jsonl(folder / "samples.jsonl")}


def token_economics(grpo: dict, hdl: dict, *, skip_first: bool = True) -> dict:
    """HDL's saving against GRPO: ``1 - HDL / GRPO`` of the mean generated tokens per group
    (reflections included) and of the mean rollout seconds per group, over the steps both runs
    have. ``skip_first`` leaves out step 1, whose rollout includes the compiles."""
    n = min(len(grpo["steps"]), len(hdl["steps"]))
    first = 1 if skip_first and n > 1 else 0
    g, h = grpo["steps"][first:n], hdl["steps"][first:n]
    p = lambda run: run["config"]["rollout"]["prompts_per_step"]
    mean = lambda rows, k: float(np.mean([r[k] for r in rows]))
    g_tok, h_tok = mean(g, "generated_tokens_per_group"), mean(h, "generated_tokens_per_group")
    g_sec = mean(g, "rollout_seconds") / p(grpo)
    h_sec = mean(h, "rollout_seconds") / p(hdl)
    out = {"steps_compared": [r["step"] for r in h], "grpo_tokens_per_group": g_tok,
           "hdl_tokens_per_group": h_tok, "grpo_rollout_seconds_per_group": g_sec,
           "hdl_rollout_seconds_per_group": h_sec, "hdl_token_saving": 1.0 - h_tok / g_tok,
           "hdl_wallclock_saving": 1.0 - h_sec / g_sec}
    if all("rollout_compile_seconds" in r for r in g + h):
        # the compiles inside those rollouts (shapes a run meets after its first step: a tree's
        # scoring and row-move buckets, a narrower slot batch) and the saving without them, the
        # steady state a long run reaches once every shape has compiled
        g_jit = mean(g, "rollout_compile_seconds") / p(grpo)
        h_jit = mean(h, "rollout_compile_seconds") / p(hdl)
        out.update(grpo_compile_seconds_per_group=g_jit, hdl_compile_seconds_per_group=h_jit,
                   hdl_wallclock_saving_without_compiles=1.0 - (h_sec - h_jit) / (g_sec - g_jit))
    return out


def _curves(runs: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("reward", "train reward (mean over the batch)"),
              ("generated_tokens_per_group", "generated tokens per group"),
              ("rollout_seconds", "rollout seconds per step")]
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(5 * (len(panels) + 1), 3.6))
    for ax, (key, title) in zip(axes, panels):
        for run in runs:
            xs = [r["step"] for r in run["steps"]]
            ax.plot(xs, [r[key] for r in run["steps"]], marker="o", label=run["name"])
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend()
    ax = axes[-1]
    for run in runs:
        if run["evals"]:
            ax.plot(*zip(*run["evals"]), marker="s", label=run["name"])
    ax.set_title("held-out reward")
    ax.set_xlabel("step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _trajectory_png(trace: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scores = np.asarray(trace["scores"])
    fig, ax = plt.subplots(figsize=(max(8, len(scores) * 0.12), 3.2))
    ax.bar(np.arange(len(scores)), scores, color="tab:blue", width=0.9)
    for i, p in enumerate(trace["points"]):
        ax.axvline(p, color="tab:red", linestyle="--")
        ax.annotate(f"branch {i + 1}", (p, scores.max() if scores.size else 1),
                    color="tab:red", fontsize=8)
    ax.set_xlabel("response position t")
    ax.set_ylabel("|log p_hind - log p_orig|")
    ax.set_title(f"HDL hindsight score of one root (reward {trace['reward']:.2f})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


_MD_SPECIAL = set("\\`*_{}[]()#+-.!|~<>")


def _md_text(text: str) -> str:
    """Model text as literal Markdown: HTML-escaped and every Markdown character backslashed, so
    nothing in it can open code, emphasis, links or raw HTML."""
    return "".join("\\" + c if c in _MD_SPECIAL else c for c in html.escape(text, quote=False))


def _code(text: str) -> str:
    """Model text as inline code that a backtick cannot close: an HTML ``<code>`` element over
    the :func:`_md_text`-escaped ``repr`` of the text."""
    return f"<code>{_md_text(repr(text))}</code>"


def _trajectory_markdown(trace: dict) -> str:
    """The root's tokens, each with its score; branch points bold and marked."""
    pieces = []
    high = 0.5 * max(trace["scores"], default=0.0)
    for t, (tok, s) in enumerate(zip(trace["tokens"], trace["scores"])):
        text = "".join(c if c.isprintable() or c == " " else ("⏎" if c == "\n" else
                                                             f"\\x{ord(c):02x}") for c in tok)
        text = _md_text(text)
        if t in trace["points"]:
            pieces.append(f"**⟦{t}: {text} ({s:.2f})⟧**")
        else:
            pieces.append(f"{text}<sub>{s:.2f}</sub>" if s >= high > 0 else text)
    return "".join(pieces)


def _continuation_lines(trace: dict) -> list[str]:
    """Per branch point, the token resampled there and the rewards its continuations earned."""
    rewards = trace.get("continuation_rewards")
    if not rewards:
        return []
    out = ["Continuations branched from this root (the token at the point is resampled):", ""]
    for p, r in zip(trace["points"], rewards):
        token = trace["tokens"][p] if p < len(trace["tokens"]) else ""
        mean = f"{sum(r) / len(r):.2f}" if r else "n/a"
        out.append(f"* at {p} ({_code(token)}): rewards {[round(x, 2) for x in r]}, mean {mean} "
                   f"(the root's: {trace['reward']:.2f})")
    return out + [""]


def _episode_sample(samples: list[dict]) -> tuple[int, str] | None:
    """``(step, text)`` of one episode rendered turn by turn (its ``[turn k]`` lines), the latest
    that branched from its root (``[branch]``) when there is one; None for single-turn runs."""
    episodes = [(s["step"], t) for s in samples for t in s.get("texts", []) if "[turn " in t]
    branched = [e for e in episodes if "[branch]" in e[1]]
    return (branched or episodes or [None])[-1]


def _table(runs: list[dict]) -> str:
    keys = ("reward", "loss", "grad_norm", "generated_tokens_per_group", "rollout_seconds",
            "rollout_compile_seconds", "update_seconds", "step_time")
    out = ["| method | step | " + " | ".join(keys) + " |",
           "|---|---|" + "---|" * len(keys)]
    for run in runs:
        for r in run["steps"]:
            out.append(f"| {run['name']} | {r['step']} | " + " | ".join(
                f"{r[k]:.4g}" if k in r else "" for k in keys) + " |")
    return "\n".join(out)


def write_report(workdirs: list[str], out: str, *, title: str = "hindsight run report",
                 extra: dict | None = None, headline: str | None = None) -> str:
    """Write ``report.md`` (+ PNGs) under ``out`` for ``workdirs``; returns the report's path.
    ``headline``: Markdown placed first (the demo's table of figures); ``extra``: a dict shown
    as JSON under "Summary"."""
    os.makedirs(out, exist_ok=True)
    runs = [read_run(w) for w in workdirs]
    _curves(runs, os.path.join(out, "curves.png"))
    lines = [f"# {title}", ""]
    if headline:
        lines += [headline, ""]
    for run in runs:
        c = run["config"]
        lines.append(f"* **{run['name']}** (`{_shown(workdirs[runs.index(run)], out)}`):"
                     f" model `{c['model']['name']}`, task `{c['task']['name']}`, "
                     f"{c['rollout']['prompts_per_step']} prompts/step, max "
                     f"{c['rollout']['max_new_tokens']} new tokens, {len(run['steps'])} steps; "
                     f"held-out reward {[(s, round(v, 3)) for s, v in run['evals']]}")
    if extra:
        lines += ["", "## Summary", "", "```json", json.dumps(extra, indent=2), "```"]
    lines += ["", "## Curves", "", "![curves](curves.png)", "", "## Per step", "", _table(runs)]
    for run in runs:
        traces = [s for s in run["samples"] if s.get("trace")]
        if traces:
            trace = traces[-1]["trace"]
            _trajectory_png(trace, os.path.join(out, "trajectory.png"))
            lines += ["", f"## One HDL root (step {traces[-1]['step']}) with its hindsight "
                      f"scores", "",
                      f"Reward {trace['reward']:.2f}; feedback: {_code(trace['feedback'])}.", "",
                      f"Reflection: {_code(trace['reflection'])}", "",
                      f"Branch points (best first): {trace['points']}. Tokens scoring at least half "
                      f"the maximum carry their score as a subscript; branch points are bold.", "",
                      *_continuation_lines(trace),
                      _trajectory_markdown(trace), "", "![trajectory](trajectory.png)"]
        episode = _episode_sample(run["samples"])
        if episode is not None:
            step, text = episode
            lines += ["", f"## {run['name']}: one episode, turn by turn (step {step})", "",
                      "Observations come from the environment (loss mask 0), each `[turn k]` is "
                      "the policy's action turn" + (" and `[branch]` marks where this "
                      "continuation left its root's history" if "[branch]" in text else "") + ".",
                      "", "```text", text, "```"]
        texts = run["samples"][-1]["texts"] if run["samples"] else []
        if texts:
            lines += ["", f"## {run['name']}: sample responses (last step)", ""]
            lines += [f"{i + 1}. {_code(t[:300])}" for i, t in enumerate(texts)]
    path = os.path.join(out, "report.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdirs", nargs="+")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    print(write_report(args.workdirs, args.out))


if __name__ == "__main__":
    main()
