"""What the command-line entry points share: the one-line error for an unknown ``--config.<key>``."""
from __future__ import annotations

import difflib
import importlib.util
import os


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
