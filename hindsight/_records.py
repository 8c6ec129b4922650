"""Reading record files (JSONL, Parquet) with errors that name the file and the line: shared by the
dataset tasks and the environments (plain Python plus pyarrow on demand, so the environment workers
import it without JAX)."""
from __future__ import annotations

import json


def read_records(path: str) -> list[tuple[str, object]]:
    """``(where, record)`` for every record of a JSONL (blank lines skipped) or Parquet file;
    ``where`` names the file and the line or record number for errors."""
    if path.endswith(".parquet"):
        import pyarrow
        import pyarrow.parquet

        try:
            rows = pyarrow.parquet.read_table(path).to_pylist()
        except pyarrow.ArrowException as e:
            raise ValueError(f"{path}: not a readable Parquet file ({e})") from e
        return [(f"{path}, record {n}", row) for n, row in enumerate(rows, 1)]
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append((f"{path}, line {n}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}, line {n}: not valid JSON ({e.msg})") from None
    return out
