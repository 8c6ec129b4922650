"""The LM head's projections of hidden-state blocks through an unembedding: the orientation of the
unembedding in the block loops, one product or slab by slab, and the sides that share an
unembedding projected together (:mod:`hindsight.ops.lm_head`'s backends use them)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight._validation import shape_of
from hindsight.ops._chunking import project, project_rows, shifted_block, temper_and_mask
from hindsight.ops._precision import as_operand

PROJECTION_TILE = 2048
"""Vocabulary columns per product of :func:`lm_head_sum`'s tiled projection
(:func:`_project_tiled`)."""


# ---- orientation of the unembeddings ------------------------------------------------------------
#
# XLA's CPU matmuls take row-major operands, and a loop (the scan and fused backends' block loops)
# is a layout boundary: an unembedding that enters a loop as ``embed.T`` (a tied embedding, ``[V, D]``
# in memory) is first copied into a row-major ``[D, V]`` array, and its gradient, accumulated as
# ``[D, V]`` in the loop, is transposed into the ``[V, D]`` table afterwards: two gradient-sized
# temporaries. So the loops take each unembedding in the orientation it has in memory: an array
# traced as the transpose of a ``[V, D]`` array enters as that ``[V, D]`` array (``embed.T.T``,
# which XLA cancels) and the loops contract over its second axis; any other array enters as given.
# The logits are the same numbers either way; only the memory layout of the loop operands and of
# the gradient accumulators differs.

def _is_transpose(w) -> bool:
    """Whether ``w [D, V]`` is traced as ``x.T`` of a ``[V, D]`` array ``x`` (looking through
    ``stop_gradient`` and autodiff tracers). Concrete arrays, and anything this cannot see
    through, count as not transposed (row-major ``[D, V]``): a performance choice only."""
    t = w
    for _ in range(16):
        eqn = getattr(t, "parent", None)      # a jit tracer's producing equation
        if eqn is not None:
            name = getattr(getattr(eqn, "primitive", None), "name", None)
            if name == "transpose":
                return tuple(eqn.params.get("permutation", ())) == (1, 0)
            if name == "stop_gradient" and len(getattr(eqn, "in_tracers", ())) == 1:
                t = eqn.in_tracers[0]
                continue
            return False
        t = getattr(t, "primal", None)        # autodiff tracers wrap the primal value
        if t is None:
            return False
    return False


def _operand(w, rows: bool):
    """The loop operand of unembedding ``w [D, V]``: ``w.T [V, D]`` when ``rows``, else ``w``."""
    return w.T if rows else w


def _project_raw(h, u, rows: bool):
    """Float32 ``h [C, D] @ W`` from the loop operand ``u`` of ``W`` (:func:`_operand`), in
    ``h``'s 16-bit dtype if it has one (:mod:`hindsight.ops._precision`)."""
    return jax.lax.dot_general(h, as_operand(u, h), (((h.ndim - 1,), (1 if rows else 0,)), ((), ())),
                               preferred_element_type=jnp.float32)


def _project_tiled(h, u, rows: bool):
    """:func:`_project_raw` one :data:`PROJECTION_TILE` slab of the unembedding at a time, each
    slab's product written into the ``[C, V]`` result in place."""
    axis = 0 if rows else 1
    vocab = shape_of(u)[axis]
    tile = min(PROJECTION_TILE, vocab)

    def step(j, z):
        start, _ = shifted_block(j, tile, vocab)   # the last slab rewrites its overlap: same values
        u_t = jax.lax.dynamic_slice_in_dim(u, start, tile, axis=axis)
        return jax.lax.dynamic_update_slice_in_dim(z, _project_raw(h, u_t, rows), start, axis=1)

    z = jnp.zeros((shape_of(h)[0], vocab), jnp.float32)
    return jax.lax.fori_loop(0, -(-vocab // tile), step, z)


def _logits(spec, h_c, operands, rows, vocab_mask):
    """Each side's float32 logits from its loop operand (:func:`_operand`); in the fused
    backend's blocks (``spec.side_w`` set) the sides sharing an unembedding are projected in one
    product (:func:`_project_sides`)."""
    if spec.side_w:
        z = _project_sides(h_c, operands, rows, spec.side_w, _project_raw)
        return tuple(temper_and_mask(x, vocab_mask, spec.temperature) for x in z)
    return tuple((project_rows if r else project)(h, u, vocab_mask, spec.temperature)
                 for h, u, r in zip(h_c, operands, rows))


def _project_sides(h_c, operands, rows, keys, project, sides=None) -> list:
    """Raw float32 projections ``[C, V]`` of the block rows ``h_c`` of the sides in ``sides``
    (default: all; the others are None), by ``project(h, u, rows)``. Sides with the same ``keys``
    entry (one unembedding, e.g. a policy and its self-teacher) and the same dtype are projected in
    one product of their stacked rows: on CPU a ``[2C, D] x [D, V]`` matmul runs faster per row
    than two of ``C`` rows (measured at V = 151,936, D = 1,024: 153 vs 188 ms per 64 rows)."""
    sides = range(len(h_c)) if sides is None else sides
    groups: dict = {}
    for i in sides:
        groups.setdefault((keys[i], jnp.result_type(h_c[i])), []).append(i)
    z = [None] * len(h_c)
    for members in groups.values():
        i0 = members[0]
        if len(members) == 1:
            z[i0] = project(h_c[i0], operands[i0], rows[i0])
            continue
        c = shape_of(h_c[i0])[0]
        stacked = project(jnp.concatenate([h_c[i] for i in members]), operands[i0], rows[i0])
        for n, i in enumerate(members):
            z[i] = stacked[n * c:(n + 1) * c]
    return z
