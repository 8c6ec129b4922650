"""Metrics: JSONL lines, TensorBoard event files, summary."""
import json
import os

import jax.numpy as jnp

import hindsight.train as ht


def test_jsonl_tensorboard_and_summary(tmp_path, capsys):
    log = ht.MetricsLogger(ht.MetricsConfig(logdir=str(tmp_path)), total_steps=3)
    for step in range(3):
        with ht.StepTimer() as t:
            pass
        log.write(step, {"loss": jnp.float32(1.0 / (step + 1)), "reward": step, **t.figures(100)})
    summary = log.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2]
    assert lines[1]["loss"] == 0.5 and lines[2]["reward"] == 2.0 and lines[0]["tokens_per_s"] > 0
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path))
    assert summary["steps"] == 3 and summary["reward"]["mean"] == 1.0
    assert abs(summary["loss"]["last"] - 1 / 3) < 1e-7
    assert json.loads((tmp_path / "summary.json").read_text())["reward"]["max"] == 2.0
    assert "3 steps" in capsys.readouterr().out
