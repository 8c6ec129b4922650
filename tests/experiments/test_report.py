"""The demo's report: token economics from two run directories, Markdown + PNGs written."""
import json
import os

import pytest

from experiments.report import read_run, token_economics, write_report


def _fake_run(path, method, tokens, seconds, *, prompts=2, trace=None, phases=None,
              compiles=None):
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"method": method, "model": {"name": "m"}, "task": {"name": "t"},
                   "rollout": {"prompts_per_step": prompts, "max_new_tokens": 8}}, f)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": 0, "eval_reward": 0.25}) + "\n")
        for i, (t, s) in enumerate(zip(tokens, seconds)):
            f.write(json.dumps({"step": i + 1, "loss": 0.1, "reward": 0.5, "grad_norm": 1.0,
                                "generated_tokens_per_group": t, "rollout_seconds": s,
                                "update_seconds": 1.0, "step_time": 2.0,
                                **({} if compiles is None else
                                   {"rollout_compile_seconds": compiles[i]}),
                                **{f"rollout_seconds/{k}": v for k, v in (phases or {}).items()}})
                    + "\n")
    with open(os.path.join(path, "samples.jsonl"), "w") as f:
        f.write(json.dumps({"step": len(tokens), "texts": ["a\nb"], "trace": trace}) + "\n")


def test_token_economics_and_report(tmp_path):
    trace = {"tokens": ["x", "\n", "y", "z"], "scores": [0.0, 2.0, 0.5, 1.5], "points": [1, 3],
             "reward": 0.0, "feedback": "expected z", "reflection": "r"}
    _fake_run(tmp_path / "g", "grpo", [100, 200, 400], [50.0, 4.0, 8.0])
    _fake_run(tmp_path / "h", "hdl", [90, 120, 200], [60.0, 3.0, 4.0], trace=trace)
    g, h = read_run(str(tmp_path / "g")), read_run(str(tmp_path / "h"))
    out = token_economics(g, h)  # steps 2 and 3 (step 1 holds the compiles)
    assert out["steps_compared"] == [2, 3]
    assert out["hdl_token_saving"] == pytest.approx(1 - 160 / 300)
    assert out["hdl_wallclock_saving"] == pytest.approx(1 - 3.5 / 6.0)
    assert out["grpo_rollout_seconds_per_group"] == pytest.approx(3.0)
    path = write_report([str(tmp_path / "g"), str(tmp_path / "h")], str(tmp_path / "r"),
                        extra=out)
    text = open(path, encoding="utf-8").read()
    assert "**⟦1: ⏎ (2.00)⟧**" in text and "**⟦3: z (1.50)⟧**" in text
    for png in ("curves.png", "trajectory.png"):
        assert os.path.getsize(tmp_path / "r" / png) > 1000


def test_token_economics_without_the_compiles_inside_the_rollouts(tmp_path):
    """Rollout seconds carry their compiles (`rollout_compile_seconds`): the saving without them
    sets each run's seconds less its compiles against each other; the report says both."""
    _fake_run(tmp_path / "g", "grpo", [100, 200, 400], [50.0, 4.0, 8.0], compiles=[40.0, 0.0, 0.0])
    _fake_run(tmp_path / "h", "hdl", [90, 120, 200], [60.0, 3.0, 4.0], compiles=[50.0, 1.0, 0.0])
    g, h = read_run(str(tmp_path / "g")), read_run(str(tmp_path / "h"))
    out = token_economics(g, h)
    assert out["hdl_wallclock_saving"] == pytest.approx(1 - 3.5 / 6.0)
    assert out["hdl_compile_seconds_per_group"] == pytest.approx(0.25)   # 0.5 s per step, 2 prompts
    assert out["grpo_compile_seconds_per_group"] == pytest.approx(0.0)
    assert out["hdl_wallclock_saving_without_compiles"] == pytest.approx(1 - 3.0 / 6.0)
    from experiments.demo import headline
    summary = {**out, "grpo_reward": [0.5] * 3, "hdl_reward": [0.5] * 3, "cpus": 2,
               "loadavg_1m": 1.0, "demo_seconds": 60.0}
    text = headline(summary, g, h)
    assert "wall-clock saving without them 0.50" in text
    # runs logged before the metric existed: no compile-free figure, nothing invented
    _fake_run(tmp_path / "g0", "grpo", [100, 200, 400], [50.0, 4.0, 8.0])
    assert "hdl_wallclock_saving_without_compiles" not in token_economics(
        read_run(str(tmp_path / "g0")), h)


def test_model_text_cannot_escape_into_markdown_or_html(tmp_path):
    evil = "ok` <script>alert(1)</script> **bold** [x](http://e)"
    trace = {"tokens": ["`", "<b>", "*", "_y_"], "scores": [0.0, 2.0, 0.5, 1.5], "points": [1],
             "reward": 0.0, "feedback": evil, "reflection": evil}
    _fake_run(tmp_path / "h", "hdl", [90, 120], [6.0, 3.0], trace=trace)
    with open(tmp_path / "h" / "samples.jsonl", "w") as f:
        f.write(json.dumps({"step": 2, "texts": [evil], "trace": trace}) + "\n")
    text = open(write_report([str(tmp_path / "h")], str(tmp_path / "r")), encoding="utf-8").read()
    assert "<script>" not in text and "<b>" not in text and "**bold**" not in text
    assert "&lt;script&gt;" in text and "<code>" in text
    # the trajectory's backtick and emphasis markers are literal characters
    assert "\\`" in text and "\\*" in text and "\\_y\\_" in text


def test_episode_sample_prefers_a_branched_episode():
    from experiments.report import _episode_sample
    samples = [{"step": 1, "texts": ["[observation] hall\n[turn 0] look  -> action 'look'",
                                     "a single-turn answer"]},
               {"step": 2, "texts": ["[observation] hall\n[turn 0] go [branch] east  -> action",
                                     "[observation] hall\n[turn 0] look  -> action 'look'"]}]
    assert _episode_sample(samples) == (2, samples[1]["texts"][0])
    assert _episode_sample(samples[:1]) == (1, samples[0]["texts"][0])
    assert _episode_sample([{"step": 1, "texts": ["no turns here"]}]) is None


def test_demo_report_opens_with_the_figures_and_the_continuations(tmp_path):
    from experiments.demo import headline
    trace = {"tokens": ["x", "\n", "y", "z"], "scores": [0.0, 2.0, 0.5, 1.5], "points": [1, 3],
             "reward": 0.0, "feedback": "expected z", "reflection": "r",
             "continuation_rewards": [[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0]]}
    _fake_run(tmp_path / "g", "grpo", [100, 200, 400], [50.0, 4.0, 8.0])
    _fake_run(tmp_path / "h", "hdl", [90, 120, 200], [60.0, 3.0, 4.0], trace=trace)
    g, h = read_run(str(tmp_path / "g")), read_run(str(tmp_path / "h"))
    summary = {**token_economics(g, h), "grpo_reward": [0.5] * 3, "hdl_reward": [0.5] * 3,
               "cpus": 2, "loadavg_1m": 1.0, "demo_seconds": 600.0}
    path = write_report([str(tmp_path / "g"), str(tmp_path / "h")], str(tmp_path / "r"),
                        headline=headline(summary, g, h))
    text = open(path, encoding="utf-8").read()
    first = text.split("## ")[0]   # before any section: the table and its sentence
    assert "**token saving 0.47**" in first and "**wall-clock saving 0.42**" in first
    assert "0.25 → not evaluated" in first and "0.89 of the token saving" in first
    assert "```json" not in text
    assert "* at 1 (" in text and "rewards [1.0, 0.0, 1.0, 1.0], mean 0.75" in text


def test_demo_headline_says_when_hdl_was_slower(tmp_path):
    from experiments.demo import headline
    _fake_run(tmp_path / "g", "grpo", [100, 200, 400], [50.0, 3.0, 4.0])
    _fake_run(tmp_path / "h", "hdl", [90, 120, 200], [60.0, 6.0, 8.0])
    g, h = read_run(str(tmp_path / "g")), read_run(str(tmp_path / "h"))
    summary = {**token_economics(g, h), "grpo_reward": [0.5] * 3, "hdl_reward": [0.5] * 3,
               "cpus": 2, "loadavg_1m": 1.0, "demo_seconds": 600.0}
    assert summary["hdl_wallclock_saving"] < 0
    text = headline(summary, g, h)
    assert f"took {-summary['hdl_wallclock_saving']:.0%} more wall-clock time" in text
    assert "less wall-clock" not in text


def test_demo_headline_gives_hdls_phases_and_what_its_extra_work_cost(tmp_path):
    """A saving below 0.8 of the token saving is explained with the seconds the tree's own work
    (reflections, scoring) took, from the run's ``rollout_seconds/<phase>`` metrics."""
    from experiments.demo import headline
    phases = {"roots": 1.0, "reflection": 0.5, "scoring": 1.25, "continuations": 2.25, "fresh": 0.0}
    _fake_run(tmp_path / "g", "grpo", [100, 200, 400], [50.0, 6.0, 8.0])
    _fake_run(tmp_path / "h", "hdl", [90, 120, 200], [60.0, 5.0, 5.0], phases=phases)
    g, h = read_run(str(tmp_path / "g")), read_run(str(tmp_path / "h"))
    summary = {**token_economics(g, h), "grpo_reward": [0.5] * 3, "hdl_reward": [0.5] * 3,
               "cpus": 2, "loadavg_1m": 1.0, "demo_seconds": 600.0}
    assert 0 < summary["hdl_wallclock_saving"] < 0.8 * summary["hdl_token_saving"]
    text = headline(summary, g, h)
    assert ("| HDL rollout seconds per step by phase | | roots 1.0 / reflection 0.5 / "
            "scoring 1.2 / continuations 2.2 |") in text   # no fresh rows: not listed
    assert "(a forward pass over the root), 1.8 of its 5.0 s per step here" in text


def test_demo_shares_the_start_evaluation_only_between_equal_start_points():
    """HDL's demo run skips the evaluation before its first step when GRPO's run evaluated the
    same start: same model, seed, task, evaluation and sampling keys."""
    import importlib

    from experiments.demo import _start_point
    grpo, hdl = (importlib.import_module(f"configs.{m}").get_config("demo") for m in ("grpo", "hdl"))
    assert _start_point(grpo) == _start_point(hdl)
    hdl.rollout.group_size = 8               # not read by the evaluation
    hdl.eval.at_start = False
    assert _start_point(grpo) == _start_point(hdl)
    for section, key, value in (("rollout", "max_new_tokens", 64), ("eval", "num_examples", 8),
                                ("rollout", "slots", 16)):
        other = importlib.import_module("configs.hdl").get_config("demo")
        other[section][key] = value
        assert _start_point(grpo) != _start_point(other), key
    other = importlib.import_module("configs.hdl").get_config("demo")
    other.seed = 1
    assert _start_point(grpo) != _start_point(other)
