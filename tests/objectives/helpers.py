"""Shared test inputs for the objectives tests: masks with the awkward rows, padding, micro-batching."""
from __future__ import annotations

import functools

import jax
import numpy as np


def random_mask(rng: np.random.Generator, b: int, t: int, *, contiguous: bool = True) -> np.ndarray:
    """``[b, t]`` float32 0/1 mask whose row 0 is empty and row 1 holds one token (needs ``b >= 2``).

    ``contiguous`` gives right-padded responses of random length; otherwise random holes.
    """
    if contiguous:
        lengths = rng.integers(0, t + 1, size=b)
        mask = (np.arange(t)[None, :] < lengths[:, None])
    else:
        mask = rng.random((b, t)) < 0.6
    mask = mask.astype(np.float32)
    mask[0] = 0.0
    mask[1] = 0.0
    mask[1, rng.integers(t)] = 1.0
    return mask


def pad_rows_cols(x: np.ndarray, rows: int, cols: int, value: float) -> np.ndarray:
    """Append ``rows`` rows and ``cols`` columns (axes 0 and 1) filled with ``value``."""
    widths = [(0, rows), (0, cols)] + [(0, 0)] * (x.ndim - 2)
    return np.pad(x, widths, constant_values=value)


def row_chunks(b: int, sizes: tuple[int, ...]) -> list[slice]:
    """Consecutive row slices of the given sizes covering ``b`` rows."""
    assert sum(sizes) == b
    edges = np.cumsum((0,) + tuple(sizes))
    return [slice(int(lo), int(hi)) for lo, hi in zip(edges[:-1], edges[1:])]


def np_log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    z = x - x.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def jitted(fn, **static):
    """``jax.jit`` of ``fn`` with keyword hyperparameters bound (one compile per input shape).

    Tests call the library through this: eager op-by-op dispatch compiles every primitive separately,
    which is several times slower than one compile of the whole function.
    """
    return jax.jit(functools.partial(fn, **static))
