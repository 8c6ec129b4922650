"""Shared test fixtures: float64 NumPy references live in each test file, not here."""
import os

# Most tests compile many small programs (tiny models) and run them once: with LLVM's backend
# optimisations off, XLA compiles them about 40% faster (tests/methods/test_losses.py: 76 s
# instead of 125 s), while the matmul-bound SmolLM2 tests run as fast (their kernels are library
# calls). XLA reads the flag when the backend starts, i.e. after this; child processes inherit it.
# Set the flag yourself (any value) to test the optimised code generation.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_backend_optimization_level=0").strip()

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def rng():
    return np.random.default_rng(0)
