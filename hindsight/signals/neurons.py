"""Neuron-OPSD's neuron signals (spec ``other-methods.md`` §8, steps 1-4): neuron scores, the
neuron set ``N(x)`` of a response, consensus, Jaccard distances, the bottom-fraction selection and
the K-nearest retrieval.

Step 1, the score of neuron ``i`` of layer ``l`` for the token ``y`` a position predicts (eqs 2-3):
``S^l_{y,i} = k^l_i * (w^l_{out,i} . e_y)``, with ``k^l`` the gated MLP's post-activation
``silu(x W_gate) * (x W_up)`` (the down projection's input), ``w^l_{out,i}`` row ``i`` of the down
projection and ``e_y`` the unembedding row of ``y``: neuron ``i``'s direct contribution to the
logit of ``y``.

Step 2, the set ``N(x)`` (the reading, with OUR CHOICE where it is silent): the response is cut
into chunks of ``chunk_tokens`` consecutive tokens (OUR CHOICE: 16); in each chunk, per layer, the
top ``neurons_per_layer`` (2000) ``(token, neuron)`` pairs by score are kept and deduplicated per
neuron by their max score; over all layers the chunk's top ``num_neurons`` (``K = 5000``) neurons
by that score are kept; ``N(x)`` is the union of the chunks' sets over the response. (A single
global top-K over the whole response would give every response the same ``|N(x)| = K`` whenever
``L * 2000 >= K``, and consensus would select nothing.) The per-layer part runs inside the
decoder's layer loop (:class:`hindsight.models.MLPReduce`): :func:`chunk_candidates` on the layer's
scores, :func:`merge_top` into a running top-K carried across the layers, so neither the
``[L, B, T, F]`` activations nor the scores of more than one layer ever exist.

Sets are boolean masks ``[..., L * F]`` over the model's neurons, id ``l * F + i``: a union over
chunks has no size bound below ``L * F``, and intersections and unions of masks are sums and
matrix products (:func:`jaccard_distances`), exact in float32 up to ``2**24`` neurons.

Steps 3-4: consensus ``s(x) = |N(x)|`` (smaller: the response's tokens agree on fewer neurons,
higher consensus), the bottom 20% of the pool by ``s`` is trained on, and each selected item's
teacher context is its ``K = 10`` nearest pool items in Jaccard distance
``J = 1 - |N_i & N_j| / |N_i | N_j|``.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from hindsight._validation import check_leading, check_rank, check_static_float, shape_of


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive int, got {value!r}")
    return value


def neuron_scores(activations: jax.Array, down_kernel: jax.Array,
                  unembed_rows: jax.Array) -> jax.Array:
    """``S_i = k_i * (w_out,i . e_y)`` (spec §8 eqs 2-3), float32.

    Args:
      activations: ``[..., F]`` one layer's MLP post-activations ``k``.
      down_kernel: ``[F, D]`` its down projection (row ``i``: neuron ``i``'s output weights).
      unembed_rows: ``[..., D]`` the unembedding row ``e_y`` of the token each position predicts.
    Returns:
      ``[..., F]`` float32 scores.
    """
    check_rank("down_kernel", down_kernel, rank=2)
    f, d = shape_of(down_kernel)
    if shape_of(activations)[-1:] != (f,) or shape_of(unembed_rows)[-1:] != (d,):
        raise ValueError(f"`activations` {shape_of(activations)} must end in F={f} and "
                         f"`unembed_rows` {shape_of(unembed_rows)} in D={d} (`down_kernel` is "
                         f"[F, D] = {(f, d)})")
    check_leading("unembed_rows", unembed_rows, shape_of(activations)[:-1], "activations[..., :-1]")
    direction = jnp.matmul(unembed_rows.astype(jnp.float32), down_kernel.astype(jnp.float32).T,
                           preferred_element_type=jnp.float32)
    return activations.astype(jnp.float32) * direction


def chunk_candidates(scores: jax.Array, mask: jax.Array, *, neurons_per_layer: int = 2000,
                     chunk_tokens: int = 16) -> jax.Array:
    """One layer's candidates per chunk of positions: the top ``neurons_per_layer``
    ``(position, neuron)`` pairs of each chunk, deduplicated per neuron by their max score.

    Args:
      scores: ``[B, T, F]`` one layer's scores (:func:`neuron_scores`).
      mask: ``[B, T]`` bool or 0/1, the response positions (others never count).
      neurons_per_layer: pairs kept per chunk (2000; all of them when the chunk has fewer).
      chunk_tokens: positions per chunk (the last chunk padded with masked positions).
    Returns:
      ``[B, C, F]`` float32, ``C = ceil(T / chunk_tokens)``: each neuron's best kept score in the
      chunk, ``-inf`` for a neuron with no kept pair (every neuron of a chunk with no response
      position).
    """
    check_rank("scores", scores, rank=3)
    check_rank("mask", mask, rank=2)
    check_leading("mask", mask, shape_of(scores)[:2], "scores[:, :, 0]")
    _positive_int("neurons_per_layer", neurons_per_layer)
    _positive_int("chunk_tokens", chunk_tokens)
    b, t, f = shape_of(scores)
    c = math.ceil(t / chunk_tokens)
    live = jnp.asarray(mask) > 0
    s = jnp.where(live[..., None], scores.astype(jnp.float32), -jnp.inf)
    s = jnp.pad(s, ((0, 0), (0, c * chunk_tokens - t), (0, 0)), constant_values=-jnp.inf)
    values, flat = jax.lax.top_k(s.reshape(b, c, chunk_tokens * f),
                                 min(neurons_per_layer, chunk_tokens * f))
    rows = jnp.arange(b)[:, None, None]
    chunks = jnp.arange(c)[None, :, None]
    # a -inf pair (masked) leaves its neuron at -inf: max with the initial value changes nothing
    return jnp.full((b, c, f), -jnp.inf, jnp.float32).at[rows, chunks, flat % f].max(values)


def init_top(batch: int, chunks: int, *, num_neurons: int = 5000) -> tuple[jax.Array, jax.Array]:
    """The empty running top-K of :func:`merge_top`: values ``[B, C, K]`` at ``-inf``, ids
    ``[B, C, K]`` int32 at -1."""
    _positive_int("num_neurons", num_neurons)
    shape = (batch, chunks, num_neurons)
    return jnp.full(shape, -jnp.inf, jnp.float32), jnp.full(shape, -1, jnp.int32)


def merge_top(values: jax.Array, ids: jax.Array, candidates: jax.Array,
              offset) -> tuple[jax.Array, jax.Array]:
    """The running top-K over layers: the ``K`` best of the kept ``(values, ids)`` and one
    layer's ``candidates`` (its neuron ``i`` has id ``offset + i``).

    Args:
      values, ids: ``[B, C, K]`` float32 / int32, the best so far (:func:`init_top`).
      candidates: ``[B, C, F]`` one layer's :func:`chunk_candidates`.
      offset: int or int32 scalar, ``layer * F``.
    Returns:
      ``(values, ids)`` ``[B, C, K]``, values descending; ids of ``-inf`` entries are meaningless
      (:func:`union_mask` drops them). Ids are unique per chunk: each layer's candidates are
      deduplicated and layers have disjoint ids.
    """
    if shape_of(values) != shape_of(ids) or shape_of(values)[:2] != shape_of(candidates)[:2]:
        raise ValueError(f"`values` {shape_of(values)}, `ids` {shape_of(ids)} and `candidates` "
                         f"{shape_of(candidates)} must share [B, C]")
    f = shape_of(candidates)[-1]
    new_ids = jnp.broadcast_to(jnp.asarray(offset, jnp.int32) + jnp.arange(f, dtype=jnp.int32),
                               shape_of(candidates))
    top, where = jax.lax.top_k(jnp.concatenate([values, candidates.astype(jnp.float32)], -1),
                               shape_of(values)[-1])
    return top, jnp.take_along_axis(jnp.concatenate([ids, new_ids], -1), where, -1)


def union_mask(values: jax.Array, ids: jax.Array, *, size: int) -> jax.Array:
    """``N(x)``: the union over chunks of the kept neurons, ``[B, size]`` bool.

    Args:
      values, ids: ``[B, C, K]`` the final running top-K (:func:`merge_top`); entries at
        ``-inf`` are not neurons.
      size: the number of neuron ids, ``L * F``.
    """
    _positive_int("size", size)
    check_rank("ids", ids, rank=3)
    b = shape_of(ids)[0]
    kept = jnp.where(jnp.isfinite(values), ids, size).reshape(b, -1)
    # index `size` collects the dropped entries in one spare column
    return jnp.zeros((b, size + 1), bool).at[jnp.arange(b)[:, None], kept].set(True)[:, :size]


def consensus(sets: jax.Array) -> jax.Array:
    """``s(x) = |N(x)|`` (eq 4) of sets ``[..., N]`` bool -> ``[...]`` int32."""
    return jnp.sum(jnp.asarray(sets) > 0, axis=-1, dtype=jnp.int32)


def jaccard_distances(sets_a: jax.Array, sets_b: jax.Array) -> jax.Array:
    """``J = 1 - |A & B| / |A | B|`` (eqs 5-6) between every pair of sets.

    Args:
      sets_a: ``[A, N]`` bool; sets_b: ``[P, N]`` bool.
    Returns:
      ``[A, P]`` float32; two empty sets are at distance 0 (identical).
    """
    check_rank("sets_a", sets_a, rank=2)
    check_rank("sets_b", sets_b, rank=2)
    if shape_of(sets_a)[1] != shape_of(sets_b)[1]:
        raise ValueError(f"`sets_a` {shape_of(sets_a)} and `sets_b` {shape_of(sets_b)} must be "
                         f"masks over the same N ids")
    a = (jnp.asarray(sets_a) > 0).astype(jnp.float32)
    b = (jnp.asarray(sets_b) > 0).astype(jnp.float32)
    inter = jnp.matmul(a, b.T, preferred_element_type=jnp.float32)  # 0/1 products: exact counts
    union = a.sum(-1)[:, None] + b.sum(-1)[None, :] - inter
    nonempty = union > 0
    return jnp.where(nonempty, 1.0 - inter / jnp.where(nonempty, union, 1.0), 0.0)


def bottom_fraction(values: jax.Array, *, fraction: float = 0.2) -> jax.Array:
    """The indices of the ``ceil(fraction * P)`` smallest of ``values [P]`` (step 3: the bottom
    20% of the pool by ``s(x)``), ascending by value, ties by index; int32."""
    check_rank("values", values, rank=1)
    fraction = check_static_float("fraction", fraction, low=0.0, high=1.0)
    p = shape_of(values)[0]
    if not fraction > 0 or not p:
        raise ValueError(f"`fraction` must be > 0 and `values` non-empty, got fraction={fraction} "
                         f"and {p} values")
    count = math.ceil(fraction * p)
    return jnp.argsort(jnp.asarray(values), stable=True)[:count].astype(jnp.int32)


def nearest(distances: jax.Array, *, k: int = 10, exclude: jax.Array | None = None) -> jax.Array:
    """The ``k`` nearest pool items of each query (step 4's ``C_K(x)``), ascending by distance,
    ties by index.

    Args:
      distances: ``[A, P]`` (:func:`jaccard_distances` of the queries against the pool).
      k: neighbours per query; capped at the ``P`` (``P - 1`` with ``exclude``) items there are.
      exclude: optional ``[A]`` int, the pool index of each query itself (never its own
        neighbour); -1 excludes nothing.
    Returns:
      ``[A, min(k, P or P - 1)]`` int32 pool indices.
    """
    check_rank("distances", distances, rank=2)
    _positive_int("k", k)
    a, p = shape_of(distances)
    d = jnp.asarray(distances, jnp.float32)
    if exclude is not None:
        check_leading("exclude", exclude, (a,), "distances[:, 0]")
        d = jnp.where(jnp.arange(p)[None, :] == jnp.asarray(exclude)[:, None], jnp.inf, d)
    k = min(k, p - (exclude is not None))
    if k < 1:
        raise ValueError(f"`distances` {(a, p)} leaves no neighbour to retrieve")
    return jnp.argsort(d, axis=-1, stable=True)[:, :k].astype(jnp.int32)
