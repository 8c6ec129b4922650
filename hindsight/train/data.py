"""Prompt records with grain: deterministic shuffling, per-process sharding, random access by
batch or a checkpointable iterator.

Pipeline: source (JSONL file, list of dicts, or a task's examples) -> global shuffle by seed
(reshuffled every epoch) -> repeat -> global batches -> this process's slice -> batches of
``batch_size / process_count`` records (prompts are text, tokenised later by the rollout). The
training loop reads batch ``step`` of :func:`prompt_batches` directly (a record-backed task's
train split, :func:`hindsight.train.loop.train_examples`), so its iterator state is the step held
in the checkpoint; :func:`prompt_dataset` wraps the same pipeline as an iterator whose
``get_state()`` / ``set_state()`` restore the exact position.

Every process sees a disjoint, equally sized part of each global batch, and the union over
processes of global batch ``k`` is the same set of records whatever the process count.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import grain
import jax


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """``path`` (a JSONL file, one record per line) or records passed in code; ``batch_size``
    prompts per step over all processes; ``num_epochs=None`` repeats forever."""
    path: str | None = None
    batch_size: int = 8
    seed: int = 0
    shuffle: bool = True
    num_epochs: int | None = None

    def __post_init__(self):
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"data.batch_size must be a positive int, got {self.batch_size!r}")
        if self.num_epochs is not None and self.num_epochs < 1:
            raise ValueError(f"data.num_epochs must be >= 1 or None, got {self.num_epochs}")


def read_jsonl(path: str) -> list[dict]:
    """Records of a JSONL file (blank lines skipped); errors name the line
    (:func:`hindsight.tasks.dataset.read_records`, the one reader of record files)."""
    from hindsight._records import read_records
    return [record for _, record in read_records(path)]


def prompt_batches(records: Sequence, *, batch_size: int, seed: int = 0, shuffle: bool = True,
                   num_epochs: int | None = None, process_index: int | None = None,
                   process_count: int | None = None) -> grain.MapDataset:
    """A random-access grain dataset whose element ``k`` is this process's share of global batch
    ``k`` (a list of records: dicts, :class:`hindsight.tasks.Example`, anything).

    Args:
      records: the prompt records.
      batch_size: global batch size; must be divisible by ``process_count``.
      seed: shuffling seed; epoch ``e`` uses a permutation derived from ``(seed, e)``.
      shuffle: False keeps file order.
      num_epochs: passes over the data; None repeats forever.
      process_index, process_count: default to ``jax.process_index()`` / ``jax.process_count()``.
    Returns:
      A ``MapDataset``: ``ds[k]`` is a pure function of ``(records, seed, k)``, so a step's
      prompts need no iterator state to resume.
    """
    index = jax.process_index() if process_index is None else process_index
    count = jax.process_count() if process_count is None else process_count
    if not records:
        raise ValueError("`records` is empty: nothing to train on")
    if batch_size % count:
        raise ValueError(f"data.batch_size={batch_size} is not divisible by the process count "
                         f"{count}")
    if batch_size > len(records):
        raise ValueError(f"data.batch_size={batch_size} exceeds the number of records "
                         f"({len(records)})")
    ds = grain.MapDataset.source(list(records))
    if shuffle:
        ds = ds.shuffle(seed=seed)
    ds = ds.repeat(num_epochs)
    # Cut whole global batches first, so that every process takes its part of the same batch.
    ds = ds.batch(batch_size, drop_remainder=True, batch_fn=list)
    per_process = batch_size // count
    return ds.map(lambda batch: batch[index * per_process:(index + 1) * per_process])


def prompt_dataset(records: Sequence, **kwargs) -> grain.IterDataset:
    """:func:`prompt_batches` as an ``IterDataset``: ``iter(ds)`` gives a checkpointable
    ``grain.DatasetIterator`` (``get_state()`` / ``set_state()``)."""
    return prompt_batches(records, **kwargs).to_iter_dataset()


def make_data_iterator(config: DataConfig, records: Sequence[dict] | None = None, *,
                       process_index: int | None = None,
                       process_count: int | None = None) -> grain.DatasetIterator:
    """The checkpointable iterator for ``config`` (records from ``config.path`` unless given)."""
    if records is None:
        if config.path is None:
            raise ValueError("data.path must be set when no records are passed")
        records = read_jsonl(config.path)
    elif config.path is not None:
        raise ValueError("pass either data.path or `records`, not both")
    ds = prompt_dataset(records, batch_size=config.batch_size, seed=config.seed,
                        shuffle=config.shuffle, num_epochs=config.num_epochs,
                        process_index=process_index, process_count=process_count)
    return iter(ds)
