"""The LM head of the training path: per-row functions of the logits of hidden states, three backends.

:func:`lm_head_map` projects hidden states ``[..., D_i]`` through unembeddings ``[D_i, V]`` and applies
a per-row function to the float32 logits. The caller may do anything with its per-row outputs
(nonlinear functions, mixing rows) and differentiate through them; the backends differ only in how
the logits and their gradients are scheduled:

* ``"scan"``: blocks of rows in a ``lax.scan`` whose body is under ``jax.checkpoint``. JAX
  differentiates the scan: the backward pass recomputes each block's logits and accumulates each
  unembedding's gradient across blocks in the unembedding's own dtype, adding each block's whole
  ``[D, V]`` contribution (one extra gradient-sized buffer).
* ``"fused"``: the same blocks in a ``jax.custom_vjp`` whose forward scan keeps no residuals beyond
  its inputs, and whose backward scan recomputes each block's logits, takes ``jax.vjp`` of the
  per-row function with the incoming per-row cotangents, and then runs one loop over vocabulary
  tiles of :data:`VOCAB_TILE` rows of the unembedding: each tile adds its share of the block's
  hidden-state gradient (written in place per block) and adds ``dlogits_t^T h`` to its rows of the
  unembedding's float32 gradient accumulator, in place (:func:`_tile_pass`); the accumulator is
  cast to the unembedding's dtype once at the end. Inputs that are not differentiated
  (``stop_gradient``, or sides marked ``frozen``) and outputs whose cotangent is zero cost nothing
  in the backward pass: the rule sees them as symbolic zeros. Only reverse mode: ``jax.jvp`` (and so
  forward-over-reverse Hessians) is not supported. It recomputes the logits once (a fourth
  ``[N, D] x [D, V]`` matmul where the dense backend needs three, plus one per frozen side whose
  logits the gradient reads), so it is slower than dense when the matmuls dominate.
* ``"dense"``: all rows at once (float32 ``[N, V]`` logits per side); the reference, and the fastest
  choice for small vocabularies.

:func:`lm_head_sum` is the same head for an objective that is a *sum* of per-row losses whose
coefficients are known before the head runs (a token-mean policy term over a known count): its
fused backend forms the gradient in the forward pass (each block's logits once, ``jax.vjp`` of the
row loss with a unit cotangent, the tile pass), so the backward pass only scales it, and nothing is
recomputed: three matmuls per trained side, as dense.

The block loops take every unembedding in its memory orientation: a tied model's ``embed.T`` runs
as the ``[V, D]`` table itself (no transposed copy, and the gradient accumulates in the table's
layout), an untied ``[D, V]`` matrix as given (see :func:`_is_transpose`).

:func:`lm_head_sum`'s fused forward scan projects a block one :data:`hindsight.ops._projection.PROJECTION_TILE` slab of the
unembedding at a time, into the block's logits in place (:func:`_project_tiled`): one whole
``[C, D] x [D, V]`` product makes the CPU matmul hold a scratch result about the size of the
block's logits besides them (measured at C = 64, V = 151,936: 36 MiB of resident memory, the
difference between 7.7x and 9.8x less working memory than dense for GRPO's policy term), which
the slabs do not. The other scans keep the one product: in :func:`lm_head_map`'s backward pass
the slabs cost OPSD 13% of its time (measured 21.4 vs 19.3 s). The logits are the same numbers
either way up to the matmul's float32 rounding.

Rows can be read from a decoder's whole output (``index``): a side ``[B, S, D]`` with positions
``[B, T]``. The fused blocks gather their rows from it and add their gradient into a ``[B, S, D]``
gradient, so there is neither a gathered ``[B, T, D]`` copy nor a scatter of its gradient into
``[B, S, D]`` (two ``[N, D]`` float32 buffers that grow with the tokens); ``row_mask`` zeroes the
hidden states of masked rows inside the blocks.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from hindsight._validation import check_choice, shape_of
from hindsight.ops._chunking import (check_extra, check_projection, check_temperature,
                                     check_vocab_mask, chunk_rows, from_chunks, put_rows,
                                     shifted_block, temper_and_mask, to_chunks)
from hindsight.ops._precision import as_operand, physical_transpose, product_dtype
from hindsight.ops._projection import (_is_transpose, _logits, _operand, _project_raw,
                                       _project_sides, _project_tiled)

BACKENDS = ("scan", "fused", "dense")

DEFAULT_BACKEND = "fused"
"""The training default (``train.lm_head``): at V = 151,936 and 1,024 tokens it needs about 9.5x
less working memory than dense logits for GRPO's and PCSD's losses (13x for OPSD's), growing 1.4x
from 1,024 to 8,192 tokens, where ``scan`` saves about 2x (``experiments.bench.logits_memory``,
README); :func:`lm_head_map` recomputes the logits in the backward pass, :func:`lm_head_sum` does
not."""

VOCAB_TILE = 1024
"""Vocabulary rows of the unembedding per step of the fused backward pass's tile loop. Each step
reads one ``[VOCAB_TILE, D]`` slab of the unembedding and the matching ``[C, VOCAB_TILE]`` columns
of the block's logit cotangents, adds their product to the block's hidden-state gradient and adds
``dlogits_t^T @ h`` to the slab's rows of the float32 gradient accumulator, in place. One whole-row
``[C, V] @ [V, D]`` product (contracting over ``V``) and one ``[D, C] @ [C, V]`` update run at
about half the matmul rate on CPU; slabs of 1,024 to 2,048 rows run near it (1,024 measured
5-10% faster than 2,048 in PCSD's loss at V = 151,936, D = 1,024, C = 64, in three runs side by
side)."""





class _Spec(NamedTuple):
    row_fn: Callable               # row_fn(logits, extras, *consts) (fused: closure-converted)
    lead: tuple                    # leading shape L of the positions
    chunk: int                     # rows per block
    temperature: float
    rows: tuple = ()               # per side: project through the transposed unembedding [V, D]
    side_w: tuple = ()             # fused: index into the distinct unembeddings of each side


def lm_head_map(row_fn: Callable, hiddens: Sequence[jax.Array], unembeds: Sequence[jax.Array],
                extras: Sequence[jax.Array] = (), *, index: Sequence | None = None,
                row_mask: jax.Array | None = None, backend: str = DEFAULT_BACKEND,
                frozen: Sequence[bool] | None = None, chunk_size: int | None = None,
                vocab_mask: jax.Array | None = None, temperature: float = 1.0):
    """Apply ``row_fn`` to the logits of every position, with the LM head scheduled by ``backend``.

    Args:
      row_fn: ``row_fn(logits, extras) -> pytree of [C, ...]``, where ``logits`` is a tuple with one
        float32 ``[C, V]`` array per hidden tensor (``hiddens[i] @ unembeds[i]``, divided by
        ``temperature``, padded vocabulary at ``PAD_LOGIT``) and ``extras`` a tuple of the matching
        ``[C, ...]`` rows of each extra. Rows must be independent inside ``row_fn`` (no mixing across
        the ``C`` axis; what the caller does with the outputs is unrestricted). ``C`` is the block
        size (``"dense"``: all positions). It may close over arrays, traced ones included; the fused
        backend differentiates those too.
      hiddens: sequence of ``[..., D_i]`` arrays sharing one leading shape ``L`` (e.g. ``[B, T]``);
        a side with an ``index`` is ``[*L[:-1], S_i, D_i]`` instead (e.g. a decoder's whole output
        ``[B, S, D]``).
      unembeds: sequence of ``[D_i, V]`` arrays, one per hidden tensor, all with the same ``V``.
        Passing the same array for several sides shares one gradient accumulator (fused).
      extras: sequence of per-position arrays ``[*L, ...]`` (token ids, float targets, ...); float
        extras get gradients, integer ones none.
      index: None, or one entry per side: None (the side's hidden states are at the positions,
        ``[*L, D_i]``) or an int array ``[*L]`` of positions along the side's ``S_i`` axis, the row
        at ``(..., t)`` being ``hiddens[i][..., index[i][..., t], :]`` (the states that predict a
        response, read from the decoder's output). The fused backend reads each block's rows from
        the output itself and adds their gradient into a gradient shaped like it: no gathered
        ``[*L, D]`` copy and no scatter of its gradient. Repeated positions add their gradients.
      row_mask: optional ``[*L]`` bool (or 0/1): rows where it is False see zero hidden states on
        every side, so whatever the hidden states hold there (NaN included) reaches neither a value
        nor a gradient.
      backend: one of :data:`BACKENDS`: ``"scan"``, ``"fused"`` or ``"dense"`` (see the module
        docstring).
      frozen: static bools, one per side (hidden, unembedding): a frozen side (teacher, reference
        model) is a constant, as if both its arrays were wrapped in ``jax.lax.stop_gradient``, and
        gets no gradient work in the backward pass (no matmul, no ``[D, V]`` accumulator). None: no
        side is frozen. (The fused backend also skips any input the caller ``stop_gradient``-ed.)
      chunk_size: rows per block (static int; ignored by ``"dense"``); None picks
        :func:`~hindsight.ops.default_chunk_size` from V (64 at V = 151,936).
      vocab_mask: optional ``[V]`` bool, True for real vocabulary entries.
      temperature: static float > 0 dividing every logit.
    Returns:
      ``row_fn``'s pytree with the row axis unflattened: leaves ``[*L, ...]``.
    """
    spec, hiddens, unembeds, extras, sel = _prepare(
        row_fn, hiddens, unembeds, extras, index=index, row_mask=row_mask, backend=backend,
        frozen=frozen, chunk_size=chunk_size, vocab_mask=vocab_mask, temperature=temperature)
    if backend == "fused":
        return _fused_map(spec, hiddens, unembeds, extras, sel, vocab_mask)
    return {"scan": _scan, "dense": _dense}[backend](spec, hiddens, unembeds, extras, vocab_mask)


def lm_head_sum(row_fn: Callable, hiddens: Sequence[jax.Array], unembeds: Sequence[jax.Array],
                extras: Sequence[jax.Array] = (), *, index: Sequence | None = None,
                row_mask: jax.Array | None = None, backend: str = DEFAULT_BACKEND,
                frozen: Sequence[bool] | None = None, chunk_size: int | None = None,
                vocab_mask: jax.Array | None = None, temperature: float = 1.0):
    """The sum over positions of a per-row loss of the logits, with its gradient formed in the
    forward pass (fused backend): no logits are recomputed.

    For objectives that are sums of per-position terms whose coefficients are known before the LM
    head runs (a token-mean policy term over a known count, ...): the fused backend's forward scan
    computes each block's logits once, takes ``jax.vjp`` of the row loss with a unit cotangent and
    runs the tile pass (:func:`_tile_pass`), so the gradients w.r.t. every differentiated input
    are ready when the forward pass ends, and the custom VJP's backward pass only scales them by
    the scalar cotangent: three ``[N, D] x [D, V]`` matmuls per trained side, as many as dense
    logits need, where :func:`lm_head_map`'s fused backend needs four. The price: the gradient is
    held ([N, D] per trained side and the unembedding's float32 ``[D, V]`` accumulator) from the
    forward pass on, and it is computed whenever the sum is differentiated, even when the
    cotangent turns out to be zero. Not differentiated (``jax.jit`` of the value alone), the sum
    runs the value-only scan of :func:`lm_head_map`.

    Args:
      row_fn: ``row_fn(logits, extras) -> (loss [C], aux)``, with ``logits`` and ``extras`` as in
        :func:`lm_head_map` (rows independent); ``loss`` the per-row float32 contribution to the
        sum (weighted by the caller, 0 at rows that do not count), ``aux`` a pytree of ``[C, ...]``
        per-row values returned without gradient (metrics).
      hiddens, unembeds, extras, index, row_mask, backend, frozen, chunk_size, vocab_mask,
      temperature: as in
        :func:`lm_head_map`; ``"scan"`` and ``"dense"`` sum :func:`lm_head_map`'s rows (JAX
        differentiates them: the references of the fused rule).
    Returns:
      ``(total, aux)``: ``total`` the float32 scalar sum of ``loss`` over every position (with
      gradient), ``aux`` with leaves ``[*L, ...]`` (``stop_gradient``).
    """
    def checked(logits, extras_c):
        out = row_fn(logits, extras_c)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ValueError(f"`row_fn` of lm_head_sum must return a pair (loss [C], aux), got "
                             f"{type(out).__name__}")
        loss, aux = out
        if shape_of(loss) != shape_of(logits[0])[:1]:
            raise ValueError(f"`row_fn`'s loss must have one value per row, shape "
                             f"{shape_of(logits[0])[:1]}, got {shape_of(loss)}")
        return jnp.asarray(loss, jnp.float32), jax.lax.stop_gradient(aux)

    spec, hiddens, unembeds, extras, sel = _prepare(
        checked, hiddens, unembeds, extras, index=index, row_mask=row_mask, backend=backend,
        frozen=frozen, chunk_size=chunk_size, vocab_mask=vocab_mask, temperature=temperature)
    if backend == "fused":
        total, aux = _fused_map(spec, hiddens, unembeds, extras, sel, vocab_mask,
                                call=_fused_sum_call)
    else:
        loss, aux = {"scan": _scan, "dense": _dense}[backend](spec, hiddens, unembeds, extras,
                                                             vocab_mask)
        total = jnp.sum(loss)
    return total, jax.lax.stop_gradient(aux)


def _prepare(row_fn, hiddens, unembeds, extras, *, index, row_mask, backend, frozen, chunk_size,
             vocab_mask, temperature):
    """Validate :func:`lm_head_map`'s arguments; ``(spec, hiddens, unembeds, extras, sel)`` with
    the frozen sides behind ``stop_gradient``. ``"scan"`` and ``"dense"`` get the rows gathered
    and masked here (JAX differentiates that); ``"fused"`` gets the hidden states as given and
    ``sel = (flat, mask)``, which its blocks apply row by row (:func:`_block_hidden`)."""
    hiddens, unembeds, extras = tuple(hiddens), tuple(unembeds), tuple(extras)
    check_choice("backend", backend, BACKENDS)
    if len(hiddens) != len(unembeds) or not hiddens:
        raise ValueError(f"`hiddens` and `unembeds` must be non-empty and of equal length, got "
                         f"{len(hiddens)} and {len(unembeds)}")
    index = _check_index(index, hiddens)
    # shapes as the rows will be: an indexed side [*L[:-1], S, D] stands for [*L, D]
    at_rows = [h if i is None else jax.ShapeDtypeStruct(shape_of(i) + shape_of(h)[-1:],
                                                        jnp.result_type(h))
               for h, i in zip(hiddens, index)]
    lead, vocab = check_projection([(f"hiddens[{i}]", h, f"unembeds[{i}]", w)
                                    for i, (h, w) in enumerate(zip(at_rows, unembeds))])
    check_vocab_mask(vocab_mask, vocab)
    for i, e in enumerate(extras):
        check_extra(f"extras[{i}]", e, lead)
    if row_mask is not None:
        if shape_of(row_mask) != tuple(lead):
            raise ValueError(f"`row_mask` must have the rows' shape {tuple(lead)}, got "
                             f"{shape_of(row_mask)}")
        row_mask = jnp.asarray(row_mask) > 0 if _inexact(row_mask) else jnp.asarray(row_mask, bool)
    frozen = _check_frozen(frozen, len(hiddens))
    spec = _Spec(row_fn, lead, chunk_rows(lead, vocab, chunk_size), check_temperature(temperature),
                 rows=tuple(map(_is_transpose, unembeds)))
    sg = jax.lax.stop_gradient
    hiddens = tuple(sg(h) if f else h for h, f in zip(hiddens, frozen))
    unembeds = tuple(sg(w) if f else w for w, f in zip(unembeds, frozen))
    if backend != "fused":
        hiddens = tuple(_select_rows(h, i, row_mask) for h, i in zip(hiddens, index))
        return spec, hiddens, unembeds, extras, None
    n = math.prod(lead)
    flat = tuple(None if i is None else _flat_index(i, shape_of(h)[-2]) for h, i in zip(hiddens, index))
    # sel: per side None (the hidden states are the rows) or the [N] rows of its [M, D] view,
    # and the [N] bool row mask (or None)
    return spec, hiddens, unembeds, extras, (flat, None if row_mask is None
                                              else jnp.reshape(row_mask, (n,)))


def _check_index(index, hiddens) -> tuple:
    if index is None:
        return (None,) * len(hiddens)
    index = tuple(index)
    if len(index) != len(hiddens):
        raise ValueError(f"`index` must have one entry (None or an int array) per side, "
                         f"{len(hiddens)}, got {len(index)}")
    for k, (i, h) in enumerate(zip(index, hiddens)):
        if i is None:
            continue
        if not jnp.issubdtype(jnp.result_type(i), jnp.integer):
            raise ValueError(f"`index[{k}]` must be an int array, got dtype {jnp.result_type(i)}")
        si, sh = shape_of(i), shape_of(h)
        if len(sh) != len(si) + 1 or sh[:-2] != si[:-1]:
            raise ValueError(f"`index[{k}]` of shape {si} needs `hiddens[{k}]` of shape "
                             f"{si[:-1] + ('S', 'D')}, got {sh}")
        if not isinstance(i, jax.core.Tracer):
            v = np.asarray(i)
            if v.size and (v.min() < 0 or v.max() >= sh[-2]):
                raise ValueError(f"`index[{k}]` must lie in [0, {sh[-2]}) (the positions of "
                                 f"`hiddens[{k}]`), got values in [{v.min()}, {v.max()}]")
    return index


def _select_rows(h, index, row_mask):
    """The rows the head projects, gathered and masked (the reference backends)."""
    if index is not None:
        h = jnp.take_along_axis(h, jnp.asarray(index, jnp.int32)[..., None], axis=-2)
    if row_mask is not None:
        # a select, not a product: 0 * NaN would still be NaN (and so would the gradients)
        h = jnp.where(row_mask[..., None], h, jnp.zeros((), h.dtype))
    return h


def _flat_index(index, positions: int):
    """``[*L]`` positions along a ``[*L[:-1], S, D]`` array -> ``[N]`` rows of its ``[M, D]`` view."""
    index = jnp.asarray(index, jnp.int32)
    lead = shape_of(index)
    base = jnp.reshape(jnp.arange(math.prod(lead[:-1]), dtype=jnp.int32) * positions,
                       lead[:-1] + (1,))
    return jnp.reshape(index + base, (-1,))



def _check_frozen(frozen, sides: int) -> tuple[bool, ...]:
    if frozen is None:
        return (False,) * sides
    frozen = tuple(frozen)
    if len(frozen) != sides or not all(isinstance(f, (bool, np.bool_)) for f in frozen):
        raise ValueError(f"`frozen` must be a sequence of {sides} static bools (one per side), got "
                         f"{frozen!r}")
    return tuple(bool(f) for f in frozen)


# ---- scan (remat) and dense: JAX differentiates them ----------------------------------------------

def _scan(spec, hiddens, unembeds, extras, vocab_mask):
    lead, chunk = spec.lead, spec.chunk
    operands = tuple(map(_operand, unembeds, spec.rows))

    def body(_, xs):
        h_c, e_c = xs
        return None, spec.row_fn(_logits(spec, h_c, operands, spec.rows, vocab_mask), e_c)

    xs = (tuple(to_chunks(h, lead, chunk) for h in hiddens),
          tuple(to_chunks(e, lead, chunk) for e in extras))
    # scan already stops XLA from merging iterations, so the CSE barrier of checkpoint is not needed.
    _, ys = jax.lax.scan(jax.checkpoint(body, prevent_cse=False), None, xs)
    return jax.tree.map(lambda y: from_chunks(y, lead), ys)


def _flat(x, lead):
    return jnp.reshape(x, (math.prod(lead),) + shape_of(x)[len(lead):])


def _unflat(y, lead):
    return jnp.reshape(y, tuple(lead) + shape_of(y)[1:])


def _dense(spec, hiddens, unembeds, extras, vocab_mask):
    lead = spec.lead
    # no loop: XLA folds a transposed unembedding into the matmul
    out = spec.row_fn(_logits(spec, tuple(_flat(h, lead) for h in hiddens), unembeds,
                              (False,) * len(unembeds), vocab_mask),
                      tuple(_flat(e, lead) for e in extras))
    return jax.tree.map(lambda y: _unflat(y, lead), out)


# ---- fused: custom VJP ------------------------------------------------------------------------------

@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _Perturbed:
    """Which inputs the backward pass differentiates (static: rides in the residuals' structure)."""
    hiddens: tuple
    unembeds: tuple
    extras: tuple
    consts: tuple


def _fused_map(spec, hiddens, unembeds, extras, sel, vocab_mask, *, call=None):
    """Closure-convert ``row_fn``, find the distinct unembeddings, and run ``call`` (default
    :func:`_fused_call`, :func:`lm_head_map`'s rule; :func:`_fused_sum_call` for the sum)."""
    # one accumulator per distinct unembedding array (a student and a trainable teacher sharing W)
    uniq, side_w, rows = [], [], []
    for w, r in zip(unembeds, spec.rows):
        k = next((k for k, u in enumerate(uniq) if u is w), None)
        if k is None:
            uniq.append(w)
            rows.append(r)
            k = len(uniq) - 1
        side_w.append(k)
    c = spec.chunk
    block = (tuple(jax.ShapeDtypeStruct((c, shape_of(uniq[0])[1]), jnp.float32) for _ in hiddens),
             tuple(jax.ShapeDtypeStruct((c,) + shape_of(e)[len(spec.lead):], jnp.result_type(e))
                   for e in extras))
    # closed-over traced arrays become explicit (differentiable) arguments of the custom VJP
    row_fn, consts = jax.closure_convert(spec.row_fn, *block)
    for leaf in jax.tree.leaves(jax.eval_shape(row_fn, *block, *consts)):
        if shape_of(leaf)[:1] != (c,):
            raise ValueError(f"`row_fn` must return arrays of [C, ...] per-row values (C = {c} rows "
                             f"per block), got an output of shape {shape_of(leaf)}")
    # from here on `rows` and the operands are per distinct unembedding
    spec = spec._replace(row_fn=row_fn, side_w=tuple(side_w), rows=tuple(rows))
    mask = None if vocab_mask is None else jnp.asarray(vocab_mask, bool)
    return (call or _fused_call)(spec, hiddens, tuple(map(_operand, uniq, rows)), extras,
                                 tuple(consts), sel, mask)


def _block_io(spec, j):
    """``(start, fresh, rows)`` of block ``j``: ``rows(x [n, ...]) -> [C, ...]`` (the last block is
    shifted back to end at row ``n``; its rows that are not ``fresh`` belong to the block before)."""
    start, fresh = shifted_block(j, spec.chunk, math.prod(spec.lead))
    return start, fresh, lambda x: jax.lax.dynamic_slice_in_dim(x, start, spec.chunk, axis=0)


def _sources(spec, hiddens, sel):
    """Each side's hidden states as the ``[rows, D]`` array its blocks read."""
    return tuple(_flat(h, spec.lead) if f is None else jnp.reshape(h, (-1, shape_of(h)[-1]))
                 for h, f in zip(hiddens, sel[0]))


def _block_hidden(hs, sel, rows):
    """Block rows of every side: a slice of the rows, or a gather of the positions of an indexed
    side, with masked rows at zero."""
    flat, mask = sel
    out = tuple(rows(h) if f is None else jnp.take(h, rows(f), axis=0) for h, f in zip(hs, flat))
    if mask is None:
        return out
    m = rows(mask)[:, None]
    return tuple(jnp.where(m, h, jnp.zeros((), h.dtype)) for h in out)


def _block_shapes(hs, c):
    return tuple(jax.ShapeDtypeStruct((c, shape_of(h)[-1]), jnp.result_type(h)) for h in hs)


def _fused_forward(spec, hiddens, uniq, extras, consts, sel, vocab_mask):
    """Per-row outputs, block by block (the last block shifted back, so nothing is padded);
    ``uniq``: the distinct unembeddings' loop operands (:func:`_operand`)."""
    lead = spec.lead
    hs, es = _sources(spec, hiddens, sel), tuple(_flat(e, lead) for e in extras)
    ws = tuple(uniq[k] for k in spec.side_w)
    rows = tuple(spec.rows[k] for k in spec.side_w)
    n = math.prod(lead)

    def rows_out(h_c, e_c):
        return spec.row_fn(_logits(spec, h_c, ws, rows, vocab_mask), e_c, *consts)

    shapes = jax.eval_shape(rows_out, _block_shapes(hs, spec.chunk),
                            tuple(e[:spec.chunk] for e in es))
    init = jax.tree.map(lambda s: jnp.zeros((n,) + s.shape[1:], s.dtype), shapes)

    def body(out, j):
        start, fresh, rows = _block_io(spec, j)
        y = rows_out(_block_hidden(hs, sel, rows), tuple(map(rows, es)))
        return jax.tree.map(lambda o, y: put_rows(o, start, fresh, y), out, y), None

    out, _ = jax.lax.scan(body, init, jnp.arange(-(-n // spec.chunk)))
    return jax.tree.map(lambda y: _unflat(y, lead), out)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused_call(spec, hiddens, uniq, extras, consts, sel, vocab_mask):
    return _fused_forward(spec, hiddens, uniq, extras, consts, sel, vocab_mask)


def _primals(hiddens, uniq, extras, consts, sel, vocab_mask):
    """The custom VJP's primal values and which of them are perturbed."""
    value = lambda t: jax.tree.map(lambda p: p.value, t)
    pert = lambda t: tuple(p.perturbed for p in t)
    flags = _Perturbed(pert(hiddens), pert(uniq), pert(extras), pert(consts))
    return tuple(map(value, (hiddens, uniq, extras, consts, sel, vocab_mask))), flags


def _fused_fwd(spec, hiddens, uniq, extras, consts, sel, vocab_mask):
    args, flags = _primals(hiddens, uniq, extras, consts, sel, vocab_mask)
    # residuals: the inputs only (no logits, no per-block values)
    return _fused_forward(spec, *args), (args, flags)


def _is_zero(ct) -> bool:
    return isinstance(ct, SymbolicZero) or getattr(ct, "dtype", None) == jax.dtypes.float0


def _inexact(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _fused_bwd(spec, res, ct):
    args, p = res
    hiddens, uniq, extras, consts, _, _ = args
    ct_leaves = jax.tree.leaves(ct, is_leaf=_is_zero)
    used = tuple(not _is_zero(x) for x in ct_leaves)
    if not any(used):
        return _no_grads(hiddens, uniq, extras, consts)
    cts = tuple(_flat(x, spec.lead) for x, u in zip(ct_leaves, used) if u)
    (d_h, d_w, d_e, d_c), _ = _grad_scan(spec, args, p, cts, used)
    return d_h, _cast_like(d_w, uniq), d_e, d_c, None, None


def _cast_like(grads, arrays):
    return tuple(None if g is None else g.astype(jnp.result_type(a)) for g, a in zip(grads, arrays))


def _no_grads(hiddens, uniq, extras, consts):
    nones = lambda xs: tuple(None for _ in xs)
    return nones(hiddens), nones(uniq), nones(extras), nones(consts), None, None


def _grad_scan(spec, args, p: _Perturbed, cts, used, *, outputs: bool = False):
    """The fused backend's gradient scan, shared by :func:`lm_head_map`'s backward pass and
    :func:`lm_head_sum`'s forward pass.

    Per block: each side's logits, ``jax.vjp`` of ``row_fn`` with the block's rows of ``cts`` (one
    ``[n, ...]`` per-row cotangent per output leaf marked in ``used``), then the tile pass
    (:func:`_tile_pass`). Returns ``(grads, out)``: ``grads`` the ``(d_hiddens, d_unembeds, d_extras,
    d_consts)`` of the inputs that ``p`` marks perturbed (None elsewhere); ``out`` every output
    ``row_fn``'s output pytree with leaves ``[*L, ...]`` when ``outputs`` (the leaves not in
    ``used`` behind ``stop_gradient``), else None. With ``outputs`` (:func:`lm_head_sum`'s forward
    pass) the logits are projected in slabs (:func:`_project_tiled`). The unembeddings' gradients
    are the float32 accumulators (the caller casts them).
    """
    hiddens, uniq, extras, consts, sel, vocab_mask = args
    lead, c = spec.lead, spec.chunk
    n = math.prod(lead)
    p_h = p.hiddens
    p_w = p.unembeds
    p_e = tuple(f and _inexact(e) for f, e in zip(p.extras, extras))
    p_c = tuple(f and _inexact(x) for f, x in zip(p.consts, consts))
    # sides whose logits need a cotangent: a differentiated hidden state or unembedding
    need = tuple(i for i in range(len(hiddens)) if p_h[i] or p_w[spec.side_w[i]])
    if not outputs and not (need or any(p_e) or any(p_c)):
        return _no_grads(hiddens, uniq, extras, consts)[:4], None

    hs, es = _sources(spec, hiddens, sel), tuple(_flat(e, lead) for e in extras)
    flat, row_mask = sel
    ws = tuple(uniq[k] for k in spec.side_w)
    orient = tuple(spec.rows[k] for k in spec.side_w)
    e_idx = tuple(k for k, f in enumerate(p_e) if f)
    c_idx = tuple(k for k, f in enumerate(p_c) if f)
    f32 = jnp.float32

    def body(carry, j):
        (g_h, g_w, g_e, g_c), out = carry
        start, fresh, rows = _block_io(spec, j)
        h_c, e_c = _block_hidden(hs, sel, rows), tuple(map(rows, es))
        ct_c = tuple(jnp.where(jnp.reshape(fresh, (-1,) + (1,) * (x.ndim - 1)), rows(x), 0)
                     for x in cts)
        # rows with a zero cotangent contribute exactly 0, even where row_fn's derivative is inf/NaN
        live = fresh & jnp.any(jnp.stack([jnp.reshape(x != 0, (c, -1)).any(-1) for x in ct_c]), 0)
        # a masked row's hidden states are a constant zero: no gradient reaches them
        live_h = live if row_mask is None else live & rows(row_mask)
        project = _project_tiled if outputs else _project_raw
        # the sides that get a cotangent share products; each other side is projected alone, so
        # XLA drops its product where the row function's derivative does not read its logits
        z = _project_sides(h_c, ws, orient, spec.side_w, project, sides=need)
        z = [project(h, w, r) if x is None else x for x, h, w, r in zip(z, h_c, ws, orient)]

        def rows_out(z_d, e_d, c_d):
            zz, ee, cc = list(z), list(e_c), list(consts)
            for i, v in zip(need, z_d):
                zz[i] = v
            for k, v in zip(e_idx, e_d):
                ee[k] = v
            for k, v in zip(c_idx, c_d):
                cc[k] = v
            logits = tuple(temper_and_mask(x, vocab_mask, spec.temperature) for x in zz)
            leaves = jax.tree.leaves(spec.row_fn(logits, tuple(ee), *cc))
            return (tuple(y for y, u in zip(leaves, used) if u),
                    tuple(y for y, u in zip(leaves, used) if not u))

        ys, vjp, rest = jax.vjp(rows_out, tuple(z[i] for i in need), tuple(e_c[k] for k in e_idx),
                                tuple(consts[k] for k in c_idx), has_aux=True)
        if outputs:
            ys, rest = iter(ys), iter(rest)
            out = tuple(put_rows(o, start, fresh, next(ys) if u else jax.lax.stop_gradient(next(rest)))
                        for o, u in zip(out, used))
        dz, de, dc = vjp(ct_c)
        dz = tuple(jnp.where(live_h[:, None], d, 0.0) for d in dz)
        g_h, g_w = list(g_h), list(g_w)
        for i, d in zip(need, dz):
            k = spec.side_w[i]
            gh, acc = _tile_pass(d, ws[i], orient[i], h_c[i], g_w[k] if p_w[k] else None,
                                 want_h=p_h[i])
            if p_h[i] and flat[i] is None:
                g_h[i] = put_rows(g_h[i], start, fresh, gh.astype(hs[i].dtype))
            elif p_h[i]:   # live rows only: a stale row of the shifted last block is not this block's
                g_h[i] = g_h[i].at[rows(flat[i])].add(
                    jnp.where(live_h[:, None], gh, 0.0).astype(hs[i].dtype))
            if p_w[k]:
                g_w[k] = acc
        keep = lambda x: jnp.reshape(live, (-1,) + (1,) * (x.ndim - 1))
        g_e = tuple(put_rows(g, start, fresh, jnp.where(keep(d), d, 0).astype(g.dtype))
                    for g, d in zip(g_e, de))
        g_c = tuple(g + d.astype(f32) for g, d in zip(g_c, dc))
        return ((tuple(g_h), tuple(g_w), g_e, g_c), out), None

    grads0 = (tuple(jnp.zeros(shape_of(h), h.dtype) if f else None for h, f in zip(hs, p_h)),
              tuple(jnp.zeros(shape_of(w), f32) if f else None for w, f in zip(uniq, p_w)),
              tuple(jnp.zeros(shape_of(es[k]), es[k].dtype) for k in e_idx),
              tuple(jnp.zeros(shape_of(consts[k]), f32) for k in c_idx))
    out0 = None
    if outputs:
        block = (_block_shapes(hs, c), tuple(e[:c] for e in es))
        shapes = jax.eval_shape(
            lambda h_c, e_c: spec.row_fn(_logits(spec, h_c, ws, orient, vocab_mask), e_c, *consts),
            *block)
        leaves, tree = jax.tree.flatten(shapes)
        out0 = tuple(jnp.zeros((n,) + s.shape[1:], s.dtype) for s in leaves)
    ((g_h, g_w, g_e, g_c), out), _ = jax.lax.scan(body, (grads0, out0), jnp.arange(-(-n // c)))
    d_h = tuple(None if g is None else jnp.reshape(g, shape_of(h)) for g, h in zip(g_h, hiddens))
    d_e, d_c = [None] * len(extras), [None] * len(consts)
    for k, g in zip(e_idx, g_e):
        d_e[k] = _unflat(g, lead)
    for k, g in zip(c_idx, g_c):
        d_c[k] = g.astype(jnp.result_type(consts[k]))
    if outputs:
        out = jax.tree.unflatten(tree, [_unflat(o, lead) for o in out])
    return (d_h, tuple(g_w), tuple(d_e), tuple(d_c)), out


def _tile_pass(dz, w, rows: bool, h, acc, *, want_h: bool):
    """One loop over the vocabulary tiles of a block's logit cotangents ``dz [C, V]`` and the loop
    operand ``w`` of its unembedding (``[V, D]`` when ``rows``, else ``[D, V]``, see
    :func:`_operand`): returns ``(dz @ W^T [C, D] float32 if want_h else None, acc + the block's
    unembedding gradient if acc is not None)``, ``acc`` the float32 accumulator shaped like ``w``,
    updated in place one :data:`VOCAB_TILE` slab at a time (the last slab is shifted back to end at
    ``V``; its entries that the slab before already covered are zeroed).

    With 16-bit hidden states ``h`` the products run in their dtype (:mod:`hindsight.ops._precision`)
    as ``models.layers.matmul``'s backward pass does: each tile of ``dz`` is rounded to it, as the
    cotangent of a product that returned that dtype would be, the unembedding slab too, and the
    weight gradient's left operand is transposed in memory first (XLA:CPU's fast 16-bit dot)."""
    axis = 0 if rows else 1
    vocab = shape_of(w)[axis]
    tile = min(VOCAB_TILE, vocab)
    f32 = jnp.float32
    low = product_dtype(h)
    h_t = physical_transpose(h) if low is not None and not rows and acc is not None else None

    def step(j, carry):
        gh, acc = carry
        start, fresh = shifted_block(j, tile, vocab)
        dz_t = jnp.where(fresh, jax.lax.dynamic_slice_in_dim(dz, start, tile, axis=1), 0.0)
        if low is not None:
            dz_t = dz_t.astype(low)
        if gh is not None:
            w_t = as_operand(jax.lax.dynamic_slice_in_dim(w, start, tile, axis=axis), h)
            gh = gh + jax.lax.dot_general(dz_t, w_t, (((1,), (axis,)), ((), ())),
                                          preferred_element_type=f32)
        if acc is not None:
            if low is None:
                g_t = (jax.lax.dot_general(dz_t, h, (((0,), (0,)), ((), ())),
                                           preferred_element_type=f32) if rows else
                       jax.lax.dot_general(h, dz_t, (((0,), (0,)), ((), ())),
                                           preferred_element_type=f32))
            else:   # [tile, C] @ [C, D] or [D, C] @ [C, tile]: left operands contract their last axis
                g_t = (jnp.matmul(physical_transpose(dz_t), h, preferred_element_type=f32) if rows
                       else jnp.matmul(h_t, dz_t, preferred_element_type=f32))
            upd = jax.lax.dynamic_slice_in_dim(acc, start, tile, axis=axis) + g_t
            acc = jax.lax.dynamic_update_slice_in_dim(acc, upd, start, axis=axis)
        return gh, acc

    gh = jnp.zeros((shape_of(dz)[0], shape_of(w)[1 - axis]), f32) if want_h else None
    return jax.lax.fori_loop(0, -(-vocab // tile), step, (gh, acc))


_fused_call.defvjp(_fused_fwd, _fused_bwd, symbolic_zeros=True)


# ---- fused sum: the gradient formed in the forward pass ------------------------------------------

@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused_sum_call(spec, hiddens, uniq, extras, consts, sel, vocab_mask):
    loss, aux = _fused_forward(spec, hiddens, uniq, extras, consts, sel, vocab_mask)
    return jnp.sum(loss), aux


def _fused_sum_fwd(spec, hiddens, uniq, extras, consts, sel, vocab_mask):
    args, flags = _primals(hiddens, uniq, extras, consts, sel, vocab_mask)
    n_out = len(jax.tree.leaves(jax.eval_shape(
        lambda *a: _fused_forward(spec, *a), *args)))
    used = (True,) + (False,) * (n_out - 1)   # the loss (first leaf) gets a unit cotangent
    ones = (jnp.ones((math.prod(spec.lead),), jnp.float32),)
    grads, (loss, aux) = _grad_scan(spec, args, flags, ones, used, outputs=True)
    return (jnp.sum(loss), aux), (grads, args[1])


def _fused_sum_bwd(spec, res, ct):
    (d_h, d_w, d_e, d_c), uniq = res
    g = ct[0]  # aux carries no gradient
    if _is_zero(g):
        return _no_grads(d_h, d_w, d_e, d_c)
    scale = lambda xs: tuple(None if x is None else (g * x).astype(x.dtype) for x in xs)
    return scale(d_h), _cast_like(scale(d_w), uniq), scale(d_e), scale(d_c), None, None


_fused_sum_call.defvjp(_fused_sum_fwd, _fused_sum_bwd, symbolic_zeros=True)
