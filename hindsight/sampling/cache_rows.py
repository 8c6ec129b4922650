"""Row gather / scatter on any model's KV-cache pytree.

The sampler only relies on the cache contract (a pytree of fixed-size buffers with one batch axis
per leaf), not on a layout: the batch axis of every leaf is found once by comparing the abstract
shapes of ``model.init_cache`` at batch 1 and 2 (leaves without a batch axis get ``-1`` and are left
alone). Scatters are jitted with the destination donated, so a refill writes only the moved rows.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from hindsight.sampling.buckets import pow2_bucket


def batch_axes(model, max_len: int, dtype, *, abstract=None):
    """Pytree (same structure as the cache) of each leaf's batch axis, ``-1`` when it has none
    (``abstract``: ``model.init_cache(1, ...)``'s shapes, if already evaluated)."""
    one = abstract if abstract is not None else jax.eval_shape(lambda: model.init_cache(1, max_len, dtype=dtype))
    two = jax.eval_shape(lambda: model.init_cache(2, max_len, dtype=dtype))

    def axis(a, b):
        diff = [i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y]
        if len(diff) > 1:
            raise ValueError(f"cache leaf changes shape along several axes with the batch: {a.shape} vs {b.shape}")
        return diff[0] if diff else -1

    return jax.tree.map(axis, one, two)


def _take(x, rows, axis):
    return x if axis < 0 else jnp.take(x, rows, axis=axis)


def _put(x, rows, src, axis):
    if axis < 0:
        return x
    idx = (slice(None),) * axis + (rows,)
    return x.at[idx].set(src.astype(x.dtype), mode="drop")


@functools.partial(jax.jit, static_argnames=("axes",))
def _take_rows(cache, rows, *, axes):
    return jax.tree.map(lambda x, a: _take(x, rows, a), cache, axes.tree)


@functools.partial(jax.jit, static_argnames=("axes",), donate_argnames=("dst",))
def _move_rows(dst, dst_rows, src, src_rows, *, axes):
    return jax.tree.map(lambda d, s, a: _put(d, dst_rows, _take(s, src_rows, a), a), dst, src, axes.tree)


class _Axes:
    """Hashable wrapper of the batch-axes pytree (a static jit argument); ``dtypes`` lists the
    cache leaves' dtypes (not part of the key)."""

    def __init__(self, tree, dtypes=()):
        self.tree, self.dtypes = tree, list(dtypes)
        self._key = (jax.tree.structure(tree), tuple(jax.tree.leaves(tree)))

    def __hash__(self):
        return hash(self._key)

    def __eq__(self, other):
        return isinstance(other, _Axes) and self._key == other._key


def static_axes(model, max_len: int, dtype) -> _Axes:
    one = jax.eval_shape(lambda: model.init_cache(1, max_len, dtype=dtype))
    return _Axes(batch_axes(model, max_len, dtype, abstract=one), [x.dtype for x in jax.tree.leaves(one)])


def _padded(rows, size: int) -> np.ndarray:
    """``rows`` padded to ``size`` by repeating its last entry (duplicates rewrite identical data)."""
    rows = np.asarray(rows, np.int32).reshape(-1)
    return np.concatenate([rows, np.full(size - rows.size, rows[-1], np.int32)])


def take_rows(cache, rows, axes: _Axes):
    """New cache whose row i is ``cache`` row ``rows[i]`` (``rows [B']`` int)."""
    return _take_rows(cache, jnp.asarray(np.asarray(rows, np.int32)), axes=axes)


def move_rows(dst, dst_rows, src, src_rows, axes: _Axes):
    """``dst`` (donated) with row ``dst_rows[i]`` replaced by ``src`` row ``src_rows[i]``.

    The number of moved rows is bucketed to a power of two (padding repeats the last pair), so the
    scatter compiles once per bucket and source batch size.
    """
    dst_rows, src_rows = np.asarray(dst_rows, np.int32), np.asarray(src_rows, np.int32)
    if dst_rows.size == 0:
        return dst
    size = pow2_bucket(dst_rows.size)
    return _move_rows(dst, jnp.asarray(_padded(dst_rows, size)), src, jnp.asarray(_padded(src_rows, size)),
                      axes=axes)
