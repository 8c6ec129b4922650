"""Metrics: one JSONL line per step, TensorBoard scalars (tensorboardX), a tqdm bar and a summary;
plus one line per optimizer update (``updates.jsonl``, TensorBoard ``update/*``) when a step makes
several (PPO epochs and mini-batches).

Only the primary process (``jax.process_index() == 0``) writes files and draws the bar; the
others get no-op writers, so the same loop code runs on every host.
"""
from __future__ import annotations

import dataclasses
import math
import time

import jax
import numpy as np
from tqdm.auto import tqdm

from hindsight import storage

# Figures shown on the progress bar when a step reports them, in this order.
BAR_KEYS = ("loss", "reward", "tokens_per_s", "step_time")


@dataclasses.dataclass(frozen=True)
class MetricsConfig:
    """``logdir`` (None = no files); ``jsonl``/``tensorboard`` toggle the two writers;
    ``progress`` draws a tqdm bar."""
    logdir: str | None = None
    jsonl: bool = True
    tensorboard: bool = True
    progress: bool = True


def _history(records: list[dict]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in records:
        for k, v in r.items():
            if k != "step" and isinstance(v, (int, float)):
                out.setdefault(k, []).append(float(v))
    return out


def summarize(history: dict[str, list[float]], wall_s: float) -> dict:
    """Per metric: last, mean, min, max (over finite values); plus steps and wall time."""
    out = {"steps": max((len(v) for v in history.values()), default=0), "wall_s": wall_s}
    for k, vals in history.items():
        finite = [v for v in vals if math.isfinite(v)]
        out[k] = {"last": vals[-1], "mean": float(np.mean(finite)) if finite else math.nan,
                  "min": min(finite, default=math.nan), "max": max(finite, default=math.nan)}
    return out


def to_floats(metrics: dict) -> dict[str, float]:
    """Device scalars -> Python floats (one host transfer for the whole dict)."""
    host = jax.device_get(metrics)
    return {k: float(np.asarray(v)) for k, v in host.items()}


class MetricsLogger:
    """Write per-step metrics and keep their history for :meth:`summary`.

    Usage: ``log = MetricsLogger(cfg, total_steps=N)``; each step ``log.write(step, metrics)``;
    at the end ``log.close()`` returns the summary dict. With ``initial_step > 0`` (a resumed run)
    the JSONL files keep their records up to that step (later ones are dropped, they will be logged
    again) and the summary covers the whole run.
    """

    def __init__(self, config: MetricsConfig, *, total_steps: int | None = None,
                 initial_step: int = 0):
        self.config = config
        self.history: dict[str, list[float]] = {}
        primary = jax.process_index() == 0
        self._jsonl = self._updates = self._tb = self._bar = None
        if primary and config.logdir is not None:
            logdir = storage.run_path(config.logdir)
            logdir.mkdir(parents=True, exist_ok=True)
            if config.jsonl:
                # A fresh start (step 0) keeps nothing: no record of an earlier attempt survives.
                limit = initial_step if initial_step > 0 else -1
                self._jsonl = storage.JsonlLog(logdir / "metrics.jsonl", keep_through=limit)
                self._updates = storage.JsonlLog(logdir / "updates.jsonl", keep_through=limit)
                self.history = _history(self._jsonl.kept)
            if config.tensorboard:
                # Imported here: only runs that write event files need the dependency.
                from tensorboardX import SummaryWriter
                self._tb = SummaryWriter(logdir=config.logdir)
        if primary and config.progress:
            self._bar = tqdm(total=total_steps, initial=initial_step, unit="step",
                             dynamic_ncols=True)
        self._start = time.perf_counter()

    def write(self, step: int, metrics: dict, *, advance: bool = True) -> dict[str, float]:
        """Record one step's metrics (device or Python scalars); returns them as floats.
        ``advance=False`` records without moving the progress bar (e.g. an evaluation before
        the first step)."""
        values = to_floats(metrics)
        for k, v in values.items():
            self.history.setdefault(k, []).append(v)
        if self._jsonl is not None:
            self._jsonl.write({"step": int(step), **values})
        if self._tb is not None:
            for k, v in values.items():
                self._tb.add_scalar(k, v, global_step=int(step))
        if self._bar is not None:
            shown = {k: f"{values[k]:.4g}" for k in BAR_KEYS if k in values}
            self._bar.set_postfix(shown, refresh=False)
            self._bar.update(1 if advance else 0)
        return values

    def write_update(self, step: int, update: int, metrics: dict, **where) -> dict[str, float]:
        """Record one optimizer update's metrics: a line ``{"step", "update", **where, ...}`` in
        ``updates.jsonl`` and TensorBoard scalars ``update/<name>`` at the update index. Not in
        the summary (the step's record holds their means)."""
        values = to_floats(metrics)
        if self._updates is not None:
            self._updates.write({"step": int(step), "update": int(update), **where, **values})
        if self._tb is not None:
            for k, v in values.items():
                self._tb.add_scalar(f"update/{k}", v, global_step=int(update))
        return values

    def summary(self) -> dict:
        """:func:`summarize` of the run's history (this invocation's wall time)."""
        return summarize(self.history, time.perf_counter() - self._start)

    @staticmethod
    def read_summary(logdir: str, *, up_to: int) -> dict:
        """The summary of a finished run from its ``metrics.jsonl`` (records up to ``up_to``),
        without writing anything."""
        records = storage.read_jsonl(storage.run_path(logdir) / "metrics.jsonl")
        return summarize(_history([r for r in records if r.get("step", 0) <= up_to]), 0.0)

    def close(self) -> dict:
        """Flush and close the writers; print and return :meth:`summary` (primary process)."""
        summary = self.summary()
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        if self._updates is not None:
            self._updates.close()
        if self._jsonl is not None:
            self._jsonl.close()
            storage.write_json(storage.run_path(self.config.logdir) / "summary.json", summary,
                               indent=2)
        if jax.process_index() == 0 and self.config.progress:
            print(format_summary(summary))
        return summary


def format_summary(summary: dict) -> str:
    """A short human-readable table of :meth:`MetricsLogger.summary`."""
    lines = [f"{summary['steps']} steps in {summary['wall_s']:.1f} s"]
    for k, v in summary.items():
        if isinstance(v, dict):
            lines.append(f"  {k:<20} last {v['last']:.5g}  mean {v['mean']:.5g}  "
                         f"min {v['min']:.5g}  max {v['max']:.5g}")
    return "\n".join(lines)


class StepTimer:
    """Wall time and tokens/s of a step: ``with timer: ...``, then ``timer.figures(tokens)``."""

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self._t0
        return False

    def figures(self, tokens: int) -> dict[str, float]:
        return {"step_time": self.seconds, "tokens_per_s": tokens / max(self.seconds, 1e-9)}
