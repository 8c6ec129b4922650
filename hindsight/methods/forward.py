"""Model passes over a batch context and the LM head every method loss goes through.

:func:`context_hidden` runs a decoder on one context of the batch and gathers the hidden states
that predict the response tokens (``[B, T, D]``), with the model's unembedding ``[D, V]``.
:func:`vocab_rows` projects several such sides through the :class:`LMHead` (backend, block size,
vocabulary mask) and applies a per-position function to their log-softmaxes; :func:`vocab_sum`
does the same for a loss that is a sum of per-position terms with known coefficients, whose
gradient the fused backend forms in the forward pass (no logits recomputed). With the ``scan``
and ``fused`` backends float32 ``[B, T, V]`` logits never exist, in the forward or the backward
pass. :func:`distill_term` is the token-mean term of a per-position divergence.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp

from hindsight._validation import check_choice
from hindsight.batch import PACKED_KEYS, context_key, is_packed
from hindsight.objectives import aggregate, term
from hindsight.ops import LM_HEAD_BACKENDS, LM_HEAD_DEFAULT, lm_head_map, lm_head_sum


class Side(NamedTuple):
    """One model on one context: its output ``hidden [B, S, D]``, the positions ``index [B, T]``
    whose states predict the response (``hidden[b, index[b, t]]`` predicts ``targets[b, t]``) and
    ``unembed [D, V]``; ``frozen`` sides (teachers, references) get no gradient, and the LM head
    spends no backward work on them. The LM head reads the rows from ``hidden`` itself
    (:func:`hindsight.ops.lm_head_map`'s ``index``), so no gathered ``[B, T, D]`` copy is made."""
    hidden: jax.Array
    index: jax.Array
    unembed: jax.Array
    frozen: bool = False

    def rows(self) -> jax.Array:
        """The states at the response positions, ``[B, T, D]`` (a gathered copy)."""
        return jnp.take_along_axis(self.hidden, self.index[..., None], axis=1)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LMHead:
    """How a loss projects hidden states to the vocabulary (``train.lm_head``).

    Attributes:
      backend: ``"scan"`` (blocks of rows in a ``lax.scan`` under remat), ``"fused"`` (the
        default, :data:`hindsight.ops.LM_HEAD_DEFAULT`: blocks in a custom-VJP scan that
        recomputes each block's logits in the backward pass and accumulates the unembedding
        gradient in float32 tiles) or ``"dense"`` (all logits at once: the
        reference, for small vocabularies); see :func:`hindsight.ops.lm_head_map`.
      chunk_size: rows per block (None: the backend's default for the vocabulary size).
      vocab_mask: optional ``[V]`` bool, True for real vocabulary entries; padded rows of the
        unembedding (the Qwen family pads 151,665 tokens to 151,936) then take no probability.
    """
    backend: str = dataclasses.field(default=LM_HEAD_DEFAULT, metadata=dict(static=True))
    chunk_size: int | None = dataclasses.field(default=None, metadata=dict(static=True))
    vocab_mask: jax.Array | None = None

    def __post_init__(self):
        check_choice("backend", self.backend, LM_HEAD_BACKENDS)
        c = self.chunk_size
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
            raise ValueError(f"`chunk_size` must be a positive int or None, got {c!r}")


def context_hidden(model, batch: Mapping, context: str | None = None, *,
                   frozen: bool = False) -> Side:
    """Hidden states predicting ``batch["targets"]`` after ``context``, and the unembedding.

    Args:
      model: a decoder, ``model(tokens, positions, *, attention_mask, return_hidden)`` returning
        ``(out, cache)``, with ``model.unembedding() -> [D, V]``.
      batch: the batch dict (:mod:`hindsight.batch`).
      context: None for the policy context (``tokens``, ...), else a context name (``"teacher"``
        reads ``teacher_tokens``, ``teacher_positions``, ``teacher_attention_mask``,
        ``teacher_target_index``); a packed context (``{context}_packed_tokens``,
        :mod:`hindsight.packing`) runs over its packed rows instead.
      frozen: wrap both outputs in ``stop_gradient`` (teachers, references): no gradient flows and
        the pass is never differentiated.
    Returns:
      :class:`Side` ``(hidden [B, S, D], index [B, T], unembed [D, V], frozen)``, ``index`` being
      ``{context}_target_index``; for a packed context ``hidden`` is the gathered ``[B, T, D]``
      response states and ``index[b, t] = t``.
    """
    key = lambda k: context_key(context, k)
    index = jnp.asarray(batch[key("target_index")]).astype(jnp.int32)
    if is_packed(batch, context):
        hidden, index = _packed_hidden(model, batch, context, index)
    else:
        hidden, _ = model(batch[key("tokens")], batch[key("positions")],
                          attention_mask=batch[key("attention_mask")], return_hidden=True)
    unembed = model.unembedding()
    if frozen:
        return Side(jax.lax.stop_gradient(hidden), index, jax.lax.stop_gradient(unembed), True)
    return Side(hidden, index, unembed, False)


def _packed_hidden(model, batch: Mapping, context: str | None, index: jax.Array):
    """A packed context (:mod:`hindsight.packing`): the model over the ``C * R`` packed rows,
    then each row's response states gathered from its own chunk: ``(hidden [B, T, D], index
    [B, T] = t)``. The gather is batched over the chunk axis (the batch shards), so under a
    mesh it stays on each device."""
    tokens, positions, segments, prefixes = (jnp.asarray(batch[context_key(context, k)])
                                             for k in PACKED_KEYS)
    c, r, length = tokens.shape
    flat = lambda x: x.reshape(c * r, length)
    hidden, _ = model(flat(tokens), flat(positions), segment_ids=flat(segments),
                      prefix_ids=flat(prefixes), return_hidden=True)
    hidden = hidden.reshape(c, r * length, hidden.shape[-1])
    b, t = index.shape
    rows = jax.vmap(lambda h, i: jnp.take(h, i, axis=0))(hidden, index.reshape(c, b // c, t))
    return rows.reshape(b, t, -1), jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))


def gather(logp: jax.Array, tokens: jax.Array) -> jax.Array:
    """``logp [C, V]`` at ``tokens [C]`` -> ``[C]``."""
    return jnp.take_along_axis(logp, tokens[:, None].astype(jnp.int32), axis=-1)[:, 0]


def vocab_rows(row_fn: Callable, sides: Mapping[str, Side], targets: jax.Array, mask: jax.Array,
               *, head: LMHead | None = None, temperature: float = 1.0) -> dict[str, jax.Array]:
    """Per-position vocabulary reductions over named sides, through the LM head.

    Args:
      row_fn: ``row_fn(logp, tokens) -> dict of [C]`` where ``logp`` maps each side's name to
        its float32 log-softmax ``[C, V]`` (logits divided by ``temperature``, masked vocabulary
        at a large negative logit) and ``tokens [C]`` are the targets of those rows. Rows must be
        independent. Outputs that are metrics should be ``stop_gradient``'ed inside ``row_fn``.
      sides: ``{name: Side}``, e.g. from :func:`context_hidden`.
      targets: ``[B, T]`` int.
      mask: ``[B, T]`` loss mask (bool or 0/1 float). Masked positions see zero hidden states
        (the head's ``row_mask``), so whatever padding holds (NaN included) reaches neither a value
        nor a gradient; their outputs are those of uniform logits.
      head: the :class:`LMHead` (default: ``LMHead()``, the fused backend).
      temperature: divides every side's logits.
    Returns:
      ``row_fn``'s dict with each leaf ``[B, T]``.
    """
    names = tuple(sides)

    def row(logits, extras):
        logp = {n: jax.nn.log_softmax(z) for n, z in zip(names, logits)}
        return row_fn(logp, extras[0])

    return lm_head_map(row, *_head_args(sides, names), (targets,),
                       **_head_kwargs(sides, names, mask, head, temperature))


def vocab_sum(row_fn: Callable, sides: Mapping[str, Side], targets: jax.Array, mask: jax.Array,
              extras: Mapping[str, jax.Array] | None = None, *, head: LMHead | None = None,
              temperature: float = 1.0) -> tuple[jax.Array, dict]:
    """A sum of per-position losses over named sides, through the LM head
    (:func:`hindsight.ops.lm_head_sum`: the fused backend forms the gradient in the forward pass).

    Args:
      row_fn: ``row_fn(logp, tokens, extras) -> (loss [C], aux)``: ``logp`` and ``tokens`` as in
        :func:`vocab_rows`, ``extras`` the ``{name: [C, ...]}`` rows of ``extras``; ``loss`` the
        per-position contribution to the sum (its coefficient included, 0 at positions that do not
        count), ``aux`` a dict of ``[C]`` per-position values returned without gradient.
      sides, targets, mask, head, temperature: as in :func:`vocab_rows` (masked positions see zero
        hidden states).
      extras: ``{name: [B, T, ...]}`` per-position arrays (advantages, coefficients, ...).
    Returns:
      ``(total, aux)``: the float32 scalar sum (with gradient) and ``aux`` with leaves ``[B, T]``.
    """
    names, keys = tuple(sides), tuple(extras or {})

    def row(logits, ex):
        logp = {n: jax.nn.log_softmax(z) for n, z in zip(names, logits)}
        return row_fn(logp, ex[0], dict(zip(keys, ex[1:])))

    return lm_head_sum(row, *_head_args(sides, names), (targets,) + tuple(extras[k] for k in keys),
                       **_head_kwargs(sides, names, mask, head, temperature))


def _head_args(sides: Mapping[str, Side], names) -> tuple[list, list]:
    return [sides[n].hidden for n in names], [sides[n].unembed for n in names]


def _head_kwargs(sides: Mapping[str, Side], names, mask, head: LMHead | None,
                 temperature: float) -> dict:
    """The LM head's keywords for ``sides``: their positions, the loss mask as the row mask (masked
    positions see zero hidden states) and ``head``'s backend, block size and vocabulary mask."""
    head = LMHead() if head is None else head
    return dict(index=[sides[n].index for n in names], row_mask=jnp.asarray(mask) > 0,
                backend=head.backend, chunk_size=head.chunk_size, vocab_mask=head.vocab_mask,
                temperature=temperature, frozen=tuple(bool(sides[n].frozen) for n in names))


def context_mask(batch: Mapping, context: str, mask=None) -> jax.Array:
    """``[B, T]`` the loss mask (``mask``, default ``batch["mask"]``) with the rows that have no
    ``context`` cleared: those whose ``{context}_row_mask`` is 0 (:mod:`hindsight.batch`); the
    mask itself when the batch has none."""
    mask = batch["mask"] if mask is None else mask
    key = context_key(context, "row_mask")
    if key not in batch:
        return mask
    keep = (jnp.asarray(batch[key]) > 0)[:, None]
    return jnp.where(keep, mask, jnp.zeros((), jnp.asarray(mask).dtype))


def context_rows(batch: Mapping, context: str) -> tuple[jax.Array, jax.Array]:
    """``(rows with a context, rows)``, the metric pair of ``{context}_row_mask`` (every row when
    the batch has none)."""
    b = jnp.shape(batch["mask"])[0]
    key = context_key(context, "row_mask")
    have = (jnp.asarray(batch[key]) > 0).astype(jnp.float32) if key in batch else jnp.ones((b,))
    return jnp.sum(have), jnp.float32(b)


def distill_term(rows: dict, mask, *, loss: str, weight=1.0):
    """``(terms, metrics)`` of a distillation-only method: ``rows[loss] [B, T]`` as the token-mean
    term ``distill``; every other row of per-position values becomes a token-mean metric."""
    terms = {"distill": term(rows[loss], mask, weight=weight)}
    metrics = {name: aggregate(value, mask) for name, value in rows.items() if name != loss}
    return terms, metrics
