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

Rows of a chunk that begin with the same tokens (a group's prompt, an HDL branch point's prompt
and root prefix, a teacher context's question and reference) share that prefix
(:func:`shared_prefixes`): a packed row holds one copy of it, which the rows' own tokens attend
to (``packed_prefixes``, the decoder's ``prefix_ids``), so the model runs a group's prompt once
per packed row instead of once per response, and its gradient sums over the responses as it
would over the copies. The states are the padded rows' up to float rounding.

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


def first_fit(lengths, capacity: int, *, prefix=None, group=None):
    """First-fit decreasing: ``(bin [N], offset [N], copy [N], bins)`` placing sequences of
    ``lengths`` tokens into bins of ``capacity`` (longest first, each into the first bin it fits;
    ties keep their order, so the result is deterministic). Empty sequences take bin 0, offset 0.

    Sequences with the same ``group[i] >= 0`` share their first ``prefix[i]`` tokens (counted in
    ``lengths``): a bin holds one copy of a group's prefix, laid before the first of its sequences
    placed there, and a sequence goes first to a bin holding its group's copy (it costs only its
    own tokens there). Sequence ``i``'s tokens past its shared prefix start at ``offset[i]`` of
    bin ``bin[i]``, the copy of its prefix at ``copy[i]`` of that bin (-1: it shares none).
    Each placement costs at most its sequence's length, so a bin closed for lack of room holds
    more than ``capacity - max(lengths)`` tokens (the dry run's worst case relies on it)."""
    lengths = np.asarray(lengths, np.int64)
    n = len(lengths)
    group = np.full(n, -1) if group is None else np.asarray(group, np.int64)
    prefix = np.where(group >= 0, 0 if prefix is None else np.asarray(prefix, np.int64), 0)
    if lengths.size and lengths.max() > capacity:
        raise ValueError(f"a sequence of {lengths.max()} tokens does not fit rows of "
                         f"{capacity} positions")
    bins, offsets = np.zeros(n, np.int64), np.zeros(n, np.int64)
    copy = np.full(n, -1, np.int64)
    used: list[int] = []
    copies: dict[tuple[int, int], int] = {}   # (group, bin) -> offset of the group's copy
    for i in np.argsort(-lengths, kind="stable"):
        total, g = int(lengths[i]), int(group[i])
        if total == 0:
            continue
        own = total - int(prefix[i])
        # bins holding the group's copy first, then any bin with room for copy + sequence
        choices = [r for r in range(len(used)) if (g, r) in copies and used[r] + own <= capacity]
        if not choices:
            choices = [r for r, u in enumerate(used) if u + total <= capacity] or [len(used)]
            if choices[0] == len(used):
                used.append(0)
            if g >= 0:
                copies[g, choices[0]] = used[choices[0]]
                used[choices[0]] += int(prefix[i])
        r = choices[0]
        bins[i], offsets[i], copy[i] = r, used[r], copies.get((g, r), -1)
        used[r] += own
    return bins, offsets, copy, max(len(used), 1)


def bucket_rows(needed: int, rows: int) -> int:
    """``needed`` packed rows rounded up to a multiple of ``ceil(rows / 8)``, at most ``rows``."""
    step = -(-rows // 8)
    return min(rows, -(-needed // step) * step)


def shared_prefixes(tokens, positions, attention_mask, target_index, mask=None, *,
                    chunks: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The prefixes rows of a chunk can share: ``(prefix [N], group [N])``.

    Row ``i``'s candidate prefix is its real tokens up to the one whose state predicts its first
    trained response token (``mask``; the first response token without one): the prompt of a
    GRPO row, the prompt and the reused root prefix of an HDL continuation. Rows of one chunk
    whose candidates are equal (tokens and positions) form a group (``group[i] >= 0``, numbered
    per chunk) sharing ``prefix[i]`` tokens; other rows share nothing (``group`` -1, ``prefix``
    0). A candidate some of whose positions are not below every later real token's is dropped:
    its copy could not be attended causally by position (:func:`causal_mask`).

    Any split point gives the same states (a prefix's tokens see only the prefix either way);
    this one makes the prefix as long as the rows of one prompt have in common.
    """
    tokens, positions = np.asarray(tokens), np.asarray(positions)
    real = np.asarray(attention_mask).astype(bool)
    target_index = np.asarray(target_index)
    n_rows = tokens.shape[0]
    first = (np.zeros(n_rows, np.int64) if mask is None
             else np.argmax(np.asarray(mask) > 0, axis=1))
    split = target_index[np.arange(n_rows), first]
    rank = np.cumsum(real, axis=1) - 1
    prefix = np.where(real[np.arange(n_rows), split], rank[np.arange(n_rows), split] + 1, 0)
    group = np.full(n_rows, -1, np.int64)
    per = n_rows // chunks
    for c in range(chunks):
        seen: dict[bytes, list[int]] = {}
        for i in range(c * per, (c + 1) * per):
            keep = np.flatnonzero(real[i])
            head, tail = keep[:prefix[i]], keep[prefix[i]:]
            if not len(head) or (len(tail) and positions[i, head].max() >= positions[i, tail].min()):
                continue
            key = tokens[i, head].tobytes() + b"|" + positions[i, head].tobytes()
            seen.setdefault(key, []).append(i)
        for g, rows in enumerate(r for r in seen.values() if len(r) > 1):
            group[rows] = g
    return np.where(group >= 0, prefix, 0), group


def pack_context(tokens, positions, attention_mask, target_index, *, chunks: int,
                 row_multiple: int = 1, mask=None) -> dict[str, np.ndarray]:
    """One context's rows -> packed chunks, a prefix shared by rows of a chunk laid once per
    packed row (:func:`shared_prefixes`: G responses to one prompt attend to one copy of it).

    Args:
      tokens, positions, attention_mask: ``[N, S]`` host arrays (real tokens where the mask is
        set, in order; they need not be a prefix of the row).
      target_index: ``[N, T]`` indices into the rows' ``S`` positions.
      chunks: ``C``, dividing ``N``: chunk ``c`` packs rows ``[c * N / C, (c + 1) * N / C)``.
      row_multiple: ``k``, packed rows of ``L = k * S`` positions (k = 1: sequences longer than
        ``S / 2`` get a row each unless they share a prefix; k = 2 lets them share).
      mask: optional ``[N, T]`` response mask: where each row's shareable prefix ends.
    Returns:
      ``packed_tokens``, ``packed_positions``, ``packed_segments``, ``packed_prefixes``
      ``[C, R, L]`` int32 and ``target_index [N, T]`` int32 into the chunk's flattened ``R * L``
      positions. Segment ``i + 1`` holds the chunk's ``i``-th row's tokens past its shared
      prefix (all of them if it shares none), segment ``per + 1 + g`` a copy of the chunk's
      group ``g``'s prefix, 0 padding; ``packed_prefixes`` is the segment each position also
      sees (the copy in its packed row of its sequence's prefix; its own segment where none).
      An index at a padded position of its row, which only masked response positions carry,
      points at the row's first packed token.
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
    prefix, group = shared_prefixes(tokens, positions, real, target_index, mask, chunks=chunks)
    chunk_rows = lambda x, c: x[c * per:(c + 1) * per]
    placed = [first_fit(chunk_rows(lengths, c), width, prefix=chunk_rows(prefix, c),
                        group=chunk_rows(group, c)) for c in range(chunks)]
    r = bucket_rows(max(p[3] for p in placed), per)
    out = {k: np.zeros((chunks, r, width), np.int32) for k in PACKED_KEYS}
    # rank[i, j]: how many real tokens of row i come before position j
    rank = np.cumsum(real, axis=1) - 1
    own_start, copy_start = np.zeros(n_rows, np.int64), np.zeros(n_rows, np.int64)
    for c, (bins, offsets, copies, _) in enumerate(placed):
        for k in range(per):
            i = c * per + k
            keep = np.flatnonzero(real[i])
            row, p = bins[k], prefix[i]
            pieces = [(offsets[k], keep[p:], k + 1)]
            if p:
                pieces.append((copies[k], keep[:p], per + 1 + group[i]))
            for lo, idx, seg in pieces:
                sl = slice(lo, lo + len(idx))
                out["packed_tokens"][c, row, sl] = tokens[i, idx]
                out["packed_positions"][c, row, sl] = positions[i, idx]
                out["packed_segments"][c, row, sl] = seg
                out["packed_prefixes"][c, row, sl] = pieces[-1][2]
            own_start[i] = row * width + offsets[k] - p   # so that own_start + rank is right
            copy_start[i] = row * width + copies[k]
    rank_at = np.take_along_axis(rank, target_index, axis=1)
    hit = np.take_along_axis(real, target_index, axis=1)
    idx = np.where(hit, rank_at, 0)
    in_prefix = idx < prefix[:, None]
    out["target_index"] = np.where(in_prefix, copy_start[:, None] + idx,
                                   own_start[:, None] + idx).astype(np.int32)
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
            packed = pack_context(*parts, chunks=chunks, row_multiple=row_multiple,
                                  mask=batch.get("mask"))
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


def shared_tokens_saved(real_tokens: int, batch: Mapping, context: str | None = None) -> float:
    """The fraction of ``context``'s ``real_tokens`` (its padded rows' real tokens) that the
    packed ``batch`` does not run, each shared prefix laid once per packed row instead of once
    per row (0.0: nothing shared)."""
    seg = np.asarray(batch[context_key(context, "packed_segments")])
    return 1.0 - float((seg > 0).sum()) / max(int(real_tokens), 1)


def packed_fraction(batch: Mapping, context: str | None = None) -> float:
    """Real tokens over the packed positions of ``context`` (1.0: no padding left)."""
    seg = np.asarray(batch[context_key(context, "packed_segments")])
    return float((seg > 0).sum() / seg.size)
