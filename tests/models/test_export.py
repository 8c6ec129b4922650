"""The HF export mapping (`hindsight.models.loading.export`) inverts the HF loader: every family's
tiny random checkpoint, loaded and exported again, gives back its own tensors and config; the
shard plan and the refusals."""
import dataclasses
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from hindsight.models import Llama3RopeScaling, ModelConfig, UnsupportedModelError, load_hf_folder
from hindsight.models.loading.export import (INDEX_FILE, decoder_params, hf_config, hf_tensors,
                                             shard_groups, write_safetensors)
from .helpers import CASES


@pytest.mark.parametrize("scan_layers", [True, False], ids=["scan", "unrolled"])
@pytest.mark.parametrize("name", list(CASES))
def test_export_gives_back_the_loaded_checkpoint(hf_models, name, scan_layers):
    folder, hf = hf_models[name]
    model = load_hf_folder(folder, scan_layers=scan_layers)
    exported = hf_tensors(decoder_params(model), model.config)
    original = load_file(os.path.join(folder, "model.safetensors"))
    if hf.config.tie_word_embeddings:  # a tied head is the embedding: neither file needs it
        original.pop("lm_head.weight", None)
    assert exported.keys() == original.keys()
    for key, value in original.items():
        np.testing.assert_array_equal(exported[key], value, err_msg=key)
        assert exported[key].flags.c_contiguous
    with open(os.path.join(folder, "config.json")) as f:
        saved = json.load(f)
    config = hf_config(model.config, dtype="float32", bos_token_id=saved.get("bos_token_id"),
                       eos_token_id=saved.get("eos_token_id"))
    assert ModelConfig.from_hf_config(config) == model.config
    assert config["architectures"] == saved["architectures"] and config["dtype"] == "float32"


def test_bfloat16_and_tensor_order():
    cfg = ModelConfig(family="llama", vocab_size=8, hidden_size=4, intermediate_size=6, num_layers=12,
                      num_heads=2, num_kv_heads=1, head_dim=2, tie_embeddings=True)
    params = {"embed": np.ones((8, 4), np.float32), "final_norm/scale": np.ones(4, np.float32),
              "layers/attn_norm/scale": np.arange(48, dtype=np.float32).reshape(12, 4)}
    out = hf_tensors(params, cfg, dtype=jnp.bfloat16)
    # embedding, layers 0..11 by index (not 0, 1, 10, 11, 2, ...), final norm
    assert list(out) == (["model.embed_tokens.weight"]
                         + [f"model.layers.{i}.input_layernorm.weight" for i in range(12)]
                         + ["model.norm.weight"])
    assert all(v.dtype == jnp.bfloat16 for v in out.values())
    np.testing.assert_array_equal(out["model.layers.7.input_layernorm.weight"].astype(np.float32),
                                  [28, 29, 30, 31])
    with pytest.raises(ValueError, match="hold an 'lm_head' but cfg.tie_embeddings=True"):
        hf_tensors({**params, "lm_head": np.ones((4, 8), np.float32)}, cfg)
    with pytest.raises(ValueError, match="leading layer axis of cfg.num_layers=12"):
        hf_tensors({**params, "layers/attn_norm/scale": np.ones((3, 4), np.float32)}, cfg)
    with pytest.raises(ValueError, match="no HF name for decoder parameter 'extra'"):
        hf_tensors({**params, "extra": np.ones(2, np.float32)}, cfg)


def test_configs_the_hf_classes_cannot_express_are_refused():
    base = dict(vocab_size=8, hidden_size=4, intermediate_size=6, num_layers=1, num_heads=2,
                num_kv_heads=1, head_dim=2)
    scaled = ModelConfig(family="llama", **base, rope_scaling=Llama3RopeScaling(8.0, 1.0, 4.0, 16))
    assert ModelConfig.from_hf_config(hf_config(scaled, dtype="bfloat16")) == scaled
    for bad, match in [(dict(family="llama", qkv_bias=True), "one `attention_bias`"),
                       (dict(family="qwen2"), "q/k/v bias and no output bias"),
                       (dict(family="llama", qk_norm=True), "QK-norm is Qwen3's")]:
        with pytest.raises(UnsupportedModelError, match=match):
            hf_config(dataclasses.replace(scaled, rope_scaling=None, **bad), dtype="float32")


def test_shards_and_index(tmp_path):
    assert shard_groups({"a": 4, "b": 4, "c": 9, "d": 1}, max_shard_bytes=8) == [["a", "b"], ["c"], ["d"]]
    assert shard_groups({}, max_shard_bytes=8) == []
    tensors = {f"t{i}": np.full((4,), i, np.float32) for i in range(5)}  # 16 bytes each
    files = write_safetensors(str(tmp_path), tensors, max_shard_bytes=40)
    assert files == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)] + [INDEX_FILE]
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert index["metadata"]["total_size"] == 80
    assert index["weight_map"] == {"t0": files[0], "t1": files[0], "t2": files[1], "t3": files[1],
                                   "t4": files[2]}
    for name in files[:3]:
        for key, value in load_file(str(tmp_path / name)).items():
            assert index["weight_map"][key] == name
            np.testing.assert_array_equal(value, tensors[key])
