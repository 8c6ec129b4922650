"""Shared test fixtures: float64 NumPy references live in each test file, not here."""
import gc
import os
import shutil
import sys

# Most tests compile many small programs (tiny models) and run them once: with LLVM's backend
# optimisations off, XLA compiles them about 40% faster (tests/methods/test_losses.py: 76 s
# instead of 125 s), while the matmul-bound SmolLM2 tests run as fast (their kernels are library
# calls). XLA reads the flag when the backend starts, i.e. after this; child processes inherit it.
# Set the flag yourself (any value) to test the optimised code generation.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_backend_optimization_level=0").strip()

# XLA's persistent compilation cache, shared by the xdist workers and the child processes the
# tests start (they inherit the environment): many tests compile the same program again (a resumed
# run rebuilds its step, a child process builds the model its parent built, two methods share a
# loss path). On a fresh clone it saves a quarter of tests/train/test_loop.py (204 -> 152 s on
# the AMD machine); a second run on the same checkout takes 92 s. Entries are keyed by the
# program, the compile options, XLA_FLAGS and the jax/jaxlib version, so a stale hit is not
# possible. No size cap: with one, JAX lists and reads every entry's timestamp on each write
# (0.5 s per write at 4,000 entries, minutes over a run); pytest_configure below empties the
# directory past CACHE_LIMIT instead. Without the cap there is no file lock: a worker that reads
# an entry the other is still writing warns and compiles (the entry is whole once written).
# `pytest --cache-clear` removes it with the rest of .pytest_cache; set JAX_COMPILATION_CACHE_DIR
# yourself to move it.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE_LIMIT = 2 << 30
for _key, _value in (
        ("JAX_COMPILATION_CACHE_DIR", os.path.join(_ROOT, ".pytest_cache", "xla")),
        ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0"),   # tiny programs repeat most
        ("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")):
    os.environ.setdefault(_key, _value)

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def pytest_configure(config):
    """The controller (not an xdist worker) empties the compilation cache past CACHE_LIMIT."""
    cache = os.environ["JAX_COMPILATION_CACHE_DIR"]
    if hasattr(config, "workerinput") or not os.path.isdir(cache):
        return
    with os.scandir(cache) as entries:
        size = sum(e.stat().st_size for e in entries if e.is_file())
    if size > CACHE_LIMIT:
        shutil.rmtree(cache, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """Modules with a slow test run first (each module kept whole, so its module-scoped fixtures
    are built once), so that under ``pytest -n 2 --dist worksteal`` (``make test``) the workers
    start on the minute-long tests and end on short ones, and neither sits idle at the end while
    the other finishes a long test."""
    has_slow = {item.module for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.module not in has_slow)


def pytest_runtest_teardown(item, nextitem):
    """Between test modules, drop JAX's compiled programs. Why: each live XLA:CPU executable holds
    memory maps of its own (23 for a small program, ~220 for a train step's), and a worker that
    keeps every program of its modules alive reaches the kernel's ``vm.max_map_count`` (65,530)
    part-way through the suite: LLVM then fails to map the next program ("Cannot allocate memory")
    and the worker dies in a segfault (seen at 45,000 maps after tests/train/test_loop.py on one
    worker; with this, at most 11,315 in any worker over the whole suite). A program a later module needs again comes back from the persistent
    cache above."""
    if nextitem is not None and nextitem.module is item.module:
        return
    jax = sys.modules.get("jax")
    if jax is not None:
        jax.clear_caches()
        gc.collect()
