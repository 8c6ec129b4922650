"""What the processes of a multi-controller run (``jax.distributed``) share, and what each keeps.

Rollouts dominate an RL step's wall-clock, so each process samples only its share of the step's
prompts: process ``i`` of ``N`` takes the ``i``-th of ``N`` contiguous slices of the prompts
(:func:`prompt_share`, whole groups, ``prompts_per_step % N == 0``), samples and verifies them with
request keys folded from each prompt's number in the step, and feeds its rows to the train step
(which lays each process's rows out as its part of the global batch,
:func:`hindsight.train.step.shard_batch`). Group statistics (advantages, contexts' random choices)
stay in the process that owns the group, so the global batch is the one a single process would
sample, in the same row order, whatever the process count. What must agree across processes:

* array shapes: a context's width is bucketed from the longest prompt a process saw, so every
  process pads its widths to the largest of all (:func:`agree_widths`; right-padding changes no
  value: the padded positions are masked out of attention and read by no target);
* the step's metrics: each process's rollout figures are reduced over all of them
  (:func:`reduce_metrics`: sums for counts, the maximum for seconds, the mean otherwise, every
  process holding the same number of groups);
* batch-wide statistics (TRL's batch-scaled advantages): the rewards of every process
  (:func:`gather_rows`).

In a single-process run every function here is the identity (no collective is called).
"""
from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np

WIDTH_KEYS = ("tokens", "positions", "attention_mask", "turn_rewards")
"""Batch keys (or context keys ending so) whose second axis is a per-batch padded width."""
SUM_METRICS = frozenset({"verifier_errors", "gen_batches", "dropped_groups", "filled_groups",
                         "generated_tokens", "error_states", "recoverable_states",
                         "irreversible_states", "ambiguous_states"})
"""Rollout metrics that count: summed over processes."""


def prompt_share(count: int, *, index: int | None = None,
                 processes: int | None = None) -> slice:
    """This process's slice of a step's ``count`` prompts: the ``index``-th of ``processes``
    contiguous slices (defaults: this process of the run).

    Raises:
      ValueError unless ``processes`` divides ``count`` (every process samples whole groups).
    """
    index = jax.process_index() if index is None else index
    processes = jax.process_count() if processes is None else processes
    if count % processes:
        raise ValueError(f"rollout.prompts_per_step={count} must be a multiple of the process "
                         f"count {processes}: each process samples the same number of groups")
    per = count // processes
    return slice(index * per, (index + 1) * per)


def allgather(x: np.ndarray) -> np.ndarray:
    """``[N, ...]``: ``x`` of every process, in process order (``x`` itself, stacked, on one)."""
    if jax.process_count() == 1:
        return np.asarray(x)[None]
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(np.asarray(x)))


def _shape_row(x) -> list[int]:
    """``[ndim, d0, d1, d2]`` (0 for missing axes; batch leaves have at most three)."""
    shape = list(np.shape(x))
    return [len(shape)] + (shape + [0, 0, 0])[:3]


def _is_width_key(key: str) -> bool:
    return any(key == k or key.endswith("_" + k) for k in WIDTH_KEYS)


def _pad_width(key: str, x: np.ndarray, width: int) -> np.ndarray:
    extra = width - x.shape[1]
    if extra == 0:
        return x
    if key == "positions" or key.endswith("_positions"):   # positions run on past the padding
        tail = np.arange(x.shape[1], width, dtype=x.dtype)
        return np.concatenate([x, np.broadcast_to(tail, (x.shape[0], extra))], axis=1)
    pad = [(0, 0), (0, extra)] + [(0, 0)] * (x.ndim - 2)
    return np.pad(x, pad)


def agree_widths(batch: Mapping[str, np.ndarray]) -> dict:
    """``batch`` (this process's rows) with every padded width (:data:`WIDTH_KEYS`) widened to
    the largest any process has, so all processes feed the step arrays of one shape.

    Raises:
      ValueError when the processes' batches differ in keys or in another axis.
    """
    if jax.process_count() == 1:
        return dict(batch)
    keys = sorted(batch)
    every = allgather(np.array([_shape_row(batch[k]) for k in keys], np.int64))  # [N, keys, 4]
    out = {}
    for i, key in enumerate(keys):
        dims = every[:, i]
        x = np.asarray(batch[key])
        if _is_width_key(key) and x.ndim >= 2:
            others = np.delete(dims, 2, axis=1)
            if np.any(others != others[0]):
                raise ValueError(f"batch key {key!r} differs across processes beyond its width: "
                                 f"{dims.tolist()}")
            out[key] = _pad_width(key, x, int(dims[:, 2].max()))
        else:
            if np.any(dims != dims[0]):
                raise ValueError(f"batch key {key!r} has different shapes across processes: "
                                 f"{dims.tolist()}")
            out[key] = x
    return out


def reduce_metrics(record: Mapping[str, float]) -> dict:
    """A step's rollout figures of this process -> the run's: summed (:data:`SUM_METRICS`), the
    maximum for ``*_seconds`` (the step waits for the slowest process), the mean otherwise (every
    process holds the same number of groups, so the mean of means is the mean)."""
    keys = sorted(record)
    values = allgather(np.array([float(record[k]) for k in keys], np.float64))
    out = {}
    for i, key in enumerate(keys):
        column = values[:, i]
        if key in SUM_METRICS:
            out[key] = float(column.sum())
        elif key.endswith("_seconds"):
            out[key] = float(column.max())
        else:
            out[key] = float(column.mean())
    return out


def gather_rows(x: np.ndarray) -> tuple[np.ndarray, slice]:
    """``(rows of every process concatenated in process order, this process's slice of them)``
    for a per-row array (equal row counts on every process)."""
    x = np.asarray(x)
    every = allgather(x)
    n = x.shape[0]
    index = jax.process_index()
    return every.reshape((-1,) + x.shape[1:]), slice(index * n, (index + 1) * n)


def weighted_mean(total: float, count: float) -> float:
    """``sum(total) / sum(count)`` over the processes (an evaluation split across them)."""
    both = allgather(np.array([total, count], np.float64)).sum(axis=0)
    return float(both[0] / max(both[1], 1.0))


def host_local(tree, mesh):
    """A copy of ``tree`` (global arrays on ``mesh``: a model's params) that this process alone
    computes with: its rollouts sample other prompts than the other processes', so they cannot
    run one SPMD program over the global params. On several processes every array is gathered
    whole (the weight sync of an RL step) and placed tensor-parallel over this process's own
    devices (:func:`local_mesh`, the model's partition rules: attention heads and MLP columns
    split, the KV cache following the heads), the usual inference layout inside a host; on one
    process, ``tree`` itself (the sampler runs on the training layout: GSPMD propagates it, and
    the cache's KV heads land on the ``tensor`` axis)."""
    if jax.process_count() == 1:
        return tree
    from jax.sharding import NamedSharding, PartitionSpec
    from hindsight.train.mesh import model_rules, param_shardings
    whole = jax.jit(lambda t: t, out_shardings=NamedSharding(mesh, PartitionSpec()))(tree)
    local = jax.tree.map(lambda x: x.addressable_data(0), whole)
    host = local_mesh()
    return jax.device_put(local, param_shardings(local, host, model_rules(host)))


def local_mesh():
    """This process's devices as a ``(data 1, fsdp 1, tensor n)`` mesh: tensor parallelism
    inside the host, where the per-layer all-reduces stay on the host's own interconnect."""
    from jax.sharding import Mesh
    from hindsight.train.mesh import AXES
    devices = np.asarray(jax.local_devices()).reshape(1, 1, -1)
    return Mesh(devices, AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(AXES))
