"""Decoder building blocks: RMSNorm, rotary embeddings, a dense layer and the SwiGLU MLP.

Dtype policy (shared by every module here): parameters are stored in `param_dtype`, matmuls take
their inputs in the compute `dtype` and accumulate in float32 (`preferred_element_type`), which on
CPU is both the accurate and the fast choice for bf16; norms and RoPE run in float32.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx

from hindsight.models.config import Llama3RopeScaling
from hindsight.ops._precision import physical_transpose


def matmul(x: jax.Array, w: jax.Array, *, dtype) -> jax.Array:
    """`x [..., I] @ w [I, O]` in `dtype` with float32 accumulation; returns float32 `[..., O]`.

    In a 16-bit `dtype` the backward pass runs in that dtype too (:func:`_low_precision_matmul`):
    the float32 cotangent is rounded to `dtype` before the two gradient matmuls, as the cotangent
    of a matmul that returned `dtype` would be. Float32 is a plain `jnp.matmul`."""
    if jnp.dtype(dtype) == jnp.float32:
        return jnp.matmul(x.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32)
    return _low_precision_matmul(x, w, jnp.dtype(dtype))


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def _low_precision_matmul(x, w, dtype):
    return _low_precision_fwd(x, w, dtype)[0]


def _low_precision_fwd(x, w, dtype):
    xd, wd = x.astype(dtype), w.astype(dtype)
    out = jnp.matmul(xd, wd, preferred_element_type=jnp.float32)
    # the dtypes ride along as zero-size arrays (residuals must be arrays)
    return out, (xd, wd, jnp.zeros((0,), x.dtype), jnp.zeros((0,), w.dtype))


def _low_precision_bwd(dtype, res, g):
    xd, wd, x_tag, w_tag = res
    gd = g.astype(dtype)
    f32 = jnp.float32
    # dx [..., I] = g [..., O] . w [I, O] over O (the right operand contracts its last axis)
    dx = jax.lax.dot_general(gd, wd, (((gd.ndim - 1,), (1,)), ((), ())),
                             preferred_element_type=f32)
    rows_x = xd.reshape(-1, xd.shape[-1])
    dw = jnp.matmul(physical_transpose(rows_x), gd.reshape(-1, gd.shape[-1]),
                    preferred_element_type=f32)
    return dx.astype(x_tag.dtype), dw.astype(w_tag.dtype)


_low_precision_matmul.defvjp(_low_precision_fwd, _low_precision_bwd)


class RMSNorm(nnx.Module):
    """RMSNorm over the last axis: statistics in float32, output in `dtype` (HF convention)."""

    def __init__(self, dim: int, *, eps: float, dtype, param_dtype):
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype))
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return _scaled(normed, self.scale[...], jnp.dtype(self.dtype))


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def _scaled(normed, scale, dtype):
    """``scale * normed`` in ``dtype``: ``normed [..., D]`` float32, ``scale [D]``.

    The backward pass forms the scale's gradient as one contraction over the rows in float32
    (the same products autodiff takes). Autodiff transposed the broadcast of ``scale`` into a sum
    over the leading axes in ``dtype``, which XLA:CPU ran as a float32 reduce-window of 32 x 32
    blocks inside the layer loop (SmolLM2's GRPO step, bf16, Zen 5: ~0.5 of 10.9 s in a profile
    for the two norms of 30 layers; 10.44-10.72 vs 10.89-10.90 s a step in two A/Bs; float32 the
    same within the spread) and rounded to bf16 in bf16 compute; here it stays float32 until it
    is cast to the parameter's dtype."""
    return _scaled_fwd(normed, scale, dtype)[0]


def _scaled_fwd(normed, scale, dtype):
    nd = normed.astype(dtype)
    return scale.astype(dtype) * nd, (nd, scale.astype(dtype), jnp.zeros((0,), scale.dtype))


def _scaled_bwd(dtype, res, g):
    nd, sd, scale_tag = res
    f32 = jnp.float32
    d = nd.shape[-1]
    d_normed = (g * sd).astype(f32)        # autodiff's: the product in `dtype`, cast back
    d_scale = jnp.einsum("nd,nd->d", g.reshape(-1, d).astype(f32), nd.reshape(-1, d).astype(f32))
    return d_normed, d_scale.astype(scale_tag.dtype)


_scaled.defvjp(_scaled_fwd, _scaled_bwd)


class Dense(nnx.Module):
    """`y = x @ kernel (+ bias)` with `kernel [in, out]` (the transpose of a torch Linear weight)."""

    def __init__(self, in_dim: int, out_dim: int, *, use_bias: bool, dtype, param_dtype, rngs: nnx.Rngs):
        init = jax.nn.initializers.normal(stddev=1.0 / math.sqrt(in_dim))
        self.kernel = nnx.Param(init(rngs.params(), (in_dim, out_dim), param_dtype))
        self.bias = nnx.Param(jnp.zeros((out_dim,), param_dtype)) if use_bias else None
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        y = matmul(x, self.kernel[...], dtype=self.dtype)
        if self.bias is not None:
            y = y + self.bias[...].astype(jnp.float32)
        return y.astype(self.dtype)


class SwiGLU(nnx.Module):
    """`down(silu(gate(x)) * up(x))`: `[..., D] -> [..., D]` through hidden size F."""

    def __init__(self, dim: int, hidden: int, *, dtype, param_dtype, rngs: nnx.Rngs):
        kw = dict(use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.gate_proj = Dense(dim, hidden, **kw)
        self.up_proj = Dense(dim, hidden, **kw)
        self.down_proj = Dense(hidden, dim, **kw)

    def __call__(self, x: jax.Array, *, tap: Callable | None = None):
        """``[..., D] -> [..., D]``; with ``tap``, ``(out, tap(activations, down_kernel))``: the
        post-activations ``silu(gate(x)) * up(x)`` ``[..., F]`` (compute dtype), the input of the
        down projection, and its kernel ``[F, D]`` (row ``i`` is neuron ``i``'s output weights)."""
        activations = jax.nn.silu(self.gate_proj(x)) * self.up_proj(x)
        if tap is None:
            return self.down_proj(activations)
        return self.down_proj(activations), tap(activations, self.down_proj.kernel[...])


def rope_inv_freq(head_dim: int, theta: float, scaling: Llama3RopeScaling | None = None) -> jax.Array:
    """Inverse frequencies `[head_dim // 2]` (float32), with Llama-3 frequency-dependent scaling:
    long wavelengths are divided by `factor`, short ones kept, the band between interpolated."""
    inv = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    if scaling is None:
        return inv
    old_ctx = scaling.original_max_position_embeddings
    low_wavelen = old_ctx / scaling.low_freq_factor
    high_wavelen = old_ctx / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = jnp.where(wavelen > low_wavelen, inv / scaling.factor, inv)
    smooth = (old_ctx / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return jnp.where(medium, smoothed, scaled)


def rope_tables(positions: jax.Array, inv_freq: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`positions [B,S]` -> `(cos, sin)`, each float32 `[B,S,hd]` (frequencies repeated twice, HF layout)."""
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate-half RoPE. `x [B,S,N,hd]`, `cos/sin [B,S,hd]`; computed in float32, returned in x.dtype."""
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    out = x32 * cos[:, :, None, :] + rotated * sin[:, :, None, :]
    return out.astype(x.dtype)
