"""The dtype of the LM head's products, and a transpose XLA:CPU's fast 16-bit matmul needs.

The model computes in its compute dtype (``model.dtype``) with float32 parameters; its hidden
states arrive here in that dtype. The LM head's products take it too: the unembedding is rounded
to the hidden states' 16-bit dtype and each product accumulates in float32, as the model's own head
(``models.layers.matmul(h, unembedding, dtype=model.dtype)``) does when it decodes or scores. So
the trainer's log-probs are the sampler's numbers, and in bf16 the three ``[N, D] x [D, V]``
products of a trained side run at the bf16 matmul rate (SmolLM2's GRPO step on the Zen 5: the LM
head's products ran in float32 against bf16 hidden states before). With float32 hidden states
nothing changes.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

_LOW = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def product_dtype(h):
    """The 16-bit float dtype of hidden states ``h`` (the compute dtype the products take), or
    None for float32 ones (float32 products)."""
    dt = jnp.dtype(jnp.result_type(h))
    return dt if dt in _LOW else None


def as_operand(w, h):
    """Unembedding (slab) ``w`` in the products' dtype for hidden states ``h``."""
    low = product_dtype(h)
    return w if low is None else w.astype(low)


def physical_transpose(a: jax.Array) -> jax.Array:
    """`a [M, N] -> [N, M]` as a copy XLA cannot fold back into the dot that reads it.

    Why: XLA:CPU runs a bf16 x bf16 -> f32 dot on its fast path (YNNPACK, ~4x the float32 rate on
    AMX) only when the left operand contracts its last axis; a weight gradient `x^T @ g` contracts
    the rows, so XLA folds the transpose into the dot, finds no bf16 kernel and converts both
    operands to float32 (measured 210 vs 860 GFLOP/s for `[576, 5120] @ [5120, 1536]`). The flat
    barrier keeps the transposed copy; other backends take the transpose as is."""
    if jax.default_backend() != "cpu":
        return a.T
    return jax.lax.optimization_barrier(a.T.reshape(-1)).reshape(a.shape[1], a.shape[0])
