"""Group sampling: ``generate`` samples G responses to each of P prompts, each prompt prefilled once
and its cache copied to its G rows.

It is one `Engine` request run to completion: an engine with a slot per row, decoding them all in
one chunk. The result keeps the final slot batch (cache included) so that
:func:`hindsight.sampling.branch` can continue any row from any response position without
recomputing its prefix.
"""
from __future__ import annotations

import numpy as np

from hindsight.sampling import inputs
from hindsight.sampling.buckets import cache_len_bucket
from hindsight.sampling.engine import Engine, Rollouts
from hindsight.sampling.params import SamplingParams

__all__ = ["Rollouts", "generate"]


def generate(model, prompts, params: SamplingParams, *, key=None, row_keys=None, num_samples: int = 1,
             max_new_tokens=None, stop_tokens=None, stop_check=None, max_len: int | None = None,
             cache_dtype=None) -> Rollouts:
    """Sample ``num_samples`` responses per prompt; each prompt is prefilled once.

    Args:
      model: NNX decoder obeying ``model(tokens, positions, *, cache, return_hidden)`` and
        ``model.init_cache(batch, max_len, *, dtype)``.
      prompts: P token-id sequences (each non-empty).
      params: `SamplingParams`.
      key: PRNG key split into one key per row (default ``jax.random.key(0)``).
      row_keys: ``[P*G]`` explicit per-row keys instead (a row's draws depend only on its key).
      num_samples: G rows per prompt; output rows ``[p*G, (p+1)*G)`` belong to prompt p.
      max_new_tokens: int or ``[P*G]`` per-row caps (default ``params.max_new_tokens``).
      stop_tokens: None (``params.stop_tokens``), one id sequence for all rows, or P*G sequences.
      stop_check: a stop-string check (:class:`hindsight.sampling.text.StopStrings`), see
        :meth:`hindsight.sampling.engine.Engine.submit`.
      max_len: fixed cache length (default: bucketed from the prompt and max new tokens); a prompt
        plus its max new tokens must fit.
      cache_dtype: KV-cache dtype (default the model's compute dtype).
    Returns:
      `Rollouts` with ``B = P * num_samples`` rows, with their cache (for `branch`).
    """
    vocab = model.config.vocab_size
    params.check_vocab(vocab)
    seqs = inputs.token_lists("prompts", prompts, vocab_size=vocab)
    if int(num_samples) != num_samples or num_samples < 1:
        raise ValueError(f"`num_samples` must be a positive int, got {num_samples}")
    g = int(num_samples)
    rows = len(seqs) * g
    plen = np.repeat(np.array([s.size for s in seqs], np.int32), g)
    max_new = inputs.per_row_ints("max_new_tokens", params.max_new_tokens if max_new_tokens is None
                                  else max_new_tokens, rows, minimum=1)
    m = cache_len_bucket(int(plen.max()), int(max_new.max())) if max_len is None else int(max_len)
    over = np.nonzero(plen + max_new > m)[0]
    if over.size:
        r = int(over[0])
        raise ValueError(f"prompt of row {r} ({plen[r]} tokens) plus max_new_tokens ({max_new[r]}) exceeds the "
                         f"cache length max_len={m}")
    stops = inputs.stop_table(stop_tokens, rows, default=params.stop_tokens, vocab_size=vocab)
    keys = inputs.row_keys(key, row_keys, rows)
    # one slot per row, and a chunk long enough for any row (none runs past the cache); with a
    # stop-string check, chunks of 16 steps so that rows end soon after their string
    engine = Engine(model, params, slots=rows, max_len=m, chunk_steps=16 if stop_check else m,
                    cache_dtype=cache_dtype)
    engine._submit_prompts(seqs, g, max_new=max_new, keys=keys, stops=stops, keep_cache=True,
                           stop_check=stop_check)
    (out,) = engine.run().values()
    return out
