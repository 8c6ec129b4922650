"""Kill-and-resume: a run resumed from its mid-point checkpoint in a new process equals the
uninterrupted run bitwise (same mesh), and restores exactly onto a different mesh shape."""
import numpy as np
import pytest

from tests.train.helpers import run_script

N = 4


def _load(path):
    z = np.load(path)
    groups = {}
    for k in z.files:
        head, _, tail = k.partition(":")
        groups.setdefault(head, {})[tail] = z[k]
    groups["losses"] = z["losses"]
    return groups


@pytest.mark.slow
def test_kill_and_resume(tmp_path):
    run_script("tests.train.run_resume", "full", str(tmp_path), str(N), num_devices=8, timeout=600)
    run_script("tests.train.run_resume", "resume", str(tmp_path), str(N), "d8", "d2f2t2",
               num_devices=8, timeout=600)
    full = _load(tmp_path / "full.npz")
    same = _load(tmp_path / "resume_d8.npz")
    other = _load(tmp_path / "resume_d2f2t2.npz")
    assert len(full["losses"]) == N and len(same["losses"]) == N // 2
    # Same mesh: bitwise (CPU XLA is deterministic for a fixed program and device layout).
    np.testing.assert_array_equal(same["losses"], full["losses"][N // 2:])
    for name in ("restored", "final"):
        ref = full["mid" if name == "restored" else "final"]
        assert same[name].keys() == ref.keys()
        for k in ref:
            np.testing.assert_array_equal(same[name][k], ref[k], err_msg=f"{name} {k}")
    assert any(k.startswith("method_state") for k in full["final"])
    assert any(k.startswith("reference") for k in full["final"])
    # Another mesh shape: the restored state is exact, the continuation equal up to
    # float reassociation of the differently partitioned reductions.
    for k, v in full["mid"].items():
        np.testing.assert_array_equal(other["restored"][k], v, err_msg=k)
    np.testing.assert_allclose(other["losses"], full["losses"][N // 2:], rtol=1e-5)
