"""Child process ``PROCESS_ID PORT OUT_DIR`` of a two-process ``jax.distributed`` run (gloo, 4 CPU
devices each): both processes load their own half of each batch from the grain iterator, run one
GRPO step on a global (data=2, fsdp=2, tensor=2) mesh, and process 0 writes loss, gradients and
updated params to ``OUT_DIR/distributed.npz``.
"""
import json
import sys

import jax
import numpy as np
from jax.experimental import multihost_utils

import hindsight.train as ht
from tests.train.helpers import build_model, flat, make_batch, rows_for, sgd_step

RECORDS = [{"id": i} for i in range(32)]
TABLE_SEED = 5  # the rows, built after start-up: make_batch computes with JAX
DATA = ht.DataConfig(batch_size=16, seed=1)


def main():
    pid, port, out_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    ht.initialize_distributed(ht.DistributedConfig(
        coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid,
        initialization_timeout=60))
    assert jax.process_count() == 2 and jax.device_count() == 8 and jax.local_device_count() == 4
    mesh = ht.make_mesh(ht.MeshConfig(data=2, fsdp=2, tensor=2))
    state, step = sgd_step(build_model(0), mesh)
    table = make_batch(len(RECORDS), seed=TABLE_SEED)
    local = rows_for(next(ht.make_data_iterator(DATA, RECORDS)), table)  # this process's 8 rows
    assert local["tokens"].shape[0] == 8
    grads, metrics = step.grads(state, local)
    state, _ = step(state, local)
    # Parameters span both processes' devices: gather them to host on every process.
    grads, params = multihost_utils.process_allgather((grads, state.params), tiled=True)
    if pid == 0:
        np.savez(f"{out_dir}/distributed.npz", loss=np.float64(metrics["loss"]),
                 **{f"grads:{k}": v for k, v in flat(grads).items()},
                 **{f"params:{k}": v for k, v in flat(params).items()})
    multihost_utils.sync_global_devices("written")
    print(json.dumps({"process": pid, "loss": float(metrics["loss"])}))


if __name__ == "__main__":
    main()
