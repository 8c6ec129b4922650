"""Multi-stage experiments: stages run one after another, each warm-started from the previous
one's final params (BIRD: ``sft`` then ``opsd``, ``configs/bird.py``; SEED: SFT then the gate).

    summaries = run_stages([sft_config, opsd_config], "runs/bird")
    summaries = run_stages(configs.bird.get_config("tiny"), "runs/bird")   # a multi-stage config

A **multi-stage config** (what a config file returns for the launcher to run its stages) holds
two keys: ``stages``, a mapping from stage names to full experiment configs
(:mod:`hindsight.train.experiment`), and ``stage_order``, the names in the order they run (a
ConfigDict's keys are sorted, so the order is explicit). Every key of a stage is reached from the
command line as ``--config.stages.<name>.<dotted.key>``. A key beside those two, a name in
``stage_order`` that ``stages`` lacks (or the reverse, or twice) is an error naming it.

Stage ``k`` trains in ``<workdir>/stage<k>-<method>`` (a run directory of its own: config,
checkpoints, metrics) with ``model.init_from`` set to the previous stage's directory unless its
config sets one. Every stage's config is resolved and pre-flighted before the first one starts,
so a bad key of the last stage is reported before anything trains (the error names the stage:
``stages.<name>``, or ``stage <k>`` for a list). Resuming is the runs' own: a finished stage is
reported from its files, the stage in progress resumes from its last checkpoint, the later ones
start when it ends; so the same call after an interruption (or a preemption) continues where it
stopped.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

from hindsight import storage
from hindsight.train.experiment import ConfigError, ExperimentConfig, resolve
from hindsight.train.loop import preflight, run

STAGE_KEYS = ("stages", "stage_order")
"""The keys of a multi-stage config."""


def _plain(config) -> dict:
    plain = config.to_dict() if hasattr(config, "to_dict") else config
    return copy.deepcopy(dict(plain))


def is_multi_stage(config) -> bool:
    """Whether ``config`` (ConfigDict or dict) is a multi-stage config (it has ``stages``)."""
    return hasattr(config, "keys") and "stages" in config.keys()


def stage_list(config) -> list[tuple[str, dict]]:
    """The stages of a multi-stage config in ``stage_order``: ``(name, plain config)`` pairs.

    Raises:
      ConfigError naming an unknown top-level key, a ``stage_order`` name that ``stages`` lacks,
      a stage that ``stage_order`` leaves out, or a name listed twice.
    """
    plain = _plain(config)
    unknown = sorted(set(plain) - set(STAGE_KEYS))
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in a multi-stage config, which holds only "
                          f"{list(STAGE_KEYS)} (a stage's keys go under stages.<name>.)")
    stages, order = plain.get("stages"), plain.get("stage_order")
    if not isinstance(stages, Mapping) or not stages:
        raise ConfigError("`stages` must map stage names to experiment configs, got "
                          f"{stages!r}")
    if isinstance(order, str) or not isinstance(order, Sequence) or not order:
        raise ConfigError(f"`stage_order` must list the stage names in the order they run "
                          f"(stages: {sorted(stages)}), got {order!r}")
    missing = [name for name in order if name not in stages]
    if missing:
        raise ConfigError(f"stage_order names {missing}, which are not in stages "
                          f"({sorted(stages)})")
    twice = sorted({name for name in order if list(order).count(name) > 1})
    if twice:
        raise ConfigError(f"stage_order lists {twice} more than once")
    left_out = sorted(set(stages) - set(order))
    if left_out:
        raise ConfigError(f"stages {[f'stages.{n}' for n in left_out]} are not in stage_order "
                          f"{list(order)}")
    return [(name, _plain(stages[name])) for name in order]


def _labelled(configs) -> list[tuple[str, dict]]:
    """``(label, plain config)`` per stage: ``stages.<name>`` or ``stage <k>``."""
    if is_multi_stage(configs):
        return [(f"stages.{name}", c) for name, c in stage_list(configs)]
    if isinstance(configs, Mapping):
        raise ConfigError(f"a multi-stage experiment is a list of experiment configs or a "
                          f"multi-stage config (keys {list(STAGE_KEYS)}), got keys "
                          f"{sorted(configs)}")
    return [(f"stage {k}", _plain(c)) for k, c in enumerate(configs)]


def stage_dirs(configs, workdir: str) -> list[str]:
    """The run directory of each stage."""
    return [str(storage.run_path(workdir) / f"stage{k}-{c.get('method', ExperimentConfig.method)}")
            for k, (_, c) in enumerate(_labelled(configs))]


def preflight_stages(configs, workdir: str) -> list[tuple[dict, str]]:
    """Each stage's config (``model.init_from`` filled in) and directory, every one resolved and
    pre-flighted, with a stage's errors prefixed by its label."""
    labelled = _labelled(configs)
    if not labelled:
        raise ConfigError("a multi-stage experiment needs at least one stage")
    dirs = stage_dirs(configs, workdir)
    out, previous = [], None
    for k, ((label, config), path) in enumerate(zip(labelled, dirs)):
        try:
            if k and config.setdefault("model", {}).get("init_from") is None:
                config["model"]["init_from"] = dirs[k - 1]
            xp = resolve(config)
            preflight(xp)
            model = xp.config.model
            if previous is not None and model.init_from == dirs[k - 1]:
                for key in ("name", "scan_layers"):  # warm_start's check, before anything trains
                    if getattr(previous, key) != getattr(model, key):
                        raise ConfigError(f"model.{key}={getattr(model, key)!r} but the stage "
                                          f"it starts from trains model.{key}="
                                          f"{getattr(previous, key)!r}")
        except ConfigError as e:
            raise ConfigError(f"{label}: {e}") from e
        previous = model
        out.append((config, path))
    return out


def run_stages(configs, workdir: str, *, progress: bool = True) -> list[dict]:
    """Run the stages of ``configs`` (a list of experiment configs, ConfigDict or nested dicts,
    or a multi-stage config) one after another in ``workdir``; returns each stage's summary
    (:func:`hindsight.train.loop.run`). A stage that stops early (Ctrl-C, a signal) ends the
    call: the next stages would start from params that are not the stage's final ones.

    Raises:
      ConfigError, before anything trains, for a bad multi-stage layout or a stage whose config
      does not resolve or pass the pre-flight checks (the message names the stage).
    """
    summaries = []
    for config, path in preflight_stages(configs, workdir):
        summary = run(config, path, progress=progress)
        summaries.append(summary)
        if summary.get("interrupted"):
            break
    return summaries
