"""Subprocess body of test_sharded: 8 fake CPU devices (XLA_FLAGS set before jax loads).

Usage: python -m tests.sampling.sharded_decode FOLDER; prints one JSON object: per mesh, whether
sampled tokens equal the unsharded ones, the largest log-prob difference, and the KV cache's
PartitionSpec.
"""
import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import json  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from hindsight.models import load_hf_folder  # noqa: E402
from hindsight.sampling import SamplingParams, branch, generate  # noqa: E402
from hindsight.sampling.score import score_logprobs  # noqa: E402

MESHES = {"tensor2": (1, 1, 2), "data2_fsdp2_tensor2": (2, 2, 2), "tensor8": (1, 1, 8)}
PROMPTS = [[1, 5, 7, 9], [3, 4], [8, 8, 8, 2, 2]]
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=12)


def run(model) -> dict:
    """Samples (3 per prompt: a prefill fanned out), a branch of them, and a teacher-forced score."""
    out = generate(model, PROMPTS, PARAMS, key=jax.random.key(3), num_samples=3)
    more = branch(model, out, rows=np.array([0, 4]), positions=np.array([3, 5]), counts=2,
                  key=jax.random.key(4))
    scores = score_logprobs(model, [[2, 3, 4]] * 2, [[5, 6, 7, 8], [9, 10]])
    return dict(tokens=np.asarray(out.tokens), logprobs=np.asarray(out.logprobs),
                branch_tokens=np.asarray(more.tokens), branch_logprobs=np.asarray(more.logprobs),
                scores=np.asarray(scores), cache=out.state.cache)


def main():
    folder = sys.argv[1]
    ref = run(load_hf_folder(folder))
    result = {"devices": jax.device_count(), "meshes": {}}
    for name, shape in MESHES.items():
        devices = np.asarray(jax.devices()[:int(np.prod(shape))]).reshape(shape)
        got = run(load_hf_folder(folder, mesh=Mesh(devices, ("data", "fsdp", "tensor"))))
        result["meshes"][name] = {
            "tokens_equal": bool(np.array_equal(got["tokens"], ref["tokens"])
                                 and np.array_equal(got["branch_tokens"], ref["branch_tokens"])),
            "max_logprob_diff": float(max(np.abs(got[k] - ref[k]).max()
                                          for k in ("logprobs", "branch_logprobs", "scores"))),
            "cache_spec": [a if a is None else str(a) for a in got["cache"].k.sharding.spec]}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
