"""Teacher-forced scoring of given responses under other contexts, prefix shared per context.

Each distinct context (e.g. question + feedback + reflection) is prefilled once into a cache; its
rows are copied to every response scored under it; then one forward pass over
``[context[-1], response[:-1]]`` at positions ``len(context) - 1 + t`` gives, at response position
t, the model's state predicting ``response[t]``. Outputs are aligned to the response positions
(``[B,T]``), so they line up with the sampler's ``logprobs`` for an importance ratio or a hindsight
divergence.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hindsight.models.layers import matmul
from hindsight.ops import chunked_token_logprobs
from hindsight.sampling import cache_rows, inputs
from hindsight.sampling.buckets import cache_len_bucket, pow2_bucket, prompt_bucket
from hindsight.sampling.decode import graph_and_weights, prefill


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _forward_hidden(graphdef, weights, cache, tokens, positions):
    return nnx.merge(graphdef, weights)(tokens, positions, cache=cache, return_hidden=True)[0]


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


def _prepare(model, contexts, responses, context_index, cache_dtype, min_response_len=None,
             min_context_len=None):
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
    t_b = pow2_bucket(max(int(lengths.max()), _bucket_floor("min_response_len", min_response_len)), 16)
    clen = np.array([c.size for c in ctx], np.int32)[context_index]
    s_b = prompt_bucket(max(int(clen.max()), _bucket_floor("min_context_len", min_context_len)))
    m = cache_len_bucket(s_b, t_b)
    bb = pow2_bucket(b)
    graphdef, weights = graph_and_weights(model)
    axes = cache_rows.static_axes(model, m, cache_dtype)
    cache = prefill(graphdef, weights, jnp.asarray(inputs.pad_rows(ctx, rows=pow2_bucket(n_c), width=s_b)),
                    max_len=m, cache_dtype=cache_dtype)
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
    hidden = _forward_hidden(graphdef, weights, cache, jnp.asarray(feed), jnp.asarray(positions))
    mask = np.arange(t_b)[None, :] < np.pad(lengths, (0, bb - b))[:, None]
    return hidden, targets, mask, b, int(lengths.max())


def score_hidden(model, contexts, responses, *, context_index=None, cache_dtype=None,
                 min_response_len=None, min_context_len=None):
    """Final hidden states predicting each response token under its context.

    Args:
      model: NNX decoder (``return_hidden`` and ``unembedding()``).
      contexts: C token sequences (each non-empty).
      responses: B token sequences (each non-empty; lengths may differ).
      context_index: ``[B]`` context of each response (default: contiguous groups, ``B % C == 0``).
      min_response_len, min_context_len: pad the responses / contexts to the buckets of at least
        these lengths (:mod:`hindsight.sampling.buckets`), so that calls whose lengths vary (e.g.
        one per HDL tree) share one compiled shape instead of compiling per bucket they hit.
    Returns:
      ``(hidden [B,T,D], mask [B,T] bool)`` with T the longest response; ``hidden[b,t]`` is the
      state from which ``responses[b][t]`` is predicted. Feed it with ``model.unembedding()`` to any
      ``hindsight.ops.chunked_*`` reduction.
    """
    hidden, _, mask, b, t = _prepare(model, contexts, responses, context_index, cache_dtype,
                                     min_response_len, min_context_len)
    return hidden[:b, :t], jnp.asarray(mask[:b, :t])


def score_logprobs(model, contexts, responses, *, context_index=None, chunk_size: int = 256,
                   temperature: float = 1.0, cache_dtype=None, min_response_len=None,
                   min_context_len=None):
    """Teacher-forced log-probs ``[B,T]`` float32 of each response token under its context (0 past
    a response's end), computed in vocabulary chunks (no ``[B,T,V]`` logits). ``T`` is the longest
    response; ``min_response_len`` / ``min_context_len`` as in :func:`score_hidden` (they change
    the compiled shapes, not the result)."""
    hidden, targets, mask, b, t = _prepare(model, contexts, responses, context_index, cache_dtype,
                                           min_response_len, min_context_len)
    return _masked_logprobs(hidden, model.unembedding(), jnp.asarray(targets), jnp.asarray(mask),
                            chunk_size=chunk_size, temperature=float(temperature))[:b, :t]


def score_logits(model, contexts, responses, *, context_index=None, cache_dtype=None):
    """Float32 logits ``[B,T,V]`` predicting each response token under its context (0 past a
    response's end). Materialises all logits: for short spans and inspection."""
    hidden, _, mask, b, t = _prepare(model, contexts, responses, context_index, cache_dtype)
    logits = matmul(hidden, model.unembedding(), dtype=model.dtype)
    return jnp.where(jnp.asarray(mask)[..., None], logits, 0.0)[:b, :t]
