"""Two processes on localhost (``jax.distributed`` + gloo) agree with the single-process step."""
import json
import socket
import subprocess
import sys

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
    try:
        outs = [p.communicate(timeout=TIMEOUT_S) for p in procs]
    finally:
        for p in procs:  # never leave a process waiting on a dead peer
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-4000:]
    losses = [json.loads(out.strip().splitlines()[-1])["loss"] for out, _ in outs]
    assert losses[0] == losses[1]

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
