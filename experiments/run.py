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

import difflib
import importlib.util
import json
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

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


def _dotted_keys(config, prefix: str = "") -> list[str]:
    out = []
    for key in config.keys():
        value = config[key]
        out.append(prefix + key)
        if hasattr(value, "keys"):
            out += _dotted_keys(value, f"{prefix}{key}.")
    return out


def check_overrides(argv: list[str]) -> str | None:
    """The one-line error for the first ``--config.<key>`` that the config file does not have
    (naming the whole dotted key and the closest known one), or None. ml_collections would raise
    a long traceback naming only the key's last part."""
    spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    if spec is None:
        return None
    path, _, variant = spec.partition(":")
    if not os.path.isfile(path):
        return f"config error: no config file {path!r} (--config={spec})"
    module_spec = importlib.util.spec_from_file_location("_hindsight_config", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
        config = module.get_config(variant or None)
    except Exception as e:  # noqa: BLE001 - reported as the config error it is
        return f"config error: {path} {variant!r}: {type(e).__name__}: {e}"
    known = _dotted_keys(config)
    for arg in argv:
        if arg.startswith("--config.") and "=" in arg:
            key = arg[len("--config."):].split("=", 1)[0]
            if key not in known:
                parent = key.rpartition(".")[0]
                siblings = [k for k in known if k.rpartition(".")[0] == parent] or known
                close = difflib.get_close_matches(key, siblings, n=1, cutoff=0.0)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                return f"config error: unknown key {key!r} (--config.{key}){hint}"
    return None


if __name__ == "__main__":
    error = check_overrides(sys.argv[1:])
    if error:
        print(error, file=sys.stderr)
        sys.exit(2)
    flags.mark_flags_as_required(["config", "workdir"])
    app.run(main)
