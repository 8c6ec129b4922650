"""Two processes on localhost (``jax.distributed`` + gloo) agree with the single-process step."""
import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

import hindsight.train as ht
from tests.train.helpers import (build_model, flat, make_batch, max_rel_err, rows_for, sgd_step,
                                 subprocess_env)
from tests.train.run_distributed import DATA, RECORDS, TABLE_SEED

TIMEOUT_S = 420


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_single_process(tmp_path):
    env, port = subprocess_env(4), _free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "tests.train.run_distributed", str(p),
                               str(port), str(tmp_path)], env=env, cwd=env["PYTHONPATH"].split(":")[0],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for p in range(2)]
    reports, _ = _finish(procs)
    assert reports[0]["loss"] == reports[1]["loss"]

    # The same step in this (single-device) process, on the whole global batch.
    mesh = ht.make_mesh(ht.MeshConfig(data=1))
    state, step = sgd_step(build_model(0), mesh)
    table = make_batch(len(RECORDS), seed=TABLE_SEED)
    batch = rows_for(next(ht.make_data_iterator(DATA, RECORDS)), table)
    grads, metrics = step.grads(state, batch)
    state, _ = step(state, batch)

    z = np.load(tmp_path / "distributed.npz")
    group = lambda name: {k.split(":", 1)[1]: z[k] for k in z.files if k.startswith(name + ":")}
    np.testing.assert_allclose(float(z["loss"]), float(metrics["loss"]), rtol=1e-5)
    assert max_rel_err(group("grads"), flat(grads)) < 1e-5
    assert max_rel_err(group("params"), flat(state.params)) < 1e-5


LOOP_METHODS = ("grpo", "hdl", "craft")


def _restore_here(path):
    """A checkpoint item written by any number of processes, restored whole onto this process's
    device (its own metadata gives the tree, shapes and dtypes)."""
    import orbax.checkpoint as ocp
    checkpointer = ocp.StandardCheckpointer()
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                          checkpointer.metadata(str(path)).item_metadata)
    return checkpointer.restore(str(path), target)


def _start(pid: int, processes: int, port: int, out_dir, *args: str, devices: int = 1):
    env = subprocess_env(devices)
    return subprocess.Popen([sys.executable, "-m", "tests.train.run_loop_distributed", str(pid),
                             str(processes), str(port), str(out_dir), *(args or LOOP_METHODS)],
                            env=env, cwd=env["PYTHONPATH"].split(":")[0],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(procs) -> tuple[list[dict], list[str]]:
    try:
        outs = [p.communicate(timeout=TIMEOUT_S) for p in procs]
    finally:
        for p in procs:  # never leave a process waiting on a dead peer
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-4000:]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs], [e for _, e in outs]


@pytest.mark.slow
def test_loop_on_two_processes_equals_one(tmp_path):
    """``loop.run`` of GRPO, HDL and CRAFT (tiny configs, 3 steps) on 2 processes (two CPU devices
    each, ``jax.distributed``: a data-parallel mesh of 4 for the update, each process sampling
    with its own copy of the params tensor-parallel over its 2 devices) against one process on one
    device: each process samples its own half of every step's prompts, and
    together they sample what one process samples (the same prompts and tokens, row for row),
    each generating its half of the tokens, and train to the same parameters (float32 tolerance);
    the held-out evaluation, split between them, gives the single-process figure."""
    port = _free_port()
    pair = [_start(p, 2, port, tmp_path, devices=2) for p in range(2)]
    (two, errs) = _finish(pair)
    (one,), _ = _finish([_start(0, 1, 0, tmp_path)])
    assert "[hindsight p1/2] step 3/3" in errs[1]   # the other process reports its progress
    for method in LOOP_METHODS:
        ref = np.load(tmp_path / "1" / f"{method}-p0.npz")
        parts = [np.load(tmp_path / "2" / f"{method}-p{p}.npz") for p in range(2)]
        half = ref["targets"].shape[1] // 2
        for p, part in enumerate(parts):   # process p sampled rows [p * half, (p + 1) * half)
            rows = slice(p * half, (p + 1) * half)
            np.testing.assert_array_equal(part["targets"], ref["targets"][:, rows], err_msg=method)
            np.testing.assert_array_equal(part["mask"], ref["mask"][:, rows], err_msg=method)
            ref_prompts = [s[rows] for s in json.loads(str(ref["prompts"]))]
            assert json.loads(str(part["prompts"])) == ref_prompts, method
            groups = ref["group_tokens"].shape[1] // 2
            np.testing.assert_array_equal(part["group_tokens"],
                                          ref["group_tokens"][:, p * groups:(p + 1) * groups])
            assert two[p][method]["tokens"] == int(part["group_tokens"].sum()) > 0
        assert two[0][method]["tokens"] + two[1][method]["tokens"] == one[method]["tokens"]
        assert two[0][method]["final_step"] == two[1][method]["final_step"] == 3
        np.testing.assert_allclose(two[0][method]["eval"], one[method]["eval"], rtol=0,
                                   atol=1e-6)
        path = lambda n: tmp_path / n / method / "checkpoints" / "3" / "state"
        pair_params, single = (_restore_here(path(n))["params"] for n in ("2", "1"))
        assert max_rel_err(flat(pair_params), flat(single)) < 1e-5, method


@pytest.mark.slow
def test_sigterm_to_one_process_stops_every_process_at_the_same_step(tmp_path):
    """SIGTERM reaches process 1 only (a preempted host): both processes stop at the same step
    boundary (they agree at every boundary, so neither waits in a collective for a peer that
    left), exit cleanly with the signal named, and the checkpoint of that step is whole: it
    restores onto one device."""
    import signal
    import threading

    port = _free_port()
    pair = [_start(p, 2, port, tmp_path, "--steps=40", "grpo") for p in range(2)]
    lines, seen = [], threading.Event()

    def watch():   # process 1's stderr, line by line, until its first step is done
        for line in pair[1].stderr:
            lines.append(line)
            if "step 1/40" in line:
                seen.set()
    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    try:
        assert seen.wait(TIMEOUT_S), "".join(lines)[-3000:]
        pair[1].send_signal(signal.SIGTERM)
        outs = [p.communicate(timeout=TIMEOUT_S)[0] for p in pair]
    finally:
        for p in pair:
            if p.poll() is None:
                p.kill()
                p.communicate()
    reader.join(timeout=10)
    assert [p.returncode for p in pair] == [0, 0], "".join(lines)[-3000:]
    reports = [json.loads(out.strip().splitlines()[-1])["grpo"] for out in outs]
    assert reports[0]["final_step"] == reports[1]["final_step"] < 40
    assert reports[0]["stop_signal"] == reports[1]["stop_signal"] == "SIGTERM"
    step = reports[0]["final_step"]
    path = tmp_path / "2" / "grpo" / "checkpoints"
    assert sorted(int(d) for d in os.listdir(path) if d.isdigit()) == [step]
    restored = _restore_here(path / str(step) / "state")
    assert int(restored["step"]) == step
