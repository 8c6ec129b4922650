"""Run storage: the run directory and every file in it through ``etils.epath``, so a local folder
and an object-store URI (``gs://bucket/run``, ``s3://...``) are the same to the loop.

A multi-host job needs one run directory every host can reach; ``os.path`` would turn
``gs://bucket/run`` into ``<cwd>/gs:/bucket/run``. Local paths are made absolute (a run's files do
not move with the working directory); URIs are kept as given. Orbax writes checkpoints to both
(TensorStore's own GCS / S3 drivers); ``epath`` reaches object stores through ``fsspec`` (``gcsfs``
for ``gs://``, installed with the package).

Object stores cannot append, so :class:`JsonlLog` appends to a local file and, on an object
store, keeps the log's lines and re-uploads the object whole at every write (TensorBoard's GCS
writer does the same). The logs are small (a few KB per step; ``samples.jsonl`` the largest).

Layout of a run directory: ``config.json``, ``metrics.jsonl``, ``updates.jsonl``,
``samples.jsonl``, ``summary.json``, ``checkpoints/``, ``prepare/<name>.json``, TensorBoard events.
"""
from __future__ import annotations

import json
import os
import re
import uuid
from typing import Any

from etils import epath

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_local(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a local file-system path (no ``scheme://``)."""
    return not _URI.match(os.fspath(path))


def run_path(path: str | os.PathLike) -> epath.Path:
    """``path`` as an :class:`epath.Path`: local paths absolute, URIs as given.

    Raises:
      ValueError for a URI scheme ``epath`` cannot open (it names the scheme and the supported ones).
    """
    text = os.fspath(path)
    if is_local(text):
        return epath.Path(os.path.abspath(text))
    try:
        return epath.Path(text)
    except (KeyError, ValueError):  # epath: KeyError for an unregistered scheme
        scheme = text.split("://", 1)[0]
        raise ValueError(f"{text!r}: no storage for the scheme {scheme}:// (epath opens local paths "
                         f"and gs://, s3://, az://, hf:// through fsspec)") from None


def read_json(path: str | os.PathLike) -> Any:
    """The JSON document at ``path``."""
    return json.loads(run_path(path).read_text(encoding="utf-8"))


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: locally through a temporary file and a
    rename (a run killed mid-write leaves the old file); an object-store upload is atomic."""
    target = run_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if is_local(target):
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    else:
        target.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike, value: Any, *, indent: int | None = None,
               sort_keys: bool = False) -> None:
    """:func:`write_text` of ``value`` as JSON."""
    write_text(path, json.dumps(value, indent=indent, sort_keys=sort_keys))


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The records of the JSON-lines file at ``path`` (a missing file has none)."""
    p = run_path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines()
            if line.strip()]


class JsonlLog:
    """An append-only JSON-lines log of step records, resumable.

    Opening keeps the records with ``step <= keep_through`` and drops the rest (a run resumed from
    the checkpoint of step ``s`` logs the steps after ``s`` again; ``keep_through=-1`` starts
    empty), so every step appears once. :attr:`kept` holds the records kept. Each :meth:`write`
    reaches storage before it returns.
    """

    def __init__(self, path: str | os.PathLike, *, keep_through: int):
        self.path = run_path(path)
        records = read_jsonl(self.path)
        self.kept = [r for r in records if r.get("step", 0) <= keep_through]
        # the object store's copy of the log (re-uploaded whole at each write); unused locally
        self._lines = [json.dumps(r) + "\n" for r in self.kept]
        if len(self.kept) != len(records) or not self.path.exists():
            write_text(self.path, "".join(self._lines))
        self._file = None
        if is_local(self.path):
            self._file, self._lines = open(self.path, "a", encoding="utf-8"), []

    def write(self, record: dict) -> None:
        """Append ``record`` (one line) and flush it to storage."""
        line = json.dumps(record) + "\n"
        if self._file is not None:
            self._file.write(line)
            self._file.flush()
        else:
            self._lines.append(line)
            write_text(self.path, "".join(self._lines))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "JsonlLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

