"""The causal decoder (Llama / Qwen2 / Qwen3) as one Flax NNX module.

Parameter layout (paths used by the loaders and the partition rules):

    embed                              [V, D]            token embedding (HF layout)
    layers/attn_norm/scale             [(L,) D]
    layers/attn/{q,k,v,o}_proj/kernel  [(L,) in, out]    transposes of the HF weights
    layers/attn/{q,k,v,o}_proj/bias    [(L,) out]        when the family has them
    layers/attn/{q,k}_norm/scale       [(L,) hd]         Qwen3 only
    layers/mlp_norm/scale              [(L,) D]
    layers/mlp/{gate,up,down}_proj/kernel
    final_norm/scale                   [D]
    lm_head                            [D, V]            only when embeddings are untied

With `scan_layers=True` (default) every `layers/...` parameter carries a leading stacked layer axis
`L` and the forward pass is one `lax.scan`, so compile time does not grow with depth. With
`scan_layers=False` the paths are `layers/<i>/...` and the loop is unrolled (faster bf16 on CPU,
slower compile).

``mlp_reduce`` (an :class:`MLPReduce`) folds every layer's MLP post-activations into a carry
inside the layer loop, so a caller can reduce them per layer (Neuron-OPSD's neuron scores and
their top-k) without the ``[L, B, S, F]`` activations ever existing; without it the traced
program is exactly the plain forward pass (``tests/models/test_mlp_reduce.py``).
"""
from __future__ import annotations

import functools

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from hindsight import _validation as v
from hindsight.models.attention import Attention, cache_mask, causal_mask
from hindsight.models.cache import KVCache, init_cache
from hindsight.models.config import ModelConfig
from hindsight.models.layers import RMSNorm, SwiGLU, matmul, rope_inv_freq, rope_tables


class MLPReduce(NamedTuple):
    """A fold over the layers' MLP post-activations, run inside the decoder's layer loop.

    Attributes:
      init: the carry before layer 0 (a pytree of arrays).
      step: ``step(carry, activations [B, S, F], down_kernel [F, D], layer) -> carry`` with the
        same structure, shapes and dtypes (a ``lax.scan`` carry); ``activations`` are the layer's
        ``silu(x W_gate) * (x W_up)`` in the compute dtype, ``down_kernel`` its down projection
        (row ``i``: neuron ``i``'s output weights), ``layer`` its index (an int32 scalar under
        ``scan_layers``, a Python int unrolled). A per-layer output is a ``[L, ...]`` carry
        written at ``layer``.
    """
    init: Any
    step: Callable


class Block(nnx.Module):
    """Pre-norm decoder layer: `h + attn(norm(h))`, then `h + mlp(norm(h))`."""

    def __init__(self, cfg: ModelConfig, *, dtype, param_dtype, attention: str, rngs: nnx.Rngs):
        norm_kw = dict(eps=cfg.rms_norm_eps, dtype=dtype, param_dtype=param_dtype)
        self.attn_norm = RMSNorm(cfg.hidden_size, **norm_kw)
        self.attn = Attention(cfg, dtype=dtype, param_dtype=param_dtype, attention=attention,
                              rngs=rngs)
        self.mlp_norm = RMSNorm(cfg.hidden_size, **norm_kw)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, dtype=dtype, param_dtype=param_dtype,
                          rngs=rngs)

    def __call__(self, h, *, cos, sin, mask, positions, cache, layer, tap=None):
        """``(h, cache)``; with ``tap`` (see :class:`SwiGLU`), ``(h, cache, tapped)``."""
        a, cache = self.attn(self.attn_norm(h), cos=cos, sin=sin, mask=mask, positions=positions,
                             cache=cache, layer=layer)
        h = h + a
        if tap is None:
            return h + self.mlp(self.mlp_norm(h)), cache
        out, tapped = self.mlp(self.mlp_norm(h), tap=tap)
        return h + out, cache, tapped


class Decoder(nnx.Module):
    """Causal LM. Build with random weights here, or with real weights via `hindsight.models.load`.

    Args:
      cfg: the architecture.
      dtype: compute dtype (activations, matmul inputs, KV cache default); matmuls accumulate in f32,
        norms / softmax / logits are f32.
      param_dtype: storage dtype of the parameters.
      scan_layers: stacked layer parameters + `lax.scan` (True) or an unrolled per-layer loop.
      remat: rematerialize each layer in the backward pass (`jax.checkpoint`).
      attention: the attention implementation (`hindsight.models.attention.ATTENTION_CHOICES`;
        "auto" picks per backend).
      rngs: initializer keys (`rngs.params`).
    """

    def __init__(self, cfg: ModelConfig, *, dtype=jnp.float32, param_dtype=jnp.float32,
                 scan_layers: bool = True, remat: bool = False, attention: str = "auto",
                 rngs: nnx.Rngs):
        self.config = cfg
        self.dtype, self.param_dtype = dtype, param_dtype
        self.scan_layers, self.remat, self.attention = scan_layers, remat, attention
        init = jax.nn.initializers.normal(stddev=0.02)
        self.embed = nnx.Param(init(rngs.params(), (cfg.vocab_size, cfg.hidden_size), param_dtype))
        block_kw = dict(dtype=dtype, param_dtype=param_dtype)
        layer_kw = dict(block_kw, attention=attention)
        if scan_layers:
            @nnx.split_rngs(splits=cfg.num_layers)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def stacked(layer_rngs):
                return Block(cfg, rngs=layer_rngs, **layer_kw)

            self.layers = stacked(rngs)
        else:
            self.layers = nnx.List([Block(cfg, rngs=rngs, **layer_kw) for _ in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, **block_kw)
        self.lm_head = (None if cfg.tie_embeddings else
                        nnx.Param(init(rngs.params(), (cfg.hidden_size, cfg.vocab_size), param_dtype)))

    def unembedding(self) -> jax.Array:
        """The LM head matrix `[D, V]` (the embedding transposed when tied), in `param_dtype`.
        `logits = matmul(hidden, model.unembedding(), dtype=model.dtype)` (f32 accumulation)."""
        return self.embed[...].T if self.lm_head is None else self.lm_head[...]

    def init_cache(self, batch: int, max_len: int, *, dtype=None) -> KVCache:
        """Empty KV cache `[L, batch, max_len, KV, hd]` (default dtype: the compute dtype)."""
        cfg = self.config
        return init_cache(num_layers=cfg.num_layers, batch=batch, max_len=max_len,
                          num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                          dtype=self.dtype if dtype is None else dtype)

    def __call__(self, tokens: jax.Array, positions: jax.Array, *, cache: KVCache | None = None,
                 attention_mask: jax.Array | None = None, segment_ids: jax.Array | None = None,
                 prefix_ids: jax.Array | None = None, return_hidden: bool = False,
                 mlp_reduce: MLPReduce | None = None, kv_window: int | None = None) -> tuple:
        """Forward pass.

        Args:
          tokens: `[B,S]` int32 token ids.
          positions: `[B,S]` int32 positions (RoPE angle, causal order and cache slot).
          cache: None for a plain causal forward, where key j is visible to query i iff
            `positions[j] <= positions[i]` (and `attention_mask[j]`). With a `KVCache`
            (`init_cache`), each token's K/V is written at slot == its position (per row), then every
            query attends over all slots with `slot <= position` (and `attention_mask[slot]`).
          attention_mask: optional key-validity mask, bool or 0/1: `[B,S]` without a cache, `[B,M]`
            over cache slots with one.
          segment_ids: optional `[B,S]` int, packed rows without a cache
            (:mod:`hindsight.packing`): several sequences share a row, each with its own
            `positions`, and a query sees only the keys of its own segment; 0 marks padding.
          prefix_ids: optional `[B,S]` int with `segment_ids`: the segment a query also sees,
            the copy of a prefix its sequence shares with others of the row (its own segment
            where none): G responses to one prompt attend to one copy of it.
          return_hidden: return the final-normed hidden states `[B,S,D]` (compute dtype) instead of
            logits, for a chunked LM head with `unembedding()`.
          mlp_reduce: an :class:`MLPReduce` folded over the layers' MLP post-activations inside
            the layer loop (None: the plain forward pass, unchanged).
          kv_window: with a cache, a static int ``W <= M``: queries attend over slots ``< W`` only
            (the caller guarantees every position is ``< W``, so nothing visible is cut). A
            decode step reads each layer's K/V once; over the whole cache that is most of its
            memory traffic early in long caches (SmolLM2, 16 rows: 40 ms per step at M = 128,
            106 ms at M = 1,024 on 2 Zen 5 cores). None: all ``M`` slots.

        Returns:
          `(out, cache)`: out = float32 logits `[B,S,V]` (or hidden `[B,S,D]`); cache = the updated
          cache (None without one). With `mlp_reduce`, `(out, cache, carry)`: the fold's final
          carry.
        """
        self._check_inputs(tokens, positions, cache, attention_mask, segment_ids, prefix_ids,
                           kv_window)
        cfg = self.config
        positions = positions.astype(jnp.int32)
        h = jnp.take(self.embed[...], tokens, axis=0).astype(self.dtype)
        cos, sin = rope_tables(positions, rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling))
        if cache is None:
            mask = causal_mask(positions, attention_mask, segment_ids, prefix_ids)
        else:
            window = cache.max_len if kv_window is None else kv_window
            mask = cache_mask(positions, window,
                              None if attention_mask is None else attention_mask[:, :window])

        def block_fn(graphdef):
            def apply(state, h, cache, layer, *fold):
                # `fold` is () or (carry,): the plain path traces exactly as without the option
                tap = {} if not fold else {
                    "tap": lambda k, w: mlp_reduce.step(fold[0], k, w, layer)}
                return nnx.merge(graphdef, state)(h, cos=cos, sin=sin, mask=mask, positions=positions,
                                                  cache=cache, layer=layer, **tap)
            # prevent_cse only matters outside scan (JAX's advice for remat inside scan is False).
            return jax.checkpoint(apply, prevent_cse=not self.scan_layers) if self.remat else apply

        carry = (h, cache) if mlp_reduce is None else (h, cache, mlp_reduce.init)
        if self.scan_layers:
            graphdef, state = nnx.split(self.layers)
            apply = block_fn(graphdef)

            def body(carry, xs):
                layer_state, layer = xs
                h, cache, *fold = carry
                return apply(layer_state, h, cache, layer, *fold), None

            carry, _ = jax.lax.scan(body, carry, (state, jnp.arange(cfg.num_layers)))
        else:
            for i, block in enumerate(self.layers):
                graphdef, state = nnx.split(block)
                h, cache, *fold = carry
                carry = block_fn(graphdef)(state, h, cache, i, *fold)
        h, cache, *fold = carry
        h = self.final_norm(h)
        out = h if return_hidden else matmul(h, self.unembedding(), dtype=self.dtype)
        return (out, cache, *fold)

    def _check_inputs(self, tokens, positions, cache, attention_mask, segment_ids,
                      prefix_ids, kv_window) -> None:
        v.check_rank("tokens", tokens, rank=2)
        v.check_same_shape(("tokens", "positions"), tokens, positions)
        for name, x in (("tokens", tokens), ("positions", positions)):
            if not jnp.issubdtype(x.dtype, jnp.integer):
                raise TypeError(f"`{name}` must be an integer array, got dtype {x.dtype}")
        b, s = tokens.shape
        if cache is not None and cache.batch != b:
            raise ValueError(f"cache has {cache.batch} rows but `tokens` has shape {(b, s)}")
        if kv_window is not None:
            if cache is None:
                raise ValueError("`kv_window` bounds the cache slots attended over: it needs a cache")
            if isinstance(kv_window, bool) or not isinstance(kv_window, int) or not (
                    1 <= kv_window <= cache.max_len):
                raise ValueError(f"`kv_window` must be a static int in [1, {cache.max_len}] (the "
                                 f"cache's length), got {kv_window!r}")
        if segment_ids is not None:
            if cache is not None:
                raise ValueError("`segment_ids` (packed rows) are for a forward pass without a "
                                 "cache; got a cache too")
            v.check_same_shape(("tokens", "segment_ids"), tokens, segment_ids)
        if prefix_ids is not None:
            if segment_ids is None:
                raise ValueError("`prefix_ids` name segments: they need `segment_ids`")
            v.check_same_shape(("tokens", "prefix_ids"), tokens, prefix_ids)
        if attention_mask is not None:
            want = (b, s) if cache is None else (b, cache.max_len)
            if tuple(attention_mask.shape) != want:
                raise ValueError(f"`attention_mask` has shape {tuple(attention_mask.shape)}, expected {want} "
                                 f"({'[B,S] like tokens' if cache is None else '[B,M] over cache slots'})")


def unrolled(model: Decoder) -> Decoder:
    """The same model with ``scan_layers=False``: layer ``i``'s parameters are slices ``[i]`` of the
    stacked ones (one copy of the layer weights; the model itself is unchanged). An unrolled model is
    returned as is.

    Why: decoding runs one small forward pass per generated token. Inside the layer scan XLA's CPU
    backend slices each layer's weights out of the stacked arrays with a copy on every step, which
    doubles the time of a decode step of SmolLM2-135M (``experiments/bench/sampler.py``: 10.4 vs
    5.3 s for 16 rows x 64 tokens); unrolled, each matmul reads its own weight buffer.
    """
    if not model.scan_layers:
        return model
    out = nnx.merge(*_unrolled_skeleton(model.config, model.dtype, model.param_dtype, model.remat,
                                        model.attention), copy=True)  # fresh Variables per call
    stacked = nnx.state(model.layers)
    for i, block in enumerate(out.layers):
        nnx.update(block, jax.tree.map(lambda x, i=i: x[i], stacked))
    nnx.update(out.final_norm, nnx.state(model.final_norm))
    out.embed = nnx.Param(model.embed[...])
    if model.lm_head is not None:
        out.lm_head = nnx.Param(model.lm_head[...])
    return out


@functools.lru_cache(maxsize=16)
def _unrolled_skeleton(cfg: ModelConfig, dtype, param_dtype, remat: bool, attention: str):
    """``(graphdef, abstract state)`` of an unrolled Decoder. Tracing the constructor takes seconds
    (NNX builds 30 layers' modules and initialisers) and every engine (one per rollout) unrolls the
    model: the skeleton is built once per architecture and filled with the current weights."""
    return nnx.split(nnx.eval_shape(lambda: Decoder(cfg, dtype=dtype, param_dtype=param_dtype,
                                                    scan_layers=False, remat=remat,
                                                    attention=attention, rngs=nnx.Rngs(0))))
