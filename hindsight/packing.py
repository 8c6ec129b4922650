"""Packed training rows: a context's sequences laid end to end instead of right-padded.

A batch context holds ``B`` right-padded rows ``[B, S]`` whose real tokens (``attention_mask``)
are often far fewer than ``B * S``. :func:`pack_batch` moves each context's real tokens into
``C`` chunks of ``R`` rows of ``L = k * S`` positions (first-fit decreasing, a sequence never
split; ``k = row_multiple``, 1 unless ``train.pack_row_multiple`` says otherwise),
with per-segment positions and segment ids, so the model runs ``C * R`` rows instead of ``B``.
Chunk ``c`` holds the sequences of the ``c``-th contiguous ``B / C`` rows: the train step packs
one chunk per micro-batch and batch shard (:meth:`hindsight.train.step.TrainStep.place`), so a
device's packed rows hold exactly its own rows' sequences and the gather back to response
positions never crosses devices. ``{context}_target_index`` is rewritten to index the flattened
``R * L`` positions of the row's chunk (:mod:`hindsight.batch`), and
:func:`hindsight.methods.forward.context_hidden` gathers the response states from there: the
losses see the same ``[B, T, D]`` states, so every method trains on packed rows unchanged.

``R`` is the most rows any chunk needs, rounded up to a multiple of an eighth of the chunk's
rows (at most 8 values per context and chunk size, so a method reading ``k`` contexts compiles
at most ``8 ** k`` step shapes per batch width); it never exceeds the chunk's row count. Processes
of a multi-host run pack their own rows and must then agree on every context's ``R``
(:func:`packed_rows`, :func:`with_packed_rows`: the train step takes the largest).
"""
from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np

from hindsight.batch import CONTEXT_NAMES, PACKED_KEYS, POLICY_KEYS, context_key, is_packed


def first_fit(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray, int]:
    """First-fit decreasing: ``(bin [N], offset [N], bins)`` placing sequences of ``lengths``
    into bins of ``capacity`` tokens (longest first, each into the first bin it fits; ties keep
    their order, so the result is deterministic). Empty sequences take bin 0, offset 0."""
    lengths = np.asarray(lengths, np.int64)
    if lengths.size and lengths.max() > capacity:
        raise ValueError(f"a sequence of {lengths.max()} tokens does not fit rows of "
                         f"{capacity} positions")
    bins, offsets = np.zeros(len(lengths), np.int64), np.zeros(len(lengths), np.int64)
    used: list[int] = []
    for i in np.argsort(-lengths, kind="stable"):
        n = int(lengths[i])
        if n == 0:
            continue
        for r, u in enumerate(used):
            if u + n <= capacity:
                bins[i], offsets[i], used[r] = r, u, u + n
                break
        else:
            bins[i], offsets[i] = len(used), 0
            used.append(n)
    return bins, offsets, max(len(used), 1)


def bucket_rows(needed: int, rows: int) -> int:
    """``needed`` packed rows rounded up to a multiple of ``ceil(rows / 8)``, at most ``rows``."""
    step = -(-rows // 8)
    return min(rows, -(-needed // step) * step)


def pack_context(tokens, positions, attention_mask, target_index, *, chunks: int,
                 row_multiple: int = 1) -> dict[str, np.ndarray]:
    """One context's rows -> packed chunks.

    Args:
      tokens, positions, attention_mask: ``[N, S]`` host arrays (real tokens where the mask is
        set, in order; they need not be a prefix of the row).
      target_index: ``[N, T]`` indices into the rows' ``S`` positions.
      chunks: ``C``, dividing ``N``: chunk ``c`` packs rows ``[c * N / C, (c + 1) * N / C)``.
      row_multiple: ``k``, packed rows of ``L = k * S`` positions (k = 1: sequences longer than
        ``S / 2`` get a row each; k = 2 lets them share).
    Returns:
      ``packed_tokens``, ``packed_positions``, ``packed_segments`` ``[C, R, L]`` int32 (segment
      ``i + 1`` for the chunk's ``i``-th row, 0 on padding) and ``target_index [N, T]`` int32 into
      the chunk's flattened ``R * L`` positions (an index at a padded position of its row, which
      only masked response positions carry, points at the row's first packed token).
    """
    tokens, positions = np.asarray(tokens), np.asarray(positions)
    real = np.asarray(attention_mask).astype(bool)
    target_index = np.asarray(target_index)
    n_rows, width = tokens.shape
    if chunks < 1 or n_rows % chunks:
        raise ValueError(f"`chunks` ({chunks}) must be a positive divisor of the rows ({n_rows})")
    _check_row_multiple(row_multiple)
    per = n_rows // chunks
    width *= row_multiple
    lengths = real.sum(axis=1)
    placed = [first_fit(lengths[c * per:(c + 1) * per], width) for c in range(chunks)]
    r = bucket_rows(max(p[2] for p in placed), per)
    out = {k: np.zeros((chunks, r, width), np.int32) for k in PACKED_KEYS}
    # rank[i, j]: how many real tokens of row i come before position j (its packed offset)
    rank = np.cumsum(real, axis=1) - 1
    start = np.zeros(n_rows, np.int64)
    for c, (bins, offsets, _) in enumerate(placed):
        for k in range(per):
            i = c * per + k
            keep = np.flatnonzero(real[i])
            row, lo = bins[k], offsets[k]
            sl = slice(lo, lo + len(keep))
            out["packed_tokens"][c, row, sl] = tokens[i, keep]
            out["packed_positions"][c, row, sl] = positions[i, keep]
            out["packed_segments"][c, row, sl] = k + 1
            start[i] = row * width + lo
    idx = np.take_along_axis(rank, target_index, axis=1)
    hit = np.take_along_axis(real, target_index, axis=1)
    out["target_index"] = (start[:, None] + np.where(hit, idx, 0)).astype(np.int32)
    return out


def _check_row_multiple(row_multiple) -> None:
    if isinstance(row_multiple, bool) or not isinstance(row_multiple, int) or row_multiple < 1:
        raise ValueError(f"`row_multiple` must be an int >= 1, got {row_multiple!r}")


def pack_batch(batch: Mapping, *, chunks: int, row_multiple: int = 1) -> dict:
    """Every context of ``batch`` (the policy's and each of :data:`CONTEXT_NAMES` present)
    packed into ``chunks`` chunks of contiguous rows of ``row_multiple`` times the context's
    width (:func:`pack_context`); other keys as they are. ``jax.ShapeDtypeStruct`` leaves (a dry
    run's abstract rows) give abstract packed leaves at the worst case (every row of ``k * S``
    positions holding ``k`` sequences: ``R = ceil(N / C / k)``, bucketed)."""
    _check_row_multiple(row_multiple)
    out = dict(batch)
    for ctx in (None, *CONTEXT_NAMES):
        key = lambda k: context_key(ctx, k)
        if is_packed(batch, ctx):
            raise ValueError(f"context {ctx or 'policy'!r} of the batch is packed already")
        if key("tokens") not in batch:
            continue
        parts = [batch[key(k)] for k in POLICY_KEYS] + [batch[key("target_index")]]
        if any(isinstance(x, jax.ShapeDtypeStruct) for x in parts):
            n, s = parts[0].shape
            per = n // chunks
            rows = bucket_rows(-(-per // row_multiple), per)
            packed = {k: jax.ShapeDtypeStruct((chunks, rows, s * row_multiple), np.int32)
                      for k in PACKED_KEYS}
            packed["target_index"] = jax.ShapeDtypeStruct(parts[3].shape, np.int32)
        else:
            packed = pack_context(*parts, chunks=chunks, row_multiple=row_multiple)
        for k in POLICY_KEYS:
            del out[key(k)]
        out.update({key(k): v for k, v in packed.items()})
    return out


def packed_rows(batch: Mapping) -> dict[str | None, int]:
    """``{context: R}`` of every packed context of ``batch`` (None: the policy's)."""
    return {ctx: int(batch[context_key(ctx, "packed_tokens")].shape[1])
            for ctx in (None, *CONTEXT_NAMES) if is_packed(batch, ctx)}


def with_packed_rows(batch: Mapping, rows: Mapping[str | None, int]) -> dict:
    """``batch`` with each packed context of ``rows`` padded with empty rows (segment 0) to
    ``rows[context]`` rows per chunk; target indices are unchanged, since rows are added after
    the ones they point into."""
    out = dict(batch)
    for ctx, r in rows.items():
        have = batch[context_key(ctx, "packed_tokens")].shape[1]
        if r < have:
            raise ValueError(f"context {ctx or 'policy'!r} has {have} packed rows per chunk; "
                             f"cannot shrink it to {r}")
        for k in PACKED_KEYS:
            x = np.asarray(batch[context_key(ctx, k)])
            out[context_key(ctx, k)] = np.pad(x, ((0, 0), (0, r - have), (0, 0)))
    return out


def packed_fraction(batch: Mapping, context: str | None = None) -> float:
    """Real tokens over the packed positions of ``context`` (1.0: no padding left)."""
    seg = np.asarray(batch[context_key(context, "packed_segments")])
    return float((seg > 0).sum() / seg.size)
