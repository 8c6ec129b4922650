"""Group sampling: prefill each prompt once, fan its cache out to G rows, decode them together.

``generate`` returns a `Rollouts`, which keeps the final decode state (cache included) so that
:func:`hindsight.sampling.branch` can continue any row from any response position without
recomputing its prefix.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from hindsight.sampling import cache_rows, inputs
from hindsight.sampling.buckets import cache_len_bucket, pow2_bucket, prompt_bucket
from hindsight.sampling.decode import DecodeState, decode_steps, prefill, split_model
from hindsight.sampling.params import SamplingParams


@dataclasses.dataclass(frozen=True)
class Rollouts:
    """Sampled responses of B rows (rows of a group are contiguous), host-side numpy plus the device
    decode state for branching.

    Attributes:
      tokens: ``[B,T]`` int32 response tokens (0 after the length), T = the call's max new tokens.
      mask: ``[B,T]`` bool, True on real response tokens (the stop token included).
      lengths: ``[B]`` int32 response lengths.
      logprobs: ``[B,T]`` f32 log-probs under the sampled (temperature + truncation) distribution
        (0 where masked; 0 everywhere for greedy).
      policy_logprobs: ``[B,T]`` f32 untruncated log-probs at the sampling temperature (0 where masked).
      prompt_lengths: ``[B]`` int32.
      stopped: ``[B]`` bool, the row ended on a stop token (else it hit its max new tokens).
      branch_positions: ``[B]`` int32, first response position this call sampled (0 for fresh rows;
        for a branch, the resampled position: positions before it are the parent's tokens, so an
        HDL loss mask is ``mask & (t >= branch_positions[:, None])``).
      parents: ``[B]`` int32, the source row of a branch in the parent `Rollouts`, -1 for fresh rows.
      max_new_tokens: ``[B]`` int32 per-row cap the rows were sampled with.
      keys: ``[B]`` typed PRNG keys, one per row.
      params: the `SamplingParams` used.
      state: device `DecodeState` (rows ``>= B`` are bucket padding).
    """

    tokens: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    logprobs: np.ndarray
    policy_logprobs: np.ndarray
    prompt_lengths: np.ndarray
    stopped: np.ndarray
    branch_positions: np.ndarray
    parents: np.ndarray
    max_new_tokens: np.ndarray
    keys: jax.Array
    params: SamplingParams
    state: DecodeState = dataclasses.field(repr=False)
    axes: cache_rows._Axes = dataclasses.field(repr=False)

    @property
    def num_rows(self) -> int:
        return int(self.lengths.shape[0])

    def sequence(self, row: int) -> np.ndarray:
        """Prompt + response token ids of ``row``."""
        end = int(self.prompt_lengths[row] + self.lengths[row])
        return np.asarray(jax.device_get(self.state.tokens[row, :end]))

    def prompt(self, row: int) -> np.ndarray:
        return np.asarray(jax.device_get(self.state.tokens[row, : int(self.prompt_lengths[row])]))


def init_state(cache, *, tokens, starts, ends, rows, keys, stops, logprobs=None,
               policy_logprobs=None) -> DecodeState:
    """Decode state for ``rows`` real rows of a bucketed slot batch.

    Args:
      cache: device cache with the slot batch's row count.
      tokens: ``[Bb,M]`` int32 host sequences; positions ``>= starts + 1`` are cleared.
      starts: ``[rows]`` absolute position of each row's unfed last token.
      ends: ``[rows]`` exclusive generation limit per row.
      keys: ``[Bb]`` typed keys; stops: ``[Bb,K]``.
    """
    bb, m = tokens.shape
    pos = np.zeros(bb, np.int32)
    pos[:rows] = starts
    keep = np.arange(m)[None, :] <= pos[:, None]
    tokens = np.where(keep, tokens, 0).astype(np.int32)
    zeros = np.zeros((bb, m), np.float32)
    lp = zeros if logprobs is None else np.where(keep, logprobs, 0).astype(np.float32)
    plp = zeros if policy_logprobs is None else np.where(keep, policy_logprobs, 0).astype(np.float32)
    end = np.ones(bb, np.int32)
    end[:rows] = ends
    active = np.arange(bb) < rows
    return DecodeState(cache=cache, tokens=jnp.asarray(tokens), logprobs=jnp.asarray(lp),
                       policy_logprobs=jnp.asarray(plp),
                       last=jnp.asarray(tokens[np.arange(bb), pos]), pos=jnp.asarray(pos),
                       end=jnp.asarray(end), active=jnp.asarray(active),
                       # a fresh buffer: the state is donated, the caller's keys must survive
                       keys=jax.random.wrap_key_data(jnp.array(jax.random.key_data(keys), copy=True)),
                       stops=jnp.asarray(stops))


def collect(state: DecodeState, *, rows: int, prompt_lengths, max_new_tokens, parents,
            branch_positions, keys, params, axes) -> Rollouts:
    """Cut the first ``rows`` rows of a finished decode state into a `Rollouts`."""
    host = jax.device_get((state.tokens, state.logprobs, state.policy_logprobs, state.pos, state.stops))
    seq, lp, plp, pos, stops = (np.asarray(x)[:rows] for x in host)
    t_max = int(max_new_tokens.max())
    lengths = (pos - prompt_lengths + 1).astype(np.int32)
    idx = prompt_lengths[:, None] + np.arange(t_max)[None, :]
    idx_c = np.minimum(idx, seq.shape[1] - 1)
    mask = np.arange(t_max)[None, :] < lengths[:, None]
    take = lambda a: np.where(mask, np.take_along_axis(a, idx_c, axis=1), 0)
    last_tok = seq[np.arange(rows), pos]
    stopped = np.any(last_tok[:, None] == stops, axis=-1)
    return Rollouts(tokens=take(seq).astype(np.int32), mask=mask, lengths=lengths,
                    logprobs=take(lp).astype(np.float32), policy_logprobs=take(plp).astype(np.float32),
                    prompt_lengths=np.asarray(prompt_lengths, np.int32), stopped=stopped,
                    branch_positions=np.asarray(branch_positions, np.int32),
                    parents=np.asarray(parents, np.int32),
                    max_new_tokens=np.asarray(max_new_tokens, np.int32), keys=keys, params=params,
                    state=state, axes=axes)


def generate(model, prompts, params: SamplingParams, *, key=None, row_keys=None, num_samples: int = 1,
             max_new_tokens=None, stop_tokens=None, max_len: int | None = None,
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
      max_len: fixed cache length (default: bucketed from the prompt and max new tokens); a prompt
        plus its max new tokens must fit.
      cache_dtype: KV-cache dtype (default the model's compute dtype).
    Returns:
      `Rollouts` with ``B = P * num_samples`` rows.
    """
    vocab = model.config.vocab_size
    params.check_vocab(vocab)
    seqs = inputs.token_lists("prompts", prompts, vocab_size=vocab)
    if int(num_samples) != num_samples or num_samples < 1:
        raise ValueError(f"`num_samples` must be a positive int, got {num_samples}")
    n_p, g = len(seqs), int(num_samples)
    rows = n_p * g
    plen = np.repeat(np.array([s.size for s in seqs], np.int32), g)
    max_new = inputs.per_row_ints("max_new_tokens", params.max_new_tokens if max_new_tokens is None
                                  else max_new_tokens, rows, minimum=1)
    s_bucket = prompt_bucket(int(plen.max()))
    m = cache_len_bucket(s_bucket, int(max_new.max())) if max_len is None else int(max_len)
    over = np.nonzero(plen + max_new > m)[0]
    if over.size:
        r = int(over[0])
        raise ValueError(f"prompt of row {r} ({plen[r]} tokens) plus max_new_tokens ({max_new[r]}) exceeds the "
                         f"cache length max_len={m}")
    s_bucket = min(s_bucket, m)
    stops = inputs.stop_table(stop_tokens, rows, default=params.stop_tokens, vocab_size=vocab)
    keys = inputs.row_keys(key, row_keys, rows)

    graphdef, weights = split_model(model, decode=True)
    axes = cache_rows.static_axes(model, m, cache_dtype)
    prompt_cache = prefill(graphdef, weights, jnp.asarray(inputs.pad_rows(seqs, rows=pow2_bucket(n_p), width=s_bucket)),
                           max_len=m, cache_dtype=cache_dtype)
    bb = pow2_bucket(rows)
    src = np.zeros(bb, np.int32)
    src[:rows] = np.repeat(np.arange(n_p), g)
    cache = cache_rows.take_rows(prompt_cache, src, axes)
    tokens = inputs.pad_rows([seqs[i] for i in src[:rows]], rows=bb, width=m)
    state = init_state(cache, tokens=tokens, starts=plen - 1, ends=plen + max_new,
                       rows=rows, keys=inputs.pad_keys(keys, bb),
                       stops=np.concatenate([stops, np.full((bb - rows, stops.shape[1]), -1, np.int32)]))
    state = decode_steps(graphdef, weights, state, jnp.int32(max_new.max()), jnp.int32(0), params=params.for_trace())
    return collect(state, rows=rows, prompt_lengths=plen, max_new_tokens=max_new,
                   parents=np.full(rows, -1), branch_positions=np.zeros(rows), keys=keys, params=params,
                   axes=axes)
