"""Functional KV cache: fixed-size per-layer K/V buffers indexed by token position.

Layout: `k, v : [L, B, M, KV, hd]` (layers, rows, slots, kv heads, head dim), M = max_len.
Contract (shared with the sampler): a model call writes the K/V of each token into slot == its
position, per row, then attends over all slots with `slot <= query position`. Rows may be at
different positions. Because a row's positions are contiguous from 0 and written in order, slots
beyond a row's current position are never read, so stale data there (right-padded prefill, a forked
trajectory) is harmless. Writes at positions >= M are dropped.

Forking is a row gather (`cache_take`); no per-row bookkeeping lives in the cache itself, the
caller owns the positions.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class KVCache(NamedTuple):
    """K/V buffers `[L, B, M, KV, hd]` (a pytree: jit, donate, shard and gather it like any array)."""

    k: jax.Array
    v: jax.Array

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @property
    def batch(self) -> int:
        return self.k.shape[1]


def init_cache(*, num_layers: int, batch: int, max_len: int, num_kv_heads: int, head_dim: int,
               dtype=jnp.float32) -> KVCache:
    """Zero-filled cache `[L, B, max_len, KV, hd]` in `dtype`."""
    shape = (num_layers, batch, max_len, num_kv_heads, head_dim)
    return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))


def cache_take(cache: KVCache, rows) -> KVCache:
    """Gather rows: `rows [B']` int -> cache with `B'` rows (row i is a copy of `rows[i]`).

    E.g. fan one prefilled prompt out to G samples with `cache_take(cache, jnp.zeros(G, int))`, or
    branch trajectories `[3, 3, 7]` from a finished batch. Combine with the rows' positions: a
    continuation of row r from position p writes slots >= p, which overwrite the old tail.
    """
    rows = jnp.asarray(rows, jnp.int32)
    return KVCache(k=jnp.take(cache.k, rows, axis=1), v=jnp.take(cache.v, rows, axis=1))


def cache_write(cache: KVCache, layer, k: jax.Array, v: jax.Array, positions: jax.Array) -> KVCache:
    """Scatter `k, v [B,S,KV,hd]` of layer `layer` into slots `positions [B,S]` (a scatter of B*S
    slots, in place under jit: the rest of the buffer is untouched). Positions must be distinct
    within a row; out-of-range positions are dropped."""
    rows = jnp.broadcast_to(jnp.arange(positions.shape[0])[:, None], positions.shape)
    layer = jnp.asarray(layer, jnp.int32)
    k_all = cache.k.at[layer, rows, positions].set(k.astype(cache.k.dtype), mode="drop")
    v_all = cache.v.at[layer, rows, positions].set(v.astype(cache.v.dtype), mode="drop")
    return KVCache(k=k_all, v=v_all)


def cache_layer(cache: KVCache, layer) -> tuple[jax.Array, jax.Array]:
    """K/V of one layer: two `[B, M, KV, hd]` arrays."""
    return cache.k[layer], cache.v[layer]
