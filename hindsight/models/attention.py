"""Grouped-query self-attention with RoPE, optional QK-norm and an explicit functional KV cache.

Masks are built once per forward (`causal_mask` / `cache_mask`) and shared by all layers: a query
attends to a key iff the key's position (or cache slot) is <= the query's position, optionally ANDed
with a key-validity mask. Scores, masking and softmax run in float32 (inputs in the compute
dtype); a fully masked query row gets uniform weights instead of NaN.

The attention product itself has implementations (:data:`ATTENTION`, the ``model.attention``
key):

* ``xla``: grouped einsums that materialise the float32 scores ``[B, KV, G, S, T]``.
* ``chunked``: the same in blocks of :data:`QUERY_BLOCK` queries, each block rematerialised in
  the backward pass, so working memory is ``O(block * T)`` instead of ``O(S * T)``; the numbers
  are the ``xla`` path's (a query's softmax runs over all its keys either way).
* ``cudnn``: ``jax.nn.dot_product_attention``'s cuDNN fused kernel (GPU, bf16 / fp16 inputs;
  the mask enters as a bias). Not run on this project's CPU machine:
  ``experiments/bench/accelerator.sh`` checks it against ``xla`` where a GPU is.
* ``auto`` (the default): ``cudnn`` on a GPU computing in bf16 / fp16, otherwise ``chunked``
  (which is ``xla`` itself up to one block of queries: decode steps and short prompts).

TPU's splash / flash Pallas kernels are not wired: nothing here can run them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from hindsight.models.cache import KVCache, cache_layer, cache_write
from hindsight.models.config import ModelConfig
from hindsight.models.layers import Dense, RMSNorm, apply_rope



def causal_mask(positions: jax.Array, attention_mask: jax.Array | None,
                segment_ids: jax.Array | None = None,
                prefix_ids: jax.Array | None = None) -> jax.Array:
    """No-cache mask `[B,S,S]`: key j visible to query i iff `positions[j] <= positions[i]` and
    `attention_mask[j]` (if given, `[B,S]`) and, for packed rows, `segment_ids[j] != 0` (if
    given, `[B,S]` int: 0 marks padding, each other value one piece of a sequence) is
    `segment_ids[i]` or `prefix_ids[i]` (if given, `[B,S]` int: the segment of the shared
    prefix the query's sequence continues, its own segment where none)."""
    mask = positions[:, None, :] <= positions[:, :, None]
    if attention_mask is not None:
        mask = mask & attention_mask.astype(bool)[:, None, :]
    if segment_ids is not None:
        seen = segment_ids[:, None, :] == segment_ids[:, :, None]
        if prefix_ids is not None:
            seen = seen | (segment_ids[:, None, :] == prefix_ids[:, :, None])
        mask = mask & seen & (segment_ids != 0)[:, None, :]
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

    def __init__(self, cfg: ModelConfig, *, dtype, param_dtype, attention: str = "auto",
                 rngs: nnx.Rngs):
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
        self.impl = attention_impl(attention, dtype=dtype)

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
            # the mask spans the slots the forward attends over (`Decoder(kv_window=...)`: a
            # decode step reads only the live front of the cache, not all M slots)
            k, v = cache_layer(cache, layer, mask.shape[-1])
        out = ATTENTION[self.impl](q, k, v, mask, dtype=self.dtype)
        return self.o_proj(out.reshape(b, s, self.num_heads * self.head_dim)), cache


_MASKED = -1e30  # finite so that an all-masked row softmaxes to uniform weights, not NaN
QUERY_BLOCK = 512   # queries per block of the chunked path: [B, KV, G, 512, T] float32 scores


def _xla(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, dtype) -> jax.Array:
    """q `[B,S,H,hd]`, k/v `[B,T,KV,hd]`, mask `[B,S,T]` -> `[B,S,H,hd]` in `dtype`.

    Grouped einsums rather than ``jax.nn.dot_product_attention``'s XLA path: that path casts the
    probabilities to the input dtype and multiplies them by V without float32 accumulation, and
    vmaps over the groups; on this CPU a bf16 decode step of 64 rows over 512 slots (SmolLM2's
    heads) took 34 ms through it against 16 ms here (float32: equal).

    Heads go in front of the sequence axes (``q [B,KV,G,S,hd]``, ``k / v [B,KV,T,hd]``) before the
    einsums, so each is a plain batched matmul over ``(B, KV)``: with the sequence axis first, XLA
    on CPU ran the score product 5x slower (SmolLM2's heads, 32 rows of 160 tokens, bf16: 20.4 vs
    4.0 ms per layer), and a teacher-forced scoring pass (2 rows, 110 + 96 tokens, float32) took
    0.38-0.40 s against 0.35 s this way."""
    b, s, h, hd = q.shape
    kv = k.shape[2]
    if s == 1:
        return _one_query(q, k, v, mask, dtype=dtype)
    q = q.reshape(b, s, kv, h // kv, hd).transpose(0, 2, 3, 1, 4).astype(dtype)
    k, v = (x.transpose(0, 2, 1, 3).astype(dtype) for x in (k, v))
    scores = jnp.einsum("bkgsd,bktd->bkgst", q, k, preferred_element_type=jnp.float32)
    scores = jnp.where(mask[:, None, None, :, :], scores * (hd ** -0.5), _MASKED)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgst,bktd->bkgsd", probs.astype(dtype), v, preferred_element_type=jnp.float32)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, s, h, hd).astype(dtype)


def _one_query(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, dtype) -> jax.Array:
    """:func:`_xla` for one query per row (a decode step), without the query axis in the einsums:
    with it, XLA:CPU transposes the scores and the output around each size-1 axis (SmolLM2, 16
    rows, 208 cache slots, 30 layers: 96 ms of attention per step against 72 ms)."""
    b, _, h, hd = q.shape
    kv = k.shape[2]
    q = q.reshape(b, kv, h // kv, hd).astype(dtype)
    scores = jnp.einsum("bkgd,btkd->bkgt", q, k.astype(dtype), preferred_element_type=jnp.float32)
    scores = jnp.where(mask[:, :, None, :], scores * (hd ** -0.5), _MASKED)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgt,btkd->bkgd", probs.astype(dtype), v.astype(dtype),
                     preferred_element_type=jnp.float32)
    return out.reshape(b, 1, h, hd).astype(dtype)


def _cudnn(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, dtype) -> jax.Array:
    """As :func:`_xla`, through cuDNN's fused attention (GPU; bf16 / fp16 `dtype`)."""
    return jax.nn.dot_product_attention(q.astype(dtype), k.astype(dtype), v.astype(dtype),
                                        mask=mask[:, None], implementation="cudnn")


def _chunked(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, dtype) -> jax.Array:
    """As :func:`_xla`, a block of :data:`QUERY_BLOCK` queries at a time (``lax.map`` over the
    blocks, each rematerialised in the backward pass: only one block's scores ever exist)."""
    b, s, h, hd = q.shape
    if s <= QUERY_BLOCK:
        return _xla(q, k, v, mask, dtype=dtype)
    pad = -s % QUERY_BLOCK   # padded queries see no key: uniform weights, cut off below
    n = (s + pad) // QUERY_BLOCK
    qb = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b, n, QUERY_BLOCK, h, hd)
    mb = jnp.pad(mask, ((0, 0), (0, pad), (0, 0))).reshape(b, n, QUERY_BLOCK, mask.shape[-1])
    block = jax.checkpoint(lambda qm: _xla(qm[0], k, v, qm[1], dtype=dtype))
    out = jax.lax.map(block, (jnp.swapaxes(qb, 0, 1), jnp.swapaxes(mb, 0, 1)))
    return jnp.swapaxes(out, 0, 1).reshape(b, n * QUERY_BLOCK, h, hd)[:, :s]


ATTENTION = {"xla": _xla, "chunked": _chunked, "cudnn": _cudnn}
ATTENTION_CHOICES = ("auto", *ATTENTION)


def attention_impl(name: str, *, dtype) -> str:
    """The implementation ``name`` stands for on this process's backend (``auto`` resolved)."""
    if name not in ATTENTION_CHOICES:
        raise ValueError(f"unknown attention implementation {name!r}; available: {list(ATTENTION_CHOICES)}")
    if name != "auto":
        return name
    low_precision = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    return "cudnn" if jax.default_backend() == "gpu" and low_precision else "chunked"
