"""Where derived files live: reassembled registry GGUFs and converted tokenizers."""
from __future__ import annotations

import os


def default_cache_dir() -> str:
    """`$HINDSIGHT_CACHE`, else `~/.cache/hindsight`."""
    return os.environ.get("HINDSIGHT_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "hindsight"))
