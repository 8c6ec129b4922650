"""The jitted core of the engine: prefill a cache, then decode a slot batch with a ``lax.while_loop``.

Row convention (shared by prompts, their group fan-out, branches and follow-up turns): a row is
described by ``(last, pos)``, the token at absolute position ``pos`` that has *not yet been fed*;
its K/V for positions ``< pos`` are in the cache. One decode step feeds ``last`` at ``pos`` (writing slot
``pos``), samples the token for ``pos + 1`` with key ``fold_in(row_key, pos + 1)`` and moves on.
Hence:

* a prompt of length n starts at ``(prompt[n-1], n-1)`` after a prefill (the prefill also writes
  slot n-1; the first step rewrites it with identical values, so no prefill logits are needed);
* a branch of a finished row at absolute position a (token a resampled) starts at
  ``(tokens[a-1], a-1)`` on a copy of that row's cache: no prefix recomputation;
* the token at absolute position t is always drawn with ``fold_in(row_key, t)``, so a row's draws
  depend only on its key and its own prefix, never on batch neighbours, padding or chunking (the
  slot batch's width, which the engine resizes, can change the last bits of its log-probs: XLA:CPU
  rounds a matmul differently per batch size), and a
  branch at a reproduces decoding from scratch with ``prompt + response[:a]`` as the prompt;
* a follow-up turn ``s`` (S tokens) after a finished sequence of length L starts at
  ``(s[S-1], L+S-1)`` once `extend` has written ``[seq[L-1], s[:S-1]]`` at ``L-1 .. L+S-2`` on a
  copy of that row's cache (the sequence's last token may never have been fed).

Finished and padding rows stay in the batch (fixed shapes) and keep feeding their ``(last, pos)``:
that rewrites slot ``pos`` with the K/V the sequence has there anyway, so their caches stay valid
for later branching.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hindsight.models.decoder import Decoder, unrolled
from hindsight.sampling.buckets import prompt_bucket
from hindsight.sampling.params import SamplingParams
from hindsight.sampling.truncation import sample_tokens


class DecodeState(NamedTuple):
    """Donated decode carry for a slot batch of B rows and cache length M.

    Attributes:
      cache: the model's KV-cache pytree (B rows, M slots).
      tokens: ``[B,M]`` int32, each row's sequence by absolute position (prompt, then response).
      logprobs: ``[B,M]`` f32, sampled-distribution log-prob of the token at each generated position.
      policy_logprobs: ``[B,M]`` f32, untruncated log-prob at the sampling temperature at each generated position.
      raw_logprobs: ``[B,M]`` f32, untruncated log-prob at temperature 1 (the raw logits) at each
        generated position: what a re-score at temperature 1 would give (HDL scores at 1 whatever
        the sampling temperature), kept so that no re-score is needed.
      last: ``[B]`` int32, the token at ``pos`` (not yet fed).
      pos: ``[B]`` int32.
      end: ``[B]`` int32, a row may generate positions ``< end``.
      active: ``[B]`` bool, still generating.
      keys: ``[B]`` typed PRNG keys, one per row.
      stops: ``[B,K]`` int32 stop ids per row, ``-1`` = unused.
    """

    cache: Any
    tokens: jax.Array
    logprobs: jax.Array
    policy_logprobs: jax.Array
    raw_logprobs: jax.Array
    last: jax.Array
    pos: jax.Array
    end: jax.Array
    active: jax.Array
    keys: jax.Array
    stops: jax.Array


def _advance(model, st: DecodeState, params: SamplingParams, window: int | None) -> DecodeState:
    """One decode step for every row (inactive rows are recomputed but left unchanged), attending
    over the cache's first ``window`` slots (None: all)."""
    logits, cache = model(st.last[:, None], st.pos[:, None], cache=st.cache, kv_window=window)
    nxt = st.pos + 1
    keys = jax.vmap(jax.random.fold_in)(st.keys, nxt)
    tok, lp, plp = sample_tokens(logits[:, 0], keys, params)
    if params.greedy or params.temperature == 1.0:  # the policy log-prob is already at temperature 1
        raw = plp
    else:
        raw = jnp.take_along_axis(jax.nn.log_softmax(logits[:, 0].astype(jnp.float32), axis=-1),
                                  tok[:, None], axis=-1)[:, 0]
    write = st.active[:, None] & (jnp.arange(st.tokens.shape[1])[None, :] == nxt[:, None])
    stop_hit = jnp.any(tok[:, None] == st.stops, axis=-1)
    done = stop_hit | (nxt >= st.end - 1)
    return DecodeState(
        cache=cache,
        tokens=jnp.where(write, tok[:, None], st.tokens),
        logprobs=jnp.where(write, lp[:, None], st.logprobs),
        policy_logprobs=jnp.where(write, plp[:, None], st.policy_logprobs),
        raw_logprobs=jnp.where(write, raw[:, None], st.raw_logprobs),
        last=jnp.where(st.active, tok, st.last),
        pos=jnp.where(st.active, nxt, st.pos),
        end=st.end,
        active=st.active & ~done,
        keys=st.keys,
        stops=st.stops)


@functools.partial(jax.jit, static_argnames=("graphdef", "params", "window"),
                   donate_argnames=("state",))
def decode_steps(graphdef, weights, state: DecodeState, num_steps, min_active=0, *,
                 params: SamplingParams, window: int | None = None) -> DecodeState:
    """Run up to ``num_steps`` (traced int) decode steps; exits early once at most ``min_active``
    (traced int) rows are still active (0: once none is; a scheduler with queued work passes
    ``active - k`` to get control back as soon as k slots are free).

    ``window`` (static; None: the cache's length M): attention reads only the cache's first
    ``window`` slots, so every row's ``pos`` must stay below it for all ``num_steps`` steps
    (:func:`kv_window` gives one). ``state`` is donated, so the cache is updated in place.
    Compiles once per ``(graphdef, B, M, K, params, window)``.
    """
    model = nnx.merge(graphdef, weights)

    def cond(carry):
        i, st = carry
        return (i < num_steps) & (jnp.sum(st.active) > min_active)

    def body(carry):
        i, st = carry
        return i + 1, _advance(model, st, params, window)

    return jax.lax.while_loop(cond, body, (jnp.int32(0), state))[1]


WINDOW_MIN = 128  # the smallest decode window: one compiled decode program per power of two above


def kv_window(max_pos: int, num_steps: int, max_len: int) -> int:
    """The decode window for a chunk of ``num_steps`` steps whose rows start at positions
    ``<= max_pos`` in a cache of ``max_len`` slots: the smallest power of two (at least
    :data:`WINDOW_MIN`) above every position the chunk feeds, at most ``max_len``. Powers of two
    bound the compiled programs to ``log2(M / 128) + 1`` per slot batch and waste at most half
    of the window's reads."""
    need = int(max_pos) + int(num_steps)  # positions fed: <= max_pos + num_steps - 1
    return min(int(max_len), max(WINDOW_MIN, 1 << max(need - 1, 0).bit_length()))


@functools.partial(jax.jit, static_argnames=("graphdef", "max_len", "cache_dtype"))
def prefill(graphdef, weights, tokens: jax.Array, *, max_len: int, cache_dtype=None):
    """Fresh cache of ``max_len`` slots holding the K/V of right-padded prompts ``tokens [n,S]``.

    Pad positions write slots a real token overwrites before they are ever read. Attention reads
    the window of slots holding positions ``< S`` only (:func:`kv_window`).
    """
    model = nnx.merge(graphdef, weights)
    cache = model.init_cache(tokens.shape[0], max_len, dtype=cache_dtype)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    return model(tokens, positions, cache=cache, return_hidden=True,
                 kv_window=kv_window(tokens.shape[1] - 1, 1, max_len))[1]


def window_over(positions, max_len: int) -> int:
    """The attention window for a cached forward feeding ``positions`` (host ints; entries
    ``>= max_len`` are padding, whose writes are dropped): :func:`kv_window` above the largest
    real one."""
    positions = np.asarray(positions)
    real = positions[positions < max_len]
    return kv_window(int(real.max(initial=0)), 1, max_len)


@functools.partial(jax.jit, static_argnames=("graphdef", "window"), donate_argnames=("cache",))
def extend(graphdef, weights, cache, tokens: jax.Array, positions: jax.Array, *,
           window: int | None = None):
    """``cache`` (donated) with the K/V of ``tokens [n,S]`` written at ``positions [n,S]``: a prefill
    that continues rows already holding a prefix. As in `prefill`, right padding writes slots that
    a real token overwrites before they are read (or positions past the cache, which are dropped).
    ``window`` (static; None: all slots): attention reads the cache's first ``window`` slots, which
    must hold every real position (:func:`window_over`); a turn appended early in a long cache
    (an episode's observation) then does not attend over all of it.
    """
    return nnx.merge(graphdef, weights)(tokens, positions, cache=cache, return_hidden=True,
                                        kv_window=window)[1]


EXTEND_CHUNK = 128  # the most positions one cached forward of a long turn or prompt feeds


def extend_in_chunks(graphdef, weights, cache, tokens: np.ndarray, positions: np.ndarray,
                     real: np.ndarray, *, max_len: int):
    """``cache`` (donated) with the K/V of the ``real [n,S]`` tokens of ``tokens [n,S]`` written at
    ``positions [n,S]`` (host arrays; each row's real tokens first, then padding), fed by
    :func:`extend` in pieces of at most :data:`EXTEND_CHUNK` positions, each padded to the prompt
    bucket of its longest row's real tokens in it.

    Why pieces: an episode's observation turns and first prompts run to hundreds of tokens of
    every length, and a single cached forward compiles once per width bucket (and per rows bucket
    and attention window): SmolLM2's ScienceWorld rollouts compiled 14 extension programs in one
    timed rollout (~1.6 s each on 2 CPU cores; a large model on an accelerator takes tens of
    seconds each). In pieces, every width above 128 is 128-wide pieces plus a last piece of one
    of the widths up to 128, so the widths are the same whatever the lengths (the window still
    follows the positions). A piece attends to the K/V the pieces before it wrote, so the result
    is the one-pass result up to float rounding; a pass is compute-bound, so the pieces cost what
    the whole costs, their padding aside (ScienceWorld's turn extensions: 60.4 s in pieces vs
    68.2 s in one pass per turn, compiles included)."""
    total = int(real.sum(axis=1).max(initial=0))
    for done in range(0, total, EXTEND_CHUNK):
        take = min(EXTEND_CHUNK, total - done)
        width = min(prompt_bucket(take), max_len)
        piece, keep = slice(done, done + take), real[:, done:done + take]
        feed = np.zeros((tokens.shape[0], width), np.int32)
        pos = np.full((tokens.shape[0], width), max_len, np.int32)  # padding: writes dropped
        feed[:, :take] = np.where(keep, tokens[:, piece], 0)
        pos[:, :take] = np.where(keep, positions[:, piece], max_len)
        cache = extend(graphdef, weights, cache, jnp.asarray(feed), jnp.asarray(pos),
                       window=window_over(pos, max_len))
    return cache


def prefill_in_chunks(graphdef, weights, prompts, *, max_len: int, cache_dtype=None):
    """Fresh cache of ``max_len`` slots holding the K/V of ``prompts`` (token sequences, longest
    first, one row each): :func:`prefill` of their first :data:`EXTEND_CHUNK` positions (padded to
    the prompt bucket), the rest by :func:`extend_in_chunks`, so a prompt longer than 128 tokens
    compiles nothing new."""
    lengths = np.array([len(p) for p in prompts])
    longest = int(lengths.max())
    width = min(prompt_bucket(min(longest, EXTEND_CHUNK)), max_len)
    tokens = np.zeros((len(prompts), max(width, longest)), np.int32)
    for i, p in enumerate(prompts):
        tokens[i, :len(p)] = p
    cache = prefill(graphdef, weights, jnp.asarray(tokens[:, :width]), max_len=max_len,
                    cache_dtype=cache_dtype)
    if longest <= width:
        return cache
    rest = np.arange(width, longest)
    return extend_in_chunks(graphdef, weights, cache, tokens[:, width:longest],
                            np.broadcast_to(rest, (len(prompts), rest.size)),
                            rest[None, :] < lengths[:, None], max_len=max_len)


def graph_and_weights(model, *, unroll: bool = False):
    """``(graphdef, weights)`` of an NNX model: the weights travel as a traced argument, so the jitted
    functions compile once per architecture and batch shape, not once per weight update.

    ``unroll=True`` (the token-by-token decode loop) splits
    :func:`hindsight.models.decoder.unrolled` instead: a layer scan costs a copy of each layer's
    weights per decode step on CPU."""
    return nnx.split(unrolled(model) if unroll and isinstance(model, Decoder) else model)
