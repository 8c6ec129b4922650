"""Branching: continue finished rollouts from a response position, reusing their cached prefix.

A branch of row r at response position p keeps ``response[:p]`` verbatim and resamples from
position p on, from ``pi(. | prompt, response[:p])``. The continuation's cache is a row copy of r's,
fed from ``(response[p-1], prompt_len + p - 1)``: no prefix token is recomputed (one step re-feeds
the token before the branch point, exactly as the first step after a prefill does). This is the
primitive behind HDL trees, OVCSD tries and recoverability replays.

``branch`` is one `Engine.submit_branch` request run to completion in an engine with a slot per
new row; inside a rollout, the engine's own ``submit_branch`` shares the slot batch with other work.
"""
from __future__ import annotations

from hindsight.sampling.engine import Engine, Rollouts
from hindsight.sampling.requests import branch_requests


def branch(model, rollouts: Rollouts, rows, positions, counts=1, *, key=None, row_keys=None,
           max_new_tokens=None) -> Rollouts:
    """Sample ``counts[i]`` continuations of ``rollouts`` row ``rows[i]`` from response position
    ``positions[i]`` (that token is resampled), with the rollouts' `SamplingParams` and stop tokens.

    Args:
      model: the model that produced ``rollouts`` (same weights, or the cache is stale).
      rollouts: a `Rollouts` from `generate` or `branch` (or an engine result kept with its cache).
      rows, positions: ``[R]`` ints; counts: int or ``[R]`` ints.
      key / row_keys: one key per new row (``row_keys [N]``), or a key split N ways.
      max_new_tokens: per-new-row cap on the *total* response length (default: the source row's);
        must fit in the source cache.
    Returns:
      `Rollouts` with ``N = sum(counts)`` rows in request order, with their cache; each response is
      the kept prefix followed by the new tokens; ``branch_positions`` and ``parents`` record where
      they came from. Token-for-token, a continuation equals `generate` from
      ``prompt + response[:p]`` with the same row key and ``max_new_tokens - p``.
    """
    src, _ = branch_requests(rollouts, rows, positions, counts)  # sizes the slot batch
    m = int(rollouts.state.tokens.shape[1])
    engine = Engine(model, rollouts.params, slots=src.size, max_len=m, chunk_steps=m,
                    cache_dtype=rollouts.cache_dtype)
    engine.submit_branch(rollouts, rows, positions, counts, key=key, row_keys=row_keys,
                         max_new_tokens=max_new_tokens, keep_cache=True)
    (out,) = engine.run().values()
    return out
