"""Host-side input checks and packing (numpy), run before anything is compiled."""
from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from hindsight.sampling.buckets import pow2_bucket


def token_lists(name: str, seqs, *, vocab_size: int, allow_empty: bool = False) -> list[np.ndarray]:
    """Validate a sequence of token-id sequences; returns int32 arrays.

    Raises ValueError on an empty list, an empty sequence (unless ``allow_empty``), a non-integer or
    out-of-vocabulary id.
    """
    if isinstance(seqs, np.ndarray) and seqs.ndim == 1 or (len(seqs) and np.isscalar(seqs[0])):
        raise ValueError(f"`{name}` must be a sequence of token sequences (one per prompt), got a flat sequence")
    out = []
    for i, s in enumerate(seqs):
        a = np.asarray(s)
        if a.ndim != 1:
            raise ValueError(f"`{name}[{i}]` must be a 1-D token sequence, got shape {a.shape}")
        if a.size == 0 and not allow_empty:
            raise ValueError(f"`{name}[{i}]` is empty: a prompt needs at least one token (e.g. BOS)")
        if a.size and not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"`{name}[{i}]` must hold integer token ids, got dtype {a.dtype}")
        if a.size and (a.min() < 0 or a.max() >= vocab_size):
            raise ValueError(f"`{name}[{i}]` holds ids outside [0, {vocab_size}): min {a.min()}, max {a.max()}")
        out.append(a.astype(np.int32))
    if not out:
        raise ValueError(f"`{name}` is empty")
    return out


def pad_rows(seqs: Sequence[np.ndarray], *, rows: int, width: int) -> np.ndarray:
    """Right-pad sequences with 0 into ``[rows, width]`` int32 (extra rows hold a single 0)."""
    out = np.zeros((rows, width), np.int32)
    for i, s in enumerate(seqs):
        out[i, : s.size] = s
    return out


def row_indices(name: str, rows, num_rows: int) -> np.ndarray:
    """``rows`` (an int or a 1-D int sequence) as ``[N]`` int32 indices into ``num_rows`` rows.
    Raises TypeError on non-integers, ValueError on another shape or a row outside the range."""
    a = np.atleast_1d(np.asarray(rows))
    if a.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D, got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"`{name}` must be integers, got dtype {a.dtype}")
    bad = np.nonzero((a < 0) | (a >= num_rows))[0]
    if bad.size:
        raise ValueError(f"`{name}` entry {a[bad[0]]} is outside the {num_rows} rollout rows")
    return a.astype(np.int32)


def per_row_ints(name: str, value, rows: int, *, minimum: int) -> np.ndarray:
    """Broadcast an int or a ``[rows]`` sequence to ``[rows]`` int32, each ``>= minimum``."""
    a = np.broadcast_to(np.asarray(value), (rows,)) if np.ndim(value) == 0 else np.asarray(value)
    if a.shape != (rows,) or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"`{name}` must be an int or {rows} ints, got {value!r}")
    if a.min() < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {a.min()}")
    return a.astype(np.int32)


def stop_table(stop_tokens, rows: int, *, default: tuple[int, ...], vocab_size: int) -> np.ndarray:
    """Per-row stop ids ``[rows, K]`` int32 (``-1`` padded, K a power of two).

    ``stop_tokens``: None (use ``default`` for every row), one sequence of ids (every row), or
    ``rows`` sequences (one set per row).
    """
    if stop_tokens is None:
        sets = [tuple(default)] * rows
    elif len(stop_tokens) and not np.isscalar(stop_tokens[0]):
        if len(stop_tokens) != rows:
            raise ValueError(f"`stop_tokens` has {len(stop_tokens)} per-row sets but there are {rows} rows")
        sets = [tuple(s) for s in stop_tokens]
    else:
        sets = [tuple(stop_tokens)] * rows
    flat = [int(t) for s in sets for t in s]
    bad = sorted({t for t in flat if t < 0 or t >= vocab_size})
    if bad:
        raise ValueError(f"unknown stop token id(s) {bad}: vocabulary size is {vocab_size}")
    k = pow2_bucket(max((len(s) for s in sets), default=1))
    table = np.full((rows, k), -1, np.int32)
    for i, s in enumerate(sets):
        table[i, : len(s)] = s
    return table


def row_keys(key, keys, rows: int) -> jax.Array:
    """``[rows]`` typed PRNG keys: ``keys`` as given (typed or raw uint32 ``[rows, 2]``) or
    ``jax.random.split(key, rows)``; ``key`` defaults to ``jax.random.key(0)``."""
    if keys is not None:
        keys = jax.numpy.asarray(keys) if not isinstance(keys, jax.Array) else keys
        if not jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key):
            keys = jax.random.wrap_key_data(keys)
        if keys.shape != (rows,):
            raise ValueError(f"`row_keys` must hold {rows} keys, got shape {keys.shape}")
        return keys
    if key is None:
        key = jax.random.key(0)
    elif not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    return jax.random.split(key, rows)

