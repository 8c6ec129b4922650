"""HDL host-side bookkeeping: branch points with fallbacks (spec §2 steps 2-3, toy test), the
16-row layout and flat / per-node advantages (spec §2 test 3)."""
import numpy as np
import pytest

from hindsight.methods.hdl import HDLConfig, min_prefix
from hindsight.rollout import TreeLayout, choose_branch_points, tree_advantages, tree_layout

LOGP_ORIG = np.array([-0.1, -0.5, -2.0, -0.2, -0.3, -1.5, -0.1, -0.05, -0.4, -0.2])
LOGP_HIND = np.array([-0.1, -0.6, -0.2, -0.3, -1.9, -3.5, -2.2, -0.05, -0.3, -0.2])
RNG = lambda: np.random.default_rng(0)


def test_spec_toy_points():
    s = np.abs(LOGP_HIND - LOGP_ORIG) * (np.arange(10) < 9)
    spec = dict(tail_guard=2, min_prefix_fraction=0.0)  # the spec's eligibility: t >= 1
    pts, src = choose_branch_points(s, 9, HDLConfig(min_gap_floor=1, **spec), RNG())
    assert pts.tolist() == [6, 5] and src == "nms"
    pts, src = choose_branch_points(s, 9, HDLConfig(min_gap_floor=3, **spec), RNG())
    assert pts.tolist() == [6, 2] and src == "nms"
    # the default head guard (first quarter: t < ceil(9 / 4) = 3) drops 2; 3 is the next one
    # at least 3 from 6
    pts, src = choose_branch_points(s, 9, HDLConfig(tail_guard=2, min_gap_floor=3), RNG())
    assert pts.tolist() == [6, 3] and src == "nms"


def test_head_guard_skips_the_opening():
    """An early peak (the opening, where h's wording shows) loses to a lower peak past the first
    quarter; with the fraction at 0 it wins again."""
    s = np.zeros(64)
    s[[1, 10, 30, 50]] = [9.0, 8.0, 2.0, 1.0]
    assert min_prefix(60, HDLConfig()) == 15 and min_prefix(3, HDLConfig()) == 1
    assert choose_branch_points(s, 60, HDLConfig(), RNG())[0].tolist() == [30, 50]
    spec = HDLConfig(min_prefix_fraction=0.0)
    assert choose_branch_points(s, 60, spec, RNG())[0].tolist() == [1, 30]
    # a 12-token root has one eligible position (head guard t >= 3, tail guard t <= 3); the
    # second point is drawn at random past the head guard (tail guard relaxed)
    pts, src = choose_branch_points(np.zeros(12), 12, HDLConfig(), RNG())
    assert src == "random" and pts[0] == 3 and 3 <= pts[1] <= 11
    for bad in (1.0, -0.1, True):
        with pytest.raises(ValueError, match="min_prefix_fraction"):
            HDLConfig(min_prefix_fraction=bad)


def test_relaxed_then_random_then_fresh():
    cfg = HDLConfig()  # tail_guard 8, d_min = max(16, 5% len)
    s = np.zeros(40)
    s[[10, 14]] = [2.0, 1.0]
    assert choose_branch_points(s, 30, cfg, RNG())[0].tolist() == [10, 14]  # gap 4 < 16: relaxed
    assert choose_branch_points(s, 30, cfg, RNG())[1] == "relaxed"
    pts, src = choose_branch_points(s, 6, cfg, RNG())  # no position survives the tail guard
    assert src == "random" and len(set(pts.tolist())) == 2 and all(1 <= p <= 5 for p in pts)
    pts, src = choose_branch_points(s, 2, cfg, RNG())
    assert pts.tolist() == [1, -1] and src == "random"
    for length in (0, 1):  # all-masked root, one-token root
        pts, src = choose_branch_points(s, length, cfg, RNG())
        assert pts.tolist() == [-1, -1] and src == "fresh"
    nan = np.full(40, np.nan)
    pts, _ = choose_branch_points(nan, 40, cfg, RNG())
    assert all(1 <= p <= 31 for p in pts)


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
