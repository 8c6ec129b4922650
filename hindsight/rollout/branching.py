"""HDL tree bookkeeping on the host (spec §2 steps 2-5): branch points with their fallbacks, the
16-row layout, and flat or per-node advantages.

Layout of a group (``R = num_roots`` roots, ``K = num_points`` points, ``counts`` continuations per
point, best point first): for each root ``r`` in order, the root row, then ``counts[0]`` rows
branched at its best point, then ``counts[1]`` at the next, ... (``2 x (1 + 4 + 3) = 16`` by
default). A point that could not be found keeps its rows as fresh full rollouts from the prompt,
so the group size never changes.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from hindsight.methods.hdl import HDLConfig, min_gap, min_prefix
from hindsight.objectives import group_advantages
from hindsight.signals import select_branch_points

SOURCES = ("nms", "relaxed", "fresh")
# one compiled program per (width, gap) instead of ~30 eager ops per root (35 ms per call on CPU)
_select = jax.jit(select_branch_points, static_argnames=("num_points", "min_gap", "tail_guard"))


def branch_eligibility(tokens: np.ndarray, length: int, stop_tokens=(),
                       allowed: np.ndarray | None = None) -> np.ndarray:
    """``[T]`` bool: the positions of a root a branch point may take before the score rules:
    inside the response, not a stop token (resampling the token that ended the response is no
    branch: spec §2 step 2, "not EOS/pad"), and ``allowed`` (a task's or an episode's mask, e.g.
    never inside the final answer, only action tokens) where given."""
    width = tokens.shape[-1]
    out = (np.arange(width) < length) & ~np.isin(tokens, np.asarray(tuple(stop_tokens), np.int64))
    if allowed is not None:
        keep = np.zeros(width, bool)
        n = min(width, np.shape(allowed)[-1])
        keep[:n] = np.asarray(allowed, bool)[:n]
        out &= keep
    return out


def choose_branch_points(scores: np.ndarray, length: int, config: HDLConfig, *,
                         eligible: np.ndarray | None = None) -> tuple[np.ndarray, str]:
    """Branch points of one root, best first, with the spec's fallbacks.

    1. Greedy NMS over eligible positions (``h <= t <= length - 1 - tail_guard`` with
       ``h = max(1, ceil(min_prefix_fraction * length))``,
       :func:`hindsight.methods.hdl.min_prefix`, and ``eligible``) with
       ``d_min = max(16, floor(0.05 length))`` (:func:`hindsight.signals.select_branch_points`).
    2. If fewer than ``K`` survive: ``d_min = 1``.
    3. Points still missing are ``-1``: the caller replaces their continuations by fresh
       rollouts. The spec's "uniform random eligible positions" step sits between 2 and 3; with
       ``d_min = 1`` step 2 already returns every eligible position up to ``K``, so no eligible
       position is left for it to draw, and it is not a separate step here (an earlier version
       drew past the tail guard instead, which the spec's eligibility forbids).

    Args:
      scores: ``[T]`` HDL score ``|logp_hind - logp_orig|`` (0 past ``length``).
      length: response length (0 for an all-masked root).
      eligible: optional ``[T]`` bool (:func:`branch_eligibility`: no stop token, a task's or an
        episode's mask), the only positions a point may take besides the rules above.
    Returns:
      ``(points [K] int32, source)``; ``source`` in ``SOURCES`` names the last step used
      (``"fresh"``: no point at all).
    """
    k = config.num_points
    width = max(int(scores.shape[-1]), 1)
    mask = np.arange(width) < length
    allowed = np.arange(width) >= min_prefix(length, config)
    if eligible is not None:
        keep = np.zeros(width, bool)
        keep[:min(width, eligible.shape[-1])] = np.asarray(eligible, bool)[:width]
        allowed &= keep
    s = np.zeros(width, np.float32)
    s[: scores.shape[-1]] = np.where(mask[: scores.shape[-1]], scores, 0.0)
    s = np.where(np.isfinite(s), s, 0.0)  # a NaN score must not steer the argmax

    def nms(gap: int) -> np.ndarray:
        return np.asarray(_select(jnp.asarray(s[None]), jnp.asarray(mask[None]),
                                  num_points=k, min_gap=gap, tail_guard=config.tail_guard,
                                  eligible_mask=jnp.asarray(allowed[None])))[0]

    points, source = nms(min_gap(length, config)), "nms"
    if (points < 0).any():
        points, source = nms(1), "relaxed"
    if (points < 0).all():
        source = "fresh"
    return points.astype(np.int32), source


@dataclasses.dataclass(frozen=True)
class TreeLayout:
    """Where each of a tree's ``G`` rows comes from.

    Attributes:
      root: ``[G]`` the root index ``r`` a row belongs to.
      node: ``[G]`` branch node ``r * K + k`` of a continuation; -1 for roots and fresh rows.
      kind: ``[G]`` 0 root, 1 continuation, 2 fresh rollout.
      position: ``[G]`` branch position (0 for roots and fresh rows).
    """
    root: np.ndarray
    node: np.ndarray
    kind: np.ndarray
    position: np.ndarray

    ROOT, CONTINUATION, FRESH = 0, 1, 2


def tree_layout(points: np.ndarray, config: HDLConfig) -> TreeLayout:
    """Row layout for ``points [R, K]`` (best first, -1 = missing)."""
    root, node, kind, position = [], [], [], []
    for r, row in enumerate(points):
        root.append(r), node.append(-1), kind.append(TreeLayout.ROOT), position.append(0)
        for k, (p, c) in enumerate(zip(row, config.counts)):
            found = p >= 0
            root += [r] * c
            node += [r * config.num_points + k if found else -1] * c
            kind += [TreeLayout.CONTINUATION if found else TreeLayout.FRESH] * c
            position += [int(p) if found else 0] * c
    as_i = lambda a: np.asarray(a, np.int32)
    return TreeLayout(as_i(root), as_i(node), as_i(kind), as_i(position))


def tree_advantages(rewards: np.ndarray, layouts: list[TreeLayout], *, group_size: int,
                    baseline: str = "flat") -> np.ndarray:
    """Advantages of trees laid out contiguously (spec §2 step 5).

    ``"flat"``: GRPO over each tree's rows (unbiased std, eps 1e-6). ``"node"``: a continuation
    under node ``(r, b)`` gets ``R - mean(R over root r and its continuations at b)``; roots and
    fresh rows keep the flat value.

    Args:
      rewards: ``[P * G]`` float; layouts: P layouts. Returns: ``[P * G]`` float32.
    """
    flat = np.asarray(group_advantages(jnp.asarray(rewards, jnp.float32), group_size))
    if baseline == "flat":
        return flat
    out = flat.copy()
    for g, lay in enumerate(layouts):
        base = g * group_size
        for n in np.unique(lay.node[lay.node >= 0]):
            rows = np.nonzero(lay.node == n)[0]
            root = np.nonzero((lay.root == lay.root[rows[0]]) & (lay.kind == TreeLayout.ROOT))[0]
            members = base + np.concatenate([root, rows])
            out[base + rows] = rewards[base + rows] - np.mean(rewards[members])
    return out.astype(np.float32)
