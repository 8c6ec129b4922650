"""HDL host-side bookkeeping: branch points with fallbacks (spec §2 steps 2-3, toy test), the
16-row layout and flat / per-node advantages (spec §2 test 3)."""
import numpy as np
import pytest

from hindsight.methods.hdl import HDLConfig, min_prefix
from hindsight.rollout import TreeLayout, choose_branch_points, tree_advantages, tree_layout
from hindsight.rollout.branching import branch_eligibility

LOGP_ORIG = np.array([-0.1, -0.5, -2.0, -0.2, -0.3, -1.5, -0.1, -0.05, -0.4, -0.2])
LOGP_HIND = np.array([-0.1, -0.6, -0.2, -0.3, -1.9, -3.5, -2.2, -0.05, -0.3, -0.2])


def test_spec_toy_points():
    s = np.abs(LOGP_HIND - LOGP_ORIG) * (np.arange(10) < 9)
    spec = dict(tail_guard=2)  # the spec's eligibility (the default): t >= 1
    pts, src = choose_branch_points(s, 9, HDLConfig(min_gap_floor=1, **spec))
    assert pts.tolist() == [6, 5] and src == "nms"
    pts, src = choose_branch_points(s, 9, HDLConfig(min_gap_floor=3, **spec))
    assert pts.tolist() == [6, 2] and src == "nms"
    # the default head guard (first quarter: t < ceil(9 / 4) = 3) drops 2; 3 is the next one
    # at least 3 from 6
    pts, src = choose_branch_points(s, 9, HDLConfig(tail_guard=2, min_gap_floor=3,
                                                    min_prefix_fraction=0.25))
    assert pts.tolist() == [6, 3] and src == "nms"


def test_head_guard_skips_the_opening():
    """With the head guard (min_prefix_fraction > 0, OUR CHOICE) an early peak (the opening,
    where h's wording shows) loses to a lower peak past the first quarter; the spec's rule (the
    default) keeps it."""
    s = np.zeros(64)
    s[[1, 10, 30, 50]] = [9.0, 8.0, 2.0, 1.0]
    guard = HDLConfig(min_prefix_fraction=0.25)
    assert min_prefix(60, guard) == 15 and min_prefix(3, guard) == 1
    assert min_prefix(60, HDLConfig()) == 1
    assert choose_branch_points(s, 60, guard)[0].tolist() == [30, 50]
    assert choose_branch_points(s, 60, HDLConfig())[0].tolist() == [1, 30]
    # a 12-token root has one eligible position under the guard (t >= 3, tail guard t <= 3): the
    # second point's continuations become fresh rollouts (the tail guard is never relaxed)
    pts, src = choose_branch_points(np.zeros(12), 12, guard)
    assert src == "relaxed" and pts.tolist() == [3, -1]
    for bad in (1.0, -0.1, True):
        with pytest.raises(ValueError, match="min_prefix_fraction"):
            HDLConfig(min_prefix_fraction=bad)


def test_relaxed_then_fresh_and_eligibility():
    cfg = HDLConfig()  # tail_guard 8, d_min = max(16, 5% len)
    s = np.zeros(40)
    s[[10, 14]] = [2.0, 1.0]
    assert choose_branch_points(s, 30, cfg)[0].tolist() == [10, 14]  # gap 4 < 16: relaxed
    assert choose_branch_points(s, 30, cfg)[1] == "relaxed"
    for length in (0, 1, 2, 6, 9):  # nothing survives the tail guard (t <= len - 9)
        pts, src = choose_branch_points(s, length, cfg)
        assert pts.tolist() == [-1, -1] and src == "fresh"
    pts, src = choose_branch_points(s, 10, cfg)  # t = 1 only
    assert pts.tolist() == [1, -1] and src == "relaxed"
    nan = np.full(40, np.nan)
    pts, _ = choose_branch_points(nan, 40, cfg)
    assert all(1 <= p <= 31 for p in pts)
    # the stop token and a task's mask are never branched at
    tokens = np.array([5, 6, 2, 7, 8, 9, 2, 0])
    np.testing.assert_array_equal(branch_eligibility(tokens, 7, (2,)),
                                  [1, 1, 0, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(
        branch_eligibility(tokens, 7, (2,), allowed=np.array([1, 1, 1, 1, 0, 0])),
        [1, 1, 0, 1, 0, 0, 0, 0])
    s = np.arange(40, dtype=np.float32)[::-1].copy()  # the best scores first
    eligible = np.ones(40, bool)
    eligible[[1, 2]] = False
    pts, _ = choose_branch_points(s, 40, HDLConfig(tail_guard=0, min_gap_floor=1,
                                                   min_gap_fraction=0.0),
                                  eligible=eligible)
    assert pts.tolist() == [3, 4]


def test_layout_is_2_x_root_4_3_and_keeps_16_rows():
    cfg = HDLConfig()
    lay = tree_layout(np.array([[6, 2], [9, -1]]), cfg)
    assert lay.kind.tolist() == [0] + [1] * 7 + [0] + [1] * 4 + [2] * 3
    assert lay.position.tolist() == [0, 6, 6, 6, 6, 2, 2, 2, 0, 9, 9, 9, 9, 0, 0, 0]
    assert lay.root.tolist() == [0] * 8 + [1] * 8
    assert lay.node.tolist() == [-1, 0, 0, 0, 0, 1, 1, 1, -1, 2, 2, 2, 2, -1, -1, -1]
    fresh = tree_layout(np.full((2, 2), -1), cfg)
    assert fresh.kind.tolist() == ([0] + [2] * 7) * 2 and len(fresh.kind) == cfg.group_size


def test_flat_and_node_advantages():
    r = np.array([0, 1, 0, 0, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0, 1], np.float32)
    lay = tree_layout(np.array([[6, 2], [9, 4]]), HDLConfig())
    flat = tree_advantages(r, [lay], group_size=16)
    np.testing.assert_allclose(flat[r == 1], 0.8539, atol=1e-4)
    np.testing.assert_allclose(flat[r == 0], -1.0979, atol=1e-4)
    node = tree_advantages(r, [lay], group_size=16, baseline="node")
    np.testing.assert_allclose(node[[0, 8]], flat[[0, 8]])  # roots keep the flat value
    # node (root 0, b=6): rows 1-4 with root row 0 -> mean(0,1,0,0,0) = 0.2
    np.testing.assert_allclose(node[1:5], r[1:5] - 0.2, atol=1e-6)
    np.testing.assert_allclose(node[5:8], r[5:8] - np.mean(r[[0, 5, 6, 7]]), atol=1e-6)
    np.testing.assert_allclose(node[13:16], r[13:16] - np.mean(r[[8, 13, 14, 15]]), atol=1e-6)
    two = tree_advantages(np.concatenate([r, 1 - r]), [lay, lay], group_size=16, baseline="node")
    np.testing.assert_allclose(two[16 + 1:16 + 5], (1 - r)[1:5] - 0.8, atol=1e-6)
    assert TreeLayout.FRESH == 2
    with pytest.raises(ValueError):
        tree_advantages(r[:15], [lay], group_size=16)
