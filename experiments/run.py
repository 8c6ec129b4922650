"""The launcher: train one experiment config in a run directory (resumes when it has a checkpoint).

    python -m experiments.run --config=configs/hdl.py:smollm2-count_letters --workdir=runs/hdl
    python -m experiments.run --config=configs/grpo.py:tiny --config.train.num_steps=5 \\
        --config.train.optim.learning_rate=1e-5

``--config=<file>[:variant]`` names a ``get_config(variant)`` file (see ``configs/base.py`` for the
variants and every key); ``--config.<dotted.key>=value`` overrides one key (an unknown key is an
error). ``--workdir`` defaults to ``runs/<method>-<variant>``. Pointing a run at an existing
directory resumes it; a directory holding another config's run is refused. Ctrl-C stops at the
next step boundary with a checkpoint (see :mod:`hindsight.train.loop`).

``--dry_run`` builds the mesh and the abstract state, compiles the train step on abstract inputs
and prints per-device memory (a table, then one JSON object as the last line) without loading
weights or creating the run directory; ``--workdir`` is not needed, and the config-only entries
``model.name=qwen3-8b`` / ``llama-3.1-8b`` work offline (:mod:`hindsight.train.dry_run`)::

    python -m experiments.run --config=configs/grpo.py --config.model.name=qwen3-8b \\
        --config.train.mesh.data=1 --config.train.mesh.fsdp=8 --dry_run

A multi-stage config (one with ``stages`` and ``stage_order``, e.g. ``configs/bird.py``) runs its
stages one after another in ``<workdir>/stage<k>-<method>`` (:mod:`hindsight.train.stages`); a
stage's keys are overridden as ``--config.stages.<name>.<dotted.key>=value``, and the same
command after an interruption resumes the stage in progress::

    python -m experiments.run --config=configs/bird.py:tiny --workdir=/tmp/b \\
        --config.stages.opsd.train.num_steps=2
"""
from __future__ import annotations

import json
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from experiments.cli import check_overrides

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file[:variant]",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (required; an existing run there "
                                "resumes)")
_PROGRESS = flags.DEFINE_bool("progress", True, "draw a progress bar")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "print per-device memory (params, optimizer, "
                             "gradients, step temporaries, KV cache) from shapes alone and exit; "
                             "no weights, no run directory (hindsight.train.dry_run)")
_PROMPT_TOKENS = flags.DEFINE_integer("prompt_tokens", 256, "--dry_run: the longest prompt of "
                                      "every context, for the batch and KV-cache widths")


def dry_run_main(config) -> int:
    """``--dry_run``: the table, then one JSON object as the last stdout line."""
    from hindsight.train.dry_run import dry_run, format_table
    from hindsight.train.experiment import ConfigError

    try:
        report = dry_run(config, prompt_tokens=_PROMPT_TOKENS.value)
    except (ConfigError, ValueError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    print(format_table(report))
    print(json.dumps(report))
    return 0


def main(argv) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint phase at INFO
    if _DRY_RUN.value:
        return dry_run_main(_CONFIG.value)
    if _WORKDIR.value is None:
        raise app.UsageError("--workdir is required (except with --dry_run)")
    from hindsight.train.experiment import ConfigError, NonFiniteError
    from hindsight.train.loop import run
    from hindsight.train.stages import is_multi_stage, run_stages

    config = _CONFIG.value
    keys = ("workdir", "start_step", "final_step", "interrupted", "stop_signal", "eval_reward")
    try:
        if is_multi_stage(config):
            summaries = run_stages(config, _WORKDIR.value, progress=_PROGRESS.value)
            summary = summaries[-1]
            report = {"workdir": _WORKDIR.value,
                      "stages": [{k: s[k] for k in keys} for s in summaries]}
        else:
            summary = run(config, _WORKDIR.value, progress=_PROGRESS.value)
            report = {k: summary[k] for k in keys}
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except NonFiniteError as e:
        print(f"training stopped: {e}", file=sys.stderr)
        return 3
    print(json.dumps(report))
    # SIGTERM (preemption, timeout) ends a run cleanly, checkpoint written; Ctrl-C is the user's.
    return 130 if summary["stop_signal"] == "SIGINT" else 0


if __name__ == "__main__":
    error = check_overrides(sys.argv[1:])
    if error:
        print(error, file=sys.stderr)
        sys.exit(2)
    flags.mark_flags_as_required(["config"])  # --workdir too, unless --dry_run (main checks)
    app.run(main)
