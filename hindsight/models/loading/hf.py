"""Load an HF transformers folder: `config.json` + `*.safetensors` (single file or sharded with
`model.safetensors.index.json`). Tensors are memory-mapped with `safetensors.safe_open`; nothing is
ever unpickled (`.bin` / `.pt` checkpoints are refused)."""
from __future__ import annotations

import contextlib
import functools
import json
import os

import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from safetensors import safe_open

from hindsight.models.config import ModelConfig
from hindsight.models.decoder import Decoder
from hindsight.models.loading.build import NameRule, SourceTensor, WeightLoadError, build_model
from hindsight.models.partition import DEFAULT_RULES

_L = "model.layers.{layer}."
HF_TABLE: tuple[NameRule, ...] = (
    NameRule("embed", "model.embed_tokens.weight"),
    NameRule("final_norm/scale", "model.norm.weight"),
    NameRule("lm_head", "lm_head.weight", transpose=True),
    NameRule("layers/{layer}/attn_norm/scale", _L + "input_layernorm.weight"),
    NameRule("layers/{layer}/mlp_norm/scale", _L + "post_attention_layernorm.weight"),
    *(NameRule(f"layers/{{layer}}/attn/{p}_proj/kernel", _L + f"self_attn.{p}_proj.weight", transpose=True)
      for p in "qkvo"),
    *(NameRule(f"layers/{{layer}}/attn/{p}_proj/bias", _L + f"self_attn.{p}_proj.bias") for p in "qkvo"),
    *(NameRule(f"layers/{{layer}}/attn/{p}_norm/scale", _L + f"self_attn.{p}_norm.weight") for p in "qk"),
    *(NameRule(f"layers/{{layer}}/mlp/{p}_proj/kernel", _L + f"mlp.{p}_proj.weight", transpose=True)
      for p in ("gate", "up", "down")),
)


def read_hf_config(folder: str) -> ModelConfig:
    """`ModelConfig` from `folder/config.json`."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{folder}: no config.json (not an HF model folder)")
    with open(path) as f:
        return ModelConfig.from_hf_config(json.load(f))


def safetensors_files(folder: str) -> list[str]:
    """The folder's safetensors files: from `model.safetensors.index.json` if present, else
    `model.safetensors`, else every `*.safetensors`."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.isfile(os.path.join(folder, "model.safetensors")):
        names = ["model.safetensors"]
    else:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    if not names:
        raise FileNotFoundError(f"{folder}: no *.safetensors weights (pickle checkpoints are not loaded)")
    files = [os.path.join(folder, n) for n in names]
    for f in files:
        if not os.path.isfile(f):
            raise FileNotFoundError(f"{folder}: index lists {os.path.basename(f)!r}, which is missing")
    return files


def load_hf_folder(folder: str, *, dtype=jnp.float32, param_dtype=jnp.float32, mesh: Mesh | None = None,
                   scan_layers: bool = True, remat: bool = False, attention: str = "auto",
                   rules=DEFAULT_RULES) -> Decoder:
    """Load a `Decoder` from an HF folder; every tensor is checked before any parameter is created.

    Args:
      folder: holds `config.json` and safetensors weights.
      dtype / param_dtype: compute and storage dtypes.
      mesh: place parameters directly with the partition `rules` (None: default device).
      scan_layers / remat / attention: see `Decoder`.
    Raises:
      UnsupportedModelError (family / feature), WeightLoadError (missing, unexpected or misshapen
      tensor, naming file and tensor), FileNotFoundError.
    """
    cfg = read_hf_config(folder)
    with contextlib.ExitStack() as stack:
        tensors = []
        for path in safetensors_files(folder):
            tensors.extend(_file_tensors(stack, path))
        return build_model(cfg, tensors, HF_TABLE, origin=folder, ignore=_ignorable(cfg),
                           dtype=dtype, param_dtype=param_dtype, scan_layers=scan_layers, remat=remat,
                           attention=attention, mesh=mesh, rules=rules)


def _ignorable(cfg: ModelConfig):
    # Old checkpoints store RoPE buffers; tied checkpoints sometimes store the (shared) head anyway.
    def ignore(name: str) -> bool:
        return name.endswith("rotary_emb.inv_freq") or (cfg.tie_embeddings and name == "lm_head.weight")
    return ignore


def _file_tensors(stack: contextlib.ExitStack, path: str) -> list[SourceTensor]:
    try:
        f = stack.enter_context(safe_open(path, framework="numpy"))
    except Exception as e:  # a corrupt header: name the file
        raise WeightLoadError(f"{path}: not a readable safetensors file ({e})") from e
    bf16_handle = []  # NumPy has no bfloat16: bf16 tensors are read through the flax (jax) framework

    def read(name: str, dtype_name: str) -> np.ndarray:
        if dtype_name != "BF16":
            return f.get_tensor(name)
        if not bf16_handle:
            bf16_handle.append(stack.enter_context(safe_open(path, framework="flax")))
        return np.asarray(bf16_handle[0].get_tensor(name))

    out = []
    for name in f.keys():
        sl = f.get_slice(name)
        out.append(SourceTensor(name=name, file=path, shape=tuple(sl.get_shape()),
                                read=functools.partial(read, name, sl.get_dtype())))
    return out
