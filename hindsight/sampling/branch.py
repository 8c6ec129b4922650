"""Branching: continue finished rollouts from a response position, reusing their cached prefix.

A branch of row r at response position p keeps ``response[:p]`` verbatim and resamples from
position p on, from ``pi(. | prompt, response[:p])``. The continuation's cache is a row copy of r's
(``take``), fed from ``(response[p-1], prompt_len + p - 1)``: no prefix token is recomputed (one
step re-feeds the token before the branch point, exactly as the first step after a prefill does).
This is the primitive behind HDL trees, OVCSD tries and recoverability replays.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hindsight.sampling import cache_rows, inputs
from hindsight.sampling.buckets import pow2_bucket
from hindsight.sampling.decode import decode_steps, split_model
from hindsight.sampling.rollouts import Rollouts, collect, init_state


def branch_requests(rollouts: Rollouts, rows, positions, counts=1):
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


def branch(model, rollouts: Rollouts, rows, positions, counts=1, *, key=None, row_keys=None,
           max_new_tokens=None) -> Rollouts:
    """Sample ``counts[i]`` continuations of ``rollouts`` row ``rows[i]`` from response position
    ``positions[i]`` (that token is resampled), with the rollouts' `SamplingParams` and stop tokens.

    Args:
      model: the model that produced ``rollouts`` (same weights, or the cache is stale).
      rollouts: a `Rollouts` from `generate` or `branch`.
      rows, positions: ``[R]`` ints; counts: int or ``[R]`` ints.
      key / row_keys: one key per new row (``row_keys [N]``), or a key split N ways.
      max_new_tokens: per-new-row cap on the *total* response length (default: the source row's);
        must fit in the source cache.
    Returns:
      `Rollouts` with ``N = sum(counts)`` rows in request order; each response is the kept prefix
      followed by the new tokens; ``branch_positions`` and ``parents`` record where they came from.
      Token-for-token, a continuation equals `generate` from ``prompt + response[:p]`` with the same
      row key and ``max_new_tokens - p``.
    """
    src, pos = branch_requests(rollouts, rows, positions, counts)
    if rollouts.state.cache is None:
        raise ValueError("these rollouts carry no cache (an engine result submitted without keep_cache=True)")
    n = src.size
    max_new = (rollouts.max_new_tokens[src] if max_new_tokens is None else
               inputs.per_row_ints("max_new_tokens", max_new_tokens, n, minimum=1))
    plen = rollouts.prompt_lengths[src]
    m = int(rollouts.state.tokens.shape[1])
    if np.any(plen + max_new > m):
        raise ValueError(f"prompt + max_new_tokens exceeds the source cache length {m}")
    if np.any(max_new <= pos):
        raise ValueError("`max_new_tokens` must exceed each branch position")
    keys = inputs.row_keys(key, row_keys, n)
    bb = pow2_bucket(n)
    src_b = np.concatenate([src, np.full(bb - n, src[0], np.int32)])
    host = jax.device_get((rollouts.state.tokens, rollouts.state.logprobs,
                           rollouts.state.policy_logprobs, rollouts.state.stops))
    seq, lp, plp, stops = (np.asarray(x)[src_b] for x in host)
    start = plen + pos - 1
    graphdef, weights = split_model(model, decode=True)
    state = init_state(cache_rows.take_rows(rollouts.state.cache, src_b, rollouts.axes), tokens=seq,
                       starts=start, ends=plen + max_new, rows=n, keys=inputs.pad_keys(keys, bb),
                       stops=stops, logprobs=lp, policy_logprobs=plp)
    state = decode_steps(graphdef, weights, state, jnp.int32((max_new - pos).max()), jnp.int32(0),
                         params=rollouts.params.for_trace())
    return collect(state, rows=n, prompt_lengths=plen, max_new_tokens=max_new, parents=src,
                   branch_positions=pos, keys=keys, params=rollouts.params, axes=rollouts.axes)
