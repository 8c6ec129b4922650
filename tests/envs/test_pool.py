"""The environment pool: requests answered out of order across workers, leases, and every way an
environment can fail (raise, hang, crash, killed from outside) ending only its own episode."""
import os
import signal
import time

import pytest

from hindsight.envs import EnvPool, EnvSpec

FAULTY = EnvSpec.of("faulty", module="tests.envs.faulty")


def _drain(pool, n, limit=60.0):
    out, deadline = [], time.monotonic() + limit
    while len(out) < n:
        assert time.monotonic() < deadline, f"only {len(out)} of {n} replies"
        out += pool.poll(1.0)
    return {r.episode: r for r in out}


def test_steps_and_failures_end_only_their_episode():
    with EnvPool(FAULTY, workers=5, step_timeout=2.0, reset_timeout=60.0) as pool:
        for e in "abcde":
            pool.reset(e, {})
        first = _drain(pool, 5)
        assert all(r.ok and r.op == "reset" for r in first.values())
        pids = {e: int(r.step.observation.split("pid=")[1]) for e, r in first.items()}
        assert len(set(pids.values())) == 5 and os.getpid() not in pids.values()
        pool.step("a", "hello")
        pool.step("b", "raise")
        pool.step("c", "hang")
        pool.step("d", "crash")
        pool.step("e", "slowly")
        os.kill(pids["e"], signal.SIGKILL)  # killed from outside while stepping
        got = _drain(pool, 5)
        assert got["a"].ok and got["a"].step.observation == "echo hello 1" and got["a"].step.reward == 0.25
        assert got["b"].status == "error" and "the environment broke" in got["b"].message
        assert got["c"].status == "timeout" and "timeout" in got["c"].message
        assert got["c"].seconds >= 2.0
        assert got["d"].status == "crashed" and got["e"].status in ("crashed", "ok")
        # the failed episodes hold no environment; the healthy one goes on, and new episodes
        # get fresh workers in place of the dead ones
        for e in "bcd":
            with pytest.raises(KeyError, match="holds no environment"):
                pool.step(e, "x")
        pool.step("a", "again")
        for e in "xyz":
            pool.reset(e, {})
        got = _drain(pool, 4)
        assert got["a"].step.observation == "echo hello 2" or got["a"].step.observation == "echo again 2"
        assert all(got[e].ok for e in "xyz")
        assert pool.stats["timeouts"] == 1 and pool.stats["errors"] >= 1
        assert pool.stats["crashes"] >= 1


def test_leases_queue_beyond_the_workers_and_replay():
    with EnvPool(EnvSpec.of("textgame", max_steps=5), workers=1, step_timeout=5.0,
                 reset_timeout=60.0) as pool:
        setup = {"rooms": ["hall", "kitchen", "garden"], "key": 1, "chest": 2}
        pool.reset("a", setup)
        pool.reset("b", setup)  # waits for a's worker
        assert list(_drain(pool, 1)) == ["a"]
        assert pool.poll(0.2) == []
        pool.release("a")
        assert list(_drain(pool, 1)) == ["b"]
        pool.release("b")
        pool.replay("c", setup, ["go kitchen", "take key", "go garden"])
        r = _drain(pool, 1)["c"]
        assert r.ok and "chest" in r.step.observation and pool.stats["workers"] == 1
        pool.step("c", "open chest")
        r = _drain(pool, 1)["c"]
        assert r.step.done and r.step.reward == 0.5 and r.step.info["feedback"] == "opened the chest"
        with pytest.raises(KeyError, match="already running"):
            pool.reset("c", setup)


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="`workers`"):
        EnvPool(FAULTY, workers=0, step_timeout=1.0, reset_timeout=1.0)
    with pytest.raises(ValueError, match="`step_timeout`"):
        EnvPool(FAULTY, workers=1, step_timeout=0, reset_timeout=1.0)
    with pytest.raises(TypeError, match="EnvSpec"):
        EnvPool("faulty", workers=1, step_timeout=1.0, reset_timeout=1.0)
