"""Shared plumbing of the chunked LM-head path: argument checks, row chunking and the projection.

Positions ``[..., D]`` are flattened to ``N`` rows and padded to a whole number of chunks of ``C``
rows (``[N, D] -> [N / C, C, D]``); padding rows are zeros, and every caller drops (or zero-weights)
them, so they never contribute to a value or a gradient.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from hindsight._validation import check_rank, check_static_float, shape_of
from hindsight.ops._precision import as_operand
from hindsight.ops.logprobs import masked_logits

BLOCK_ELEMENTS = 2 ** 24
"""Default budget of logits per block: ``chunk_size * V <= 2**24`` (64 MiB of float32). The scan body
holds a handful of such blocks (about 8 for the JSD with its gradient); at ``V = 151,936`` this gives
64 rows, whose ``[64, D] @ [D, V]`` products still run at full matmul speed on CPU."""


def default_chunk_size(vocab: int) -> int:
    """Largest power of two with ``chunk * vocab <= BLOCK_ELEMENTS``, clipped to ``[8, 1024]``."""
    rows = max(1, BLOCK_ELEMENTS // max(vocab, 1))
    return int(min(1024, max(8, 2 ** (rows.bit_length() - 1))))


def check_projection(pairs: Sequence[tuple[str, jax.Array, str, jax.Array]]) -> tuple[tuple, int]:
    """Validate ``(hidden_name, hidden [..., D_i], unembed_name, unembed [D_i, V])`` pairs.

    Every hidden tensor must share one leading shape and every unembedding one vocabulary size.
    Returns ``(lead, V)``: the shared leading shape and the vocabulary size.
    """
    lead = vocab = None
    first_h = first_w = None
    for hn, h, wn, w in pairs:
        check_rank(hn, h, min_rank=1)
        check_rank(wn, w, rank=2)
        hs, ws = shape_of(h), shape_of(w)
        if hs[-1] != ws[0]:
            raise ValueError(f"`{hn}` has hidden size {hs[-1]} (shape {hs}) but `{wn}` expects "
                             f"{ws[0]} (shape {ws}, i.e. [D, V])")
        if lead is None:
            lead, vocab, first_h, first_w = hs[:-1], ws[1], hn, wn
        if hs[:-1] != lead:
            raise ValueError(f"`{hn}` has leading shape {hs[:-1]} (shape {hs}) but `{first_h}` has "
                             f"{lead}; every hidden tensor must cover the same positions")
        if ws[1] != vocab:
            raise ValueError(f"vocab mismatch: `{wn}` has vocab {ws[1]} (shape {ws}) but "
                             f"`{first_w}` has {vocab}; pad the smaller vocabulary and pass "
                             f"`vocab_mask`")
    return lead, vocab


def check_vocab_mask(vocab_mask, vocab: int) -> None:
    if vocab_mask is not None and shape_of(vocab_mask) != (vocab,):
        raise ValueError(f"`vocab_mask` must have shape ({vocab},) to match the unembedding, got "
                         f"{shape_of(vocab_mask)}")


def check_temperature(temperature) -> float:
    t = check_static_float("temperature", temperature)
    if not t > 0.0:
        raise ValueError(f"`temperature` must be > 0, got {t}")
    return t


def check_extra(name: str, x, lead: tuple) -> None:
    s = shape_of(x)
    if s[: len(lead)] != tuple(lead):
        raise ValueError(f"`{name}` has shape {s}, expected leading dims {tuple(lead)} to match the "
                         f"hidden states")


def chunk_rows(lead: tuple, vocab: int, chunk_size: int | None) -> int:
    """Rows per block for positions ``lead``: ``chunk_size`` (``None``: :func:`default_chunk_size`),
    but never more than the number of rows (a short input is one unpadded block)."""
    if chunk_size is None:
        chunk_size = default_chunk_size(vocab)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"`chunk_size` must be a positive Python int or None, got {chunk_size!r}")
    return max(1, min(chunk_size, math.prod(lead)))


def to_chunks(x: jax.Array, lead: tuple, chunk: int) -> jax.Array:
    """``[*lead, ...] -> [num_chunks, chunk, ...]``, zero-padding the flattened rows."""
    n = math.prod(lead)
    x = jnp.reshape(x, (n,) + shape_of(x)[len(lead):])
    pad = -n % chunk
    if pad:
        x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
    return jnp.reshape(x, (-1, chunk) + shape_of(x)[1:])


def from_chunks(y: jax.Array, lead: tuple) -> jax.Array:
    """``[num_chunks, chunk, ...] -> [*lead, ...]``, dropping padding rows."""
    n = math.prod(lead)
    y = jnp.reshape(y, (-1,) + shape_of(y)[2:])[:n]
    return jnp.reshape(y, tuple(lead) + shape_of(y)[1:])


def shifted_block(j, size: int, total: int) -> tuple[jax.Array, jax.Array]:
    """``(start, fresh [size] bool)`` of block ``j`` of ``size`` items over ``total >= size`` items.

    Block ``j`` covers ``[start, start + size)`` with ``start = min(j * size, total - size)``: the last
    block is shifted back to end at ``total`` instead of running past it, and its items below
    ``j * size`` (already covered by the block before) are not ``fresh``. Blocked loops use this
    instead of padding, which would copy the padded arrays."""
    start = jnp.minimum(j * size, total - size)
    return start, start + jnp.arange(size) >= j * size


def put_rows(out: jax.Array, start, fresh: jax.Array, rows: jax.Array) -> jax.Array:
    """``out[start:start + C] = rows`` where ``fresh``, in place (stale rows keep their values)."""
    old = jax.lax.dynamic_slice_in_dim(out, start, shape_of(rows)[0], axis=0)
    keep = jnp.reshape(fresh, (-1,) + (1,) * (rows.ndim - 1))
    return jax.lax.dynamic_update_slice_in_dim(out, jnp.where(keep, rows, old), start, axis=0)


def temper_and_mask(z: jax.Array, vocab_mask: jax.Array | None, temperature: float) -> jax.Array:
    """Float32 logits from raw projections ``z [C, V]``: divided by the temperature, then masked.

    The temperature divides before masking so that padded entries keep exactly ``PAD_LOGIT``.
    """
    if temperature != 1.0:
        z = z / temperature
    return masked_logits(z, vocab_mask)


def project_rows(h: jax.Array, rows_t: jax.Array, vocab_mask: jax.Array | None,
                 temperature: float) -> jax.Array:
    """:func:`project` through the transposed unembedding ``rows_t [V, D]``: ``h @ rows_t.T``."""
    return temper_and_mask(jax.lax.dot_general(h, as_operand(rows_t, h),
                                               (((h.ndim - 1,), (1,)), ((), ())),
                                               preferred_element_type=jnp.float32),
                           vocab_mask, temperature)


def project(h: jax.Array, w: jax.Array, vocab_mask: jax.Array | None, temperature: float) -> jax.Array:
    """Float32 logits ``[C, V]`` of ``h [C, D] @ w [D, V]``, tempered then vocab-masked.

    ``w`` is rounded to ``h``'s 16-bit dtype if it has one (:mod:`hindsight.ops._precision`);
    ``preferred_element_type`` makes bf16 operands accumulate in float32 inside the matmul.
    """
    return temper_and_mask(jnp.matmul(h, as_operand(w, h), preferred_element_type=jnp.float32),
                           vocab_mask, temperature)
