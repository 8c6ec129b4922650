"""Engine requests: what is queued (a request's rows, their prefixes and caches) and in which
order queued rows take free slots.

Two queues feed the engine's slot batch: branches and follow-up turns (they finish trees and hold
caches, so they go first, longest budget first: :func:`longest_first`) and fresh prompts (in
submission order: :func:`in_turn`).
"""
from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable

import numpy as np

from hindsight.sampling import inputs
from hindsight.sampling.decode import DecodeState


def branch_requests(rollouts, rows, positions, counts=1):
    """Validate and expand ``(row, position, count)`` requests into one entry per new row.

    Returns ``(src_rows [N], positions [N])`` int32. Raises ValueError on a row outside
    ``[0, B)``, a position outside ``[0, length)`` of its row, or a count < 1.
    """
    rows = inputs.row_indices("rows", rows, rollouts.num_rows)
    positions = np.atleast_1d(np.asarray(positions))
    if rows.shape != positions.shape:
        raise ValueError(f"`rows` and `positions` must be 1-D of equal length, got {rows.shape} and {positions.shape}")
    if not np.issubdtype(positions.dtype, np.integer):
        raise TypeError("`positions` must be integers")
    counts = inputs.per_row_ints("counts", counts, rows.size, minimum=1)
    lengths = rollouts.lengths[rows]
    bad = np.nonzero((positions < 0) | (positions >= lengths))[0]
    if bad.size:
        i = bad[0]
        raise ValueError(f"branch position {positions[i]} is outside the response of row {rows[i]} "
                         f"(length {lengths[i]}; valid positions are 0..{lengths[i] - 1})")
    return np.repeat(rows, counts).astype(np.int32), np.repeat(positions, counts).astype(np.int32)


@dataclasses.dataclass
class Request:
    """One submitted request (a prompt's group, a set of branches, follow-up turns): its rows'
    starting sequences and limits, where their prefix K/V come from, how far placement and
    decoding have got, and the outputs gathered so far."""
    rid: int
    tag: object
    n: int
    seqs: np.ndarray            # [n, M] initial sequences (prompt, or kept branch prefix)
    prompt_lengths: np.ndarray  # [n]
    starts: np.ndarray          # [n] position of the unfed last token
    max_new: np.ndarray         # [n]
    keys: np.ndarray            # [n, 2] uint32 key data
    stops: np.ndarray           # [n, K]
    logprobs: np.ndarray        # [n, M] kept prefix log-probs (zeros for prompts)
    policy_logprobs: np.ndarray
    raw_logprobs: np.ndarray
    parents: np.ndarray
    branch_positions: np.ndarray
    keep_cache: bool
    stop_check: Callable | None = None     # stop_check(response ids) -> length to cut at, or None
    stop_hit: np.ndarray | None = None     # [n] a row ended on ``stop_check``
    caches: list | None = None             # the caches the rows' prefix K/V are copied from, once known
    cache_of: np.ndarray | None = None     # [n] each row's index into ``caches``
    source_rows: np.ndarray | None = None  # [n] each row's row in its cache
    prompts: list | None = None            # the distinct prompts still to prefill
    prompt_of: np.ndarray | None = None    # [n] each row's index into ``prompts``
    order: np.ndarray | None = None        # [n] the rows in the order they take slots
    placed: int = 0                        # rows of ``order`` given a slot so far
    done: int = 0
    out_seq: np.ndarray | None = None
    out_lp: np.ndarray | None = None
    out_plp: np.ndarray | None = None
    out_raw: np.ndarray | None = None
    out_pos: np.ndarray | None = None
    archive: object = None      # the rows' kept cache, copied out of the slot batch
    final: DecodeState | None = None  # or the whole final slot batch, taken over


def budgets(prompt_lengths, max_new, starts) -> np.ndarray:
    """``[n]`` the most decode steps each row of a request can take (``end - start``)."""
    return np.asarray(prompt_lengths) + np.asarray(max_new) - np.asarray(starts)


def checked_stop(stop_check):
    """``stop_check`` itself, after checking it is None or callable."""
    if stop_check is not None and not callable(stop_check):
        raise TypeError(f"`stop_check` must be callable (response ids -> cut length or None), got "
                        f"{type(stop_check).__name__}")
    return stop_check


def in_turn(queue, free: int) -> list:
    """``[(request, rows to place)]`` for ``free`` slots, requests in submission order."""
    takes = []
    for req in queue:
        if free <= 0:
            break
        k = min(free, req.n - req.placed)
        takes.append((req, k))
        free -= k
    return takes


def longest_first(queue, free: int) -> list:
    """``[(request, rows to place)]`` for ``free`` slots: the queued rows with the largest
    budgets (the most tokens each may still decode), ties in submission order.

    Why: branches and follow-up turns arrive in bursts of rows of every length (an HDL tree's
    continuations from early and late branch points). Placed first-come, the longest can start
    last and decode alone at the end while the slot batch idles around them; longest first
    (the LPT rule for makespan) leaves the short rows to fill the end. A row's tokens do not
    depend on its slot or on when it starts."""
    if free <= 0 or not queue:
        return []
    cand = [(-int(budgets(req.prompt_lengths, req.max_new, req.starts)[row]), qi, j)
            for qi, req in enumerate(queue) for j, row in enumerate(req.order[req.placed:])]
    counts = collections.Counter(qi for _, qi, _ in sorted(cand)[:free])
    return [(req, counts[qi]) for qi, req in enumerate(queue) if counts[qi]]
