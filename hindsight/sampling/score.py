"""Teacher-forced scoring of given responses under other contexts, prefix shared per context.

Each distinct context (e.g. question + feedback + reflection) is prefilled once into a cache; its
rows are copied to every response scored under it; then one forward pass over
``[context[-1], response[:-1]]`` at positions ``len(context) - 1 + t`` gives, at response position
t, the model's state predicting ``response[t]``. Outputs are aligned to the response positions
(``[B,T]``), so they line up with the sampler's ``logprobs`` for an importance ratio or a hindsight
divergence.

A context that starts like a sequence whose K/V a sampler already holds (HDL's hindsight context
``h`` opens with the policy prompt's system turn and question, and the root's cache holds them)
need not be prefilled from scratch: pass :class:`CachedPrefix` and each context continues a copy of
its cache row from the longest prefix the two share, so only the context's remaining tokens are
computed: with one response per context in the same cached pass as the response, with several in
one :func:`hindsight.sampling.decode.extend` whose rows are then copied to each response.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hindsight.models.layers import matmul
from hindsight.ops import chunked_token_logprobs
from hindsight.sampling import cache_rows, inputs
from hindsight.sampling.buckets import cache_len_bucket, pow2_bucket, prompt_bucket, round16
from hindsight.sampling.decode import extend, graph_and_weights, prefill, window_over


@dataclasses.dataclass(frozen=True)
class CachedPrefix:
    """K/V a sampler already computed, one cache row per scored context.

    Attributes:
      cache: a KV cache (e.g. ``Rollouts.state.cache`` of a ``keep_cache=True`` result); its
        length ``M`` bounds ``len(context) - 1 + len(response)`` of every scored pair.
      tokens: ``[C, M]`` the sequence whose K/V row ``rows[c]`` holds, per context.
      valid: ``[C]`` positions ``< valid[c]`` of that row are in the cache.
      rows: ``[C]`` the cache row of context ``c``.
      cache_dtype: the cache's dtype (None: the model's compute dtype).
    """
    cache: Any
    tokens: np.ndarray
    valid: np.ndarray
    rows: np.ndarray
    cache_dtype: Any = None

    @classmethod
    def of(cls, rollouts, rows) -> "CachedPrefix":
        """The cached rows ``rows [C]`` of a ``keep_cache=True`` :class:`Rollouts` (a row's K/V
        cover its prompt and response but the last sampled token, which was never fed)."""
        rows = np.asarray(rows, np.int32).reshape(-1)
        if rollouts.state.cache is None:
            raise ValueError("these rollouts carry no cache: submit them with keep_cache=True")
        tokens = np.asarray(jax.device_get(rollouts.state.tokens))[rows]
        valid = (rollouts.prompt_lengths[rows] + rollouts.lengths[rows] - 1).astype(np.int32)
        return cls(rollouts.state.cache, tokens, valid, rows, rollouts.cache_dtype)

    def shared(self, contexts) -> np.ndarray:
        """``[C]`` how many leading tokens of each context come from its cache row: the common
        prefix, at most ``valid`` and at most ``len(context) - 1`` (the scoring pass feeds the
        context's last token itself)."""
        out = np.zeros(len(contexts), np.int32)
        for c, ctx in enumerate(contexts):
            n = min(ctx.size - 1, int(self.valid[c]), self.tokens.shape[1])
            diff = np.nonzero(ctx[:n] != self.tokens[c, :n])[0]
            out[c] = diff[0] if diff.size else n
        return out


@functools.partial(jax.jit, static_argnames=("graphdef", "window"))
def _forward_hidden(graphdef, weights, cache, tokens, positions, *, window):
    return nnx.merge(graphdef, weights)(tokens, positions, cache=cache, return_hidden=True,
                                        kv_window=window)[0]


# jitted so that a call per HDL tree reuses one executable: run eagerly, the chunk scan inside is
# traced and compiled anew on every call (its body is a fresh closure)
@functools.partial(jax.jit, static_argnames=("chunk_size", "temperature"))
def _masked_logprobs(hidden, unembed, targets, mask, *, chunk_size, temperature):
    lp = chunked_token_logprobs(hidden, unembed, targets, chunk_size=chunk_size,
                                temperature=temperature)
    return jnp.where(mask, lp, 0.0)


def _bucket_floor(name, value):
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive int or None, got {value!r}")
    return value


@functools.partial(jax.jit, static_argnames=("graphdef", "window"))
def _forward_gather(graphdef, weights, cache, tokens, positions, index, *, window):
    hidden = _forward_hidden(graphdef, weights, cache, tokens, positions, window=window)
    return jnp.take_along_axis(hidden, index[..., None], axis=1)


def _check_prefix(prefix: CachedPrefix, ctx, lengths, context_index) -> int:
    """The prefix cache's length, after checking that it gives one row per context and holds every
    context with its responses."""
    n_c = len(ctx)
    if len(prefix.rows) != n_c or prefix.tokens.shape[0] != n_c or len(prefix.valid) != n_c:
        raise ValueError(f"`prefix` must give one cache row per context ({n_c}), got rows "
                         f"{len(prefix.rows)}, tokens {prefix.tokens.shape}, valid {len(prefix.valid)}")
    m = int(prefix.tokens.shape[1])
    clen = np.array([c.size for c in ctx], np.int32)
    need = clen[context_index] - 1 + lengths
    if need.max() > m:
        i = int(np.argmax(need))
        raise ValueError(f"response {i} ({lengths[i]} tokens) after its context "
                         f"({clen[context_index[i]]} tokens) needs {need[i]} cache slots, the "
                         f"prefix cache has {m}")
    return m


def _one_pass(model, graphdef, weights, ctx, resp, context_index, prefix: CachedPrefix, lengths,
              t_b: int, bb: int):
    """:func:`_prepare`'s outputs when every context has one response: each row is a copy of its
    context's cache row fed ``context[shared:] + response[:-1]`` from the shared prefix on, and the
    states at ``len(context) - 1 + t`` are gathered. One cache copy and one pass instead of the
    context's `extend`, a copy back and the response's pass: on SmolLM2 (HDL's ``h`` of ~114
    tokens sharing ~64 with the root, roots of 42-96 tokens, 2 rows, float32, 2 Zen 5 cores) 0.33
    instead of 0.41 s per call (medians of 12 alternating calls), the same log-probs."""
    m = _check_prefix(prefix, ctx, lengths, context_index)
    start = prefix.shared(ctx)[context_index]
    clen = np.array([c.size for c in ctx], np.int32)[context_index]
    rest = clen - start  # the context's tokens past its shared prefix, its last one included
    # widths rounded to 16 (a pass is compute-bound; contexts differ by tens of tokens), the
    # response part at its fixed bucket so that calls share shapes
    width = min(round16(int(rest.max())) + t_b, m)
    b = len(resp)
    feed = np.zeros((bb, width), np.int32)
    positions = np.full((bb, width), m, np.int32)  # padding writes past the cache: dropped
    index = np.zeros((bb, t_b), np.int32)
    targets = np.zeros((bb, t_b), np.int32)
    for i, (r, ci) in enumerate(zip(resp, context_index)):
        n = int(rest[i]) + r.size - 1
        feed[i, :n] = np.concatenate([ctx[ci][start[i]:], r[:-1]])
        positions[i, :n] = start[i] + np.arange(n)
        index[i] = np.minimum(rest[i] - 1 + np.arange(t_b), width - 1)
        targets[i, :r.size] = r
    axes = cache_rows.static_axes(model, m, prefix.cache_dtype)
    cache = cache_rows.take_rows(prefix.cache, np.pad(prefix.rows[context_index], (0, bb - b),
                                                      mode="edge"), axes)
    hidden = _forward_gather(graphdef, weights, cache, jnp.asarray(feed), jnp.asarray(positions),
                             jnp.asarray(index), window=window_over(positions, m))
    mask = np.arange(t_b)[None, :] < np.pad(lengths, (0, bb - b))[:, None]
    return hidden, targets, mask, b, int(lengths.max())


def _prefix_cache(model, graphdef, weights, ctx, prefix: CachedPrefix, lengths, context_index):
    """``(cache [pow2(C) rows], M)`` holding each context's K/V but its last token's: a copy of
    its :class:`CachedPrefix` row continued from the shared prefix by one `extend` pass over the
    contexts that go past it."""
    n_c = len(ctx)
    m = _check_prefix(prefix, ctx, lengths, context_index)
    clen = np.array([c.size for c in ctx], np.int32)
    start = prefix.shared(ctx)
    axes = cache_rows.static_axes(model, m, prefix.cache_dtype)
    cache = cache_rows.take_rows(prefix.cache, np.pad(prefix.rows, (0, pow2_bucket(n_c) - n_c),
                                                      mode="edge"), axes)
    rest = clen - 1 - start  # tokens to compute: start .. len - 2 (the last is fed with the response)
    todo = np.nonzero(rest > 0)[0]
    if todo.size:
        # only the contexts with tokens past their shared prefix go through the pass (HDL's
        # re-score of the root under its own prompt has none); rounded to 16, not to a power of
        # two: the pass is compute-bound and contexts differ by tens of tokens (feedback, reflection)
        rows, width = pow2_bucket(todo.size), min(round16(int(rest.max())), m)
        feed = np.zeros((rows, width), np.int32)
        positions = np.full((rows, width), m, np.int32)  # padding writes past the cache: dropped
        for i, c in enumerate(todo):
            feed[i, :rest[c]] = ctx[c][start[c]:clen[c] - 1]
            positions[i, :rest[c]] = start[c] + np.arange(rest[c])
        sub = cache_rows.take_rows(prefix.cache, np.pad(prefix.rows[todo], (0, rows - todo.size),
                                                        mode="edge"), axes)
        sub = extend(graphdef, weights, sub, jnp.asarray(feed), jnp.asarray(positions),
                     window=window_over(positions, m))
        cache = cache_rows.move_rows(cache, todo, sub, np.arange(todo.size), axes)
    return cache, m


def _prepare(model, contexts, responses, context_index, cache_dtype, min_response_len=None,
             min_context_len=None, prefix: CachedPrefix | None = None):
    vocab = model.config.vocab_size
    ctx = inputs.token_lists("contexts", contexts, vocab_size=vocab)
    resp = inputs.token_lists("responses", responses, vocab_size=vocab)
    n_c, b = len(ctx), len(resp)
    if context_index is None:
        if b % n_c:
            raise ValueError(f"{b} responses cannot be split into contiguous groups over {n_c} contexts; "
                             f"pass `context_index`")
        context_index = np.repeat(np.arange(n_c), b // n_c)
    context_index = np.asarray(context_index)
    if context_index.shape != (b,) or not np.issubdtype(context_index.dtype, np.integer):
        raise ValueError(f"`context_index` must be {b} ints, got shape {context_index.shape}")
    if context_index.min() < 0 or context_index.max() >= n_c:
        raise ValueError(f"`context_index` must lie in [0, {n_c}), got {context_index.min()}..{context_index.max()}")
    lengths = np.array([r.size for r in resp], np.int32)
    floor = _bucket_floor("min_response_len", min_response_len)
    # a caller that fixes the response width (one shape for all its calls) gets that width, rounded
    # to 16, not the next power of two: HDL's T = 96 is scored 96 wide, not 128
    t_b = (round16(floor) if floor >= lengths.max() else
           pow2_bucket(int(lengths.max()), 16))
    clen = np.array([c.size for c in ctx], np.int32)[context_index]
    bb = pow2_bucket(b)
    graphdef, weights = graph_and_weights(model)
    if prefix is None:
        s_b = prompt_bucket(max(int(clen.max()), _bucket_floor("min_context_len", min_context_len)))
        m = cache_len_bucket(s_b, t_b)
        cache = prefill(graphdef, weights,
                        jnp.asarray(inputs.pad_rows(ctx, rows=pow2_bucket(n_c), width=s_b)),
                        max_len=m, cache_dtype=cache_dtype)
    elif np.bincount(context_index, minlength=n_c).max() == 1:
        # one response per context (HDL's roots under their own ``h``): the context's remaining
        # tokens and the response go through one cached pass from a copy of the context's row
        return _one_pass(model, graphdef, weights, ctx, resp, context_index, prefix, lengths,
                         t_b, bb)
    else:
        cache, m = _prefix_cache(model, graphdef, weights, ctx, prefix, lengths, context_index)
        cache_dtype = prefix.cache_dtype
    axes = cache_rows.static_axes(model, m, cache_dtype)
    src = np.zeros(bb, np.int32)
    src[:b] = context_index
    cache = cache_rows.take_rows(cache, src, axes)
    feed = np.zeros((bb, t_b), np.int32)
    targets = np.zeros((bb, t_b), np.int32)
    positions = np.zeros((bb, t_b), np.int32)
    for i, (r, ci) in enumerate(zip(resp, context_index)):
        feed[i, 0] = ctx[ci][-1]
        feed[i, 1: r.size] = r[:-1]
        targets[i, : r.size] = r
        positions[i] = clen[i] - 1 + np.arange(t_b)
    # every position of a row that holds a response (its padding too) stays below the window
    hidden = _forward_hidden(graphdef, weights, cache, jnp.asarray(feed), jnp.asarray(positions),
                             window=window_over(np.minimum(positions[:b], m - 1), m))
    mask = np.arange(t_b)[None, :] < np.pad(lengths, (0, bb - b))[:, None]
    return hidden, targets, mask, b, int(lengths.max())


def score_hidden(model, contexts, responses, *, context_index=None, cache_dtype=None,
                 min_response_len=None, min_context_len=None, prefix: CachedPrefix | None = None):
    """Final hidden states predicting each response token under its context.

    Args:
      model: NNX decoder (``return_hidden`` and ``unembedding()``).
      contexts: C token sequences (each non-empty).
      responses: B token sequences (each non-empty; lengths may differ).
      context_index: ``[B]`` context of each response (default: contiguous groups, ``B % C == 0``).
      min_response_len, min_context_len: pad the responses / contexts to the buckets of at least
        these lengths (:mod:`hindsight.sampling.buckets`), so that calls whose lengths vary (e.g.
        one per HDL tree) share one compiled shape instead of compiling per bucket they hit (the
        responses to ``min_response_len`` rounded up to 16 when none is longer).
      prefix: :class:`CachedPrefix`, one cache row per context: each context is computed from
        the prefix it shares with its row's sequence on (``min_context_len`` and ``cache_dtype``
        do not apply; the cache's length must hold every context and its responses).
    Returns:
      ``(hidden [B,T,D], mask [B,T] bool)`` with T the longest response; ``hidden[b,t]`` is the
      state from which ``responses[b][t]`` is predicted. Feed it with ``model.unembedding()`` to any
      ``hindsight.ops.chunked_*`` reduction.
    """
    hidden, _, mask, b, t = _prepare(model, contexts, responses, context_index, cache_dtype,
                                     min_response_len, min_context_len, prefix)
    return hidden[:b, :t], jnp.asarray(mask[:b, :t])


def score_logprobs(model, contexts, responses, *, context_index=None, chunk_size: int = 256,
                   temperature: float = 1.0, cache_dtype=None, min_response_len=None,
                   min_context_len=None, prefix: CachedPrefix | None = None):
    """Teacher-forced log-probs ``[B,T]`` float32 of each response token under its context (0 past
    a response's end), computed in vocabulary chunks (no ``[B,T,V]`` logits). ``T`` is the longest
    response; ``min_response_len`` / ``min_context_len`` as in :func:`score_hidden` (they change
    the compiled shapes, not the result); ``prefix`` as there (the same log-probs, up to float
    rounding, with the shared prefix's K/V taken from a sampler's cache)."""
    hidden, targets, mask, b, t = _prepare(model, contexts, responses, context_index, cache_dtype,
                                           min_response_len, min_context_len, prefix)
    return _masked_logprobs(hidden, model.unembedding(), jnp.asarray(targets), jnp.asarray(mask),
                            chunk_size=chunk_size, temperature=float(temperature))[:b, :t]


def score_logits(model, contexts, responses, *, context_index=None, cache_dtype=None):
    """Float32 logits ``[B,T,V]`` predicting each response token under its context (0 past a
    response's end). Materialises all logits: for short spans and inspection."""
    hidden, _, mask, b, t = _prepare(model, contexts, responses, context_index, cache_dtype)
    logits = matmul(hidden, model.unembedding(), dtype=model.dtype)
    return jnp.where(jnp.asarray(mask)[..., None], logits, 0.0)[:b, :t]
