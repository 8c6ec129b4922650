"""Decoding with sharded params (8 virtual CPU devices) samples what unsharded decoding samples."""
import json
import os
import subprocess
import sys

import pytest

from tests.models.helpers import make_hf_model

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_sharded_decode_equals_unsharded(tmp_path):
    """Qwen3 layout (QK-norm, 2 KV heads of 4): a tensor-parallel mesh, a (data 2, fsdp 2,
    tensor 2) one and tensor over more devices (8) than KV heads give the same sampled tokens (a prefill fanned out
    to 3 rows, then branches from the cache) and the same log-probs and teacher-forced scores to
    1e-5; with a tensor axis the KV cache is split over its KV heads."""
    make_hf_model("qwen3").save_pretrained(tmp_path, safe_serialization=True)
    env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "tests.sampling.sharded_decode", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["devices"] == 8
    for name, r in result["meshes"].items():
        assert r["tokens_equal"], name
        assert r["max_logprob_diff"] < 1e-5, (name, r["max_logprob_diff"])
    # [L, B, M, KV, hd]: the KV heads follow the attention heads onto the tensor axis
    assert result["meshes"]["tensor2"]["cache_spec"][3] == "tensor"
    assert result["meshes"]["data2_fsdp2_tensor2"]["cache_spec"][3] == "tensor"
