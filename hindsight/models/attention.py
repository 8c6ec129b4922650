"""Grouped-query self-attention with RoPE, optional QK-norm and an explicit functional KV cache.

Masks are built once per forward (`causal_mask` / `cache_mask`) and shared by all layers: a query
attends to a key iff the key's position (or cache slot) is <= the query's position, optionally ANDed
with a key-validity mask. Scores, masking and softmax run in float32; a fully masked query row gets
uniform weights instead of NaN.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from hindsight.models.cache import KVCache, cache_layer, cache_write
from hindsight.models.config import ModelConfig
from hindsight.models.layers import Dense, RMSNorm, apply_rope

_MASKED = -1e30  # finite so that an all-masked row softmaxes to uniform weights, not NaN


def causal_mask(positions: jax.Array, attention_mask: jax.Array | None) -> jax.Array:
    """No-cache mask `[B,S,S]`: key j visible to query i iff `positions[j] <= positions[i]` and
    `attention_mask[j]` (if given, `[B,S]`)."""
    mask = positions[:, None, :] <= positions[:, :, None]
    if attention_mask is not None:
        mask = mask & attention_mask.astype(bool)[:, None, :]
    return mask


def cache_mask(positions: jax.Array, max_len: int, attention_mask: jax.Array | None) -> jax.Array:
    """Cache mask `[B,S,M]`: slot m visible to query i iff `m <= positions[i]` and
    `attention_mask[m]` (if given, `[B,M]` over slots)."""
    slots = jnp.arange(max_len, dtype=positions.dtype)
    mask = slots[None, None, :] <= positions[:, :, None]
    if attention_mask is not None:
        mask = mask & attention_mask.astype(bool)[:, None, :]
    return mask


class Attention(nnx.Module):
    """GQA self-attention: `x [B,S,D] -> [B,S,D]`, H query heads sharing KV heads in groups of H // KV."""

    def __init__(self, cfg: ModelConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        d = cfg.hidden_size
        self.q_proj = Dense(d, cfg.q_size, use_bias=cfg.qkv_bias, **kw)
        self.k_proj = Dense(d, cfg.kv_size, use_bias=cfg.qkv_bias, **kw)
        self.v_proj = Dense(d, cfg.kv_size, use_bias=cfg.qkv_bias, **kw)
        self.o_proj = Dense(cfg.q_size, d, use_bias=cfg.o_bias, **kw)
        norm_kw = dict(eps=cfg.rms_norm_eps, dtype=dtype, param_dtype=param_dtype)
        self.q_norm = RMSNorm(cfg.head_dim, **norm_kw) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, **norm_kw) if cfg.qk_norm else None
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.dtype = dtype

    def __call__(self, x: jax.Array, *, cos: jax.Array, sin: jax.Array, mask: jax.Array,
                 positions: jax.Array, cache: KVCache | None, layer) -> tuple[jax.Array, KVCache | None]:
        """x `[B,S,D]`; cos/sin `[B,S,hd]`; mask `[B,S,T]` (T = S without cache, M with);
        positions `[B,S]` (cache slots to write); `layer` indexes the cache's layer axis."""
        b, s, _ = x.shape
        q = self.q_proj(x).reshape(b, s, self.num_heads, self.head_dim)
        k = self.k_proj(x).reshape(b, s, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(b, s, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            cache = cache_write(cache, layer, k, v, positions)
            k, v = cache_layer(cache, layer)
        out = _attend(q, k, v, mask, dtype=self.dtype)
        return self.o_proj(out.reshape(b, s, self.num_heads * self.head_dim)), cache


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, dtype) -> jax.Array:
    """q `[B,S,H,hd]`, k/v `[B,T,KV,hd]`, mask `[B,S,T]` -> `[B,S,H,hd]` in `dtype`."""
    b, s, h, hd = q.shape
    kv = k.shape[2]
    q = q.reshape(b, s, kv, h // kv, hd).astype(dtype)
    scores = jnp.einsum("bskgd,btkd->bkgst", q, k.astype(dtype), preferred_element_type=jnp.float32)
    scores = scores * (hd ** -0.5)
    scores = jnp.where(mask[:, None, None, :, :], scores, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgst,btkd->bskgd", probs.astype(dtype), v.astype(dtype),
                     preferred_element_type=jnp.float32)
    return out.reshape(b, s, h, hd).astype(dtype)
