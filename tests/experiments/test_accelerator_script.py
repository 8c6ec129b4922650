"""``experiments/bench/accelerator.sh`` refuses a CPU-only JAX (it exists for a GPU machine) and
writes nothing there."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_refuses_without_an_accelerator(tmp_path):
    out = subprocess.run(["bash", os.path.join(ROOT, "experiments/bench/accelerator.sh"),
                          str(tmp_path / "out")], capture_output=True, text=True,
                         env={**os.environ, "PYTHON": sys.executable, "JAX_PLATFORMS": "cpu"},
                         timeout=120)
    assert out.returncode == 2, out.stderr
    assert "no accelerator" in out.stderr
    assert not list((tmp_path / "out").glob("*.json"))
