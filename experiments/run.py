"""The launcher: train one experiment config in a run directory (resumes when it has a checkpoint).

    python -m experiments.run --config=configs/hdl.py:smollm2-count_letters --workdir=runs/hdl
    python -m experiments.run --config=configs/grpo.py:tiny --config.train.num_steps=5 \\
        --config.train.optim.learning_rate=1e-5

``--config=<file>[:variant]`` names a ``get_config(variant)`` file (see ``configs/base.py`` for the
variants and every key); ``--config.<dotted.key>=value`` overrides one key (an unknown key is an
error). ``--workdir`` defaults to ``runs/<method>-<variant>``. Pointing a run at an existing
directory resumes it; a directory holding another config's run is refused. Ctrl-C stops at the
next step boundary with a checkpoint (see :mod:`hindsight.train.loop`).
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


def main(argv) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint phase at INFO
    from hindsight.train.experiment import ConfigError, NonFiniteError
    from hindsight.train.loop import run

    config = _CONFIG.value
    try:
        summary = run(config, _WORKDIR.value, progress=_PROGRESS.value)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except NonFiniteError as e:
        print(f"training stopped: {e}", file=sys.stderr)
        return 3
    print(json.dumps({k: summary[k] for k in ("workdir", "final_step", "interrupted",
                                               "stop_signal", "eval_reward")}))
    # SIGTERM (preemption, timeout) ends a run cleanly, checkpoint written; Ctrl-C is the user's.
    return 130 if summary["stop_signal"] == "SIGINT" else 0


if __name__ == "__main__":
    error = check_overrides(sys.argv[1:])
    if error:
        print(error, file=sys.stderr)
        sys.exit(2)
    flags.mark_flags_as_required(["config", "workdir"])
    app.run(main)
