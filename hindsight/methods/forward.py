"""Model passes over a batch context and the chunked LM head every method loss goes through.

:func:`context_hidden` runs a decoder on one context of the batch and gathers the hidden states
that predict the response tokens (``[B, T, D]``), with the model's unembedding ``[D, V]``.
:func:`vocab_rows` projects several such sides chunk by chunk (:func:`hindsight.ops.chunked_map`)
and applies a per-position function to their log-softmaxes, so float32 ``[B, T, V]`` logits never
exist, in the forward or the backward pass.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp

from hindsight.methods.batch import context_key
from hindsight.objectives import aggregate
from hindsight.ops import chunked_map

Side = tuple[jax.Array, jax.Array]
"""``(hidden [B, T, D], unembed [D, V])``: one model on one context, at the response positions."""


def context_hidden(model, batch: Mapping, context: str | None = None, *,
                   frozen: bool = False) -> Side:
    """Hidden states predicting ``batch["targets"]`` after ``context``, and the unembedding.

    Args:
      model: a decoder, ``model(tokens, positions, *, attention_mask, return_hidden)`` returning
        ``(out, cache)``, with ``model.unembedding() -> [D, V]``.
      batch: the batch dict (:mod:`hindsight.methods.batch`).
      context: None for the policy context (``tokens``, ...), else a context name (``"teacher"``
        reads ``teacher_tokens``, ``teacher_positions``, ``teacher_attention_mask``,
        ``teacher_target_index``).
      frozen: wrap both outputs in ``stop_gradient`` (teachers, references): no gradient flows and
        the pass is never differentiated.
    Returns:
      ``(hidden [B, T, D], unembed [D, V])``, ``hidden[b, t]`` being the state at
      ``{context}_target_index[b, t]``.
    """
    key = lambda k: context_key(context, k)
    hidden, _ = model(batch[key("tokens")], batch[key("positions")],
                      attention_mask=batch[key("attention_mask")], return_hidden=True)
    index = jnp.asarray(batch[key("target_index")]).astype(jnp.int32)
    hidden = jnp.take_along_axis(hidden, index[..., None], axis=1)
    unembed = model.unembedding()
    if frozen:
        return jax.lax.stop_gradient(hidden), jax.lax.stop_gradient(unembed)
    return hidden, unembed


def gather(logp: jax.Array, tokens: jax.Array) -> jax.Array:
    """``logp [C, V]`` at ``tokens [C]`` -> ``[C]``."""
    return jnp.take_along_axis(logp, tokens[:, None].astype(jnp.int32), axis=-1)[:, 0]


def vocab_rows(row_fn: Callable, sides: Mapping[str, Side], targets: jax.Array, *,
               chunk_size: int | None = None, temperature: float = 1.0) -> dict[str, jax.Array]:
    """Per-position vocabulary reductions over named sides, chunk by chunk.

    Args:
      row_fn: ``row_fn(logp, tokens) -> dict of [C]`` where ``logp`` maps each side's name to
        its float32 log-softmax ``[C, V]`` (logits divided by ``temperature``) and ``tokens [C]``
        are the targets of those rows. Rows must be independent. Outputs that are metrics should be
        ``stop_gradient``'ed inside ``row_fn``.
      sides: ``{name: (hidden [B, T, D_i], unembed [D_i, V])}``, e.g. from :func:`context_hidden`.
      targets: ``[B, T]`` int.
      chunk_size: rows per block (None: :func:`hindsight.ops.default_chunk_size`).
      temperature: divides every side's logits.
    Returns:
      ``row_fn``'s dict with each leaf ``[B, T]``.
    """
    names = tuple(sides)

    def row(logits, extras):
        logp = {n: jax.nn.log_softmax(z) for n, z in zip(names, logits)}
        return row_fn(logp, extras[0])

    return chunked_map(row, [sides[n][0] for n in names], [sides[n][1] for n in names],
                       (targets,), chunk_size=chunk_size, temperature=temperature)


def aggregate_rows(rows: dict, mask, *, loss: str):
    """``(sum, count, metrics)``: token-mean of ``rows[loss] [B,T]`` is the loss; every other row of
    per-position values is aggregated over the same mask as a ``(sum, count)`` metric."""
    total, count = aggregate(rows[loss], mask)
    metrics = {name: aggregate(value, mask) for name, value in rows.items() if name != loss}
    metrics[loss] = (jax.lax.stop_gradient(total), count)
    return total, count, metrics
