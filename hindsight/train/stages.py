"""Multi-stage experiments: stages run one after another, each warm-started from the previous
one's final params (BIRD: ``sft`` then ``opsd``; SEED: SFT then the gate).

    summaries = run_stages([sft_config, opsd_config], "runs/bird")

Stage ``k`` trains in ``<workdir>/stage<k>-<method>`` (a run directory of its own: config,
checkpoints, metrics) with ``model.init_from`` set to the previous stage's directory unless its
config sets one. Resuming is the runs' own: a finished stage is reported from its files, the
stage in progress resumes from its last checkpoint, the later ones start when it ends; so the
same call after an interruption (or a preemption) continues where it stopped.
"""
from __future__ import annotations

import copy
import os
from collections.abc import Sequence

from hindsight.train.experiment import ConfigError
from hindsight.train.loop import run


def stage_dirs(configs: Sequence, workdir: str) -> list[str]:
    """The run directory of each stage."""
    return [os.path.join(workdir, f"stage{k}-{_get(c, 'method')}") for k, c in enumerate(configs)]


def run_stages(configs: Sequence, workdir: str, *, progress: bool = True) -> list[dict]:
    """Run ``configs`` (experiment configs, ConfigDict or nested dicts) as consecutive stages in
    ``workdir``; returns each stage's summary (:func:`hindsight.train.loop.run`). A stage that
    stops early (Ctrl-C, a signal) ends the call: the next stages would start from params that
    are not the stage's final ones."""
    if not configs:
        raise ConfigError("a multi-stage experiment needs at least one stage")
    dirs = stage_dirs(configs, workdir)
    summaries = []
    for k, (config, path) in enumerate(zip(configs, dirs)):
        config = _plain_copy(config)
        if k and config.setdefault("model", {}).get("init_from") is None:
            config["model"]["init_from"] = dirs[k - 1]
        summary = run(config, path, progress=progress)
        summaries.append(summary)
        if summary.get("interrupted"):
            break
    return summaries


def _plain_copy(config) -> dict:
    plain = config.to_dict() if hasattr(config, "to_dict") else config
    return copy.deepcopy(dict(plain))


def _get(config, key):
    return config[key] if isinstance(config, dict) else getattr(config, key)
