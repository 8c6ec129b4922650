"""The inverse of the HF loader (`hf.py`): decoder parameters -> HF safetensors tensors, `ModelConfig`
-> HF `config.json`, and the (sharded) safetensors writer. Nothing is pickled.

    tensors = hf_tensors(decoder_params(model), model.config, dtype=jnp.bfloat16)
    config = hf_config(model.config, dtype="bfloat16", eos_token_id=2)
    write_safetensors(folder, tensors)          # model.safetensors, or shards + index above 5 GB
    save_hf_folder(model, tokenizer, out)       # all of it: weights, config, tokenizer, whole or nothing

Layout (the inverse of `HF_TABLE`): a kernel `[in, out]` is written as the torch Linear weight
`[out, in]`; stacked layers `[L, ...]` (scan layout) are split into `model.layers.<i>.*`; a tied
model writes only `model.embed_tokens.weight` (transformers ties the head to it, as its own
`save_pretrained` does). The decoder always holds q/k rows in HF's rotate-half order (the GGUF
loader undoes llama.cpp's interleaving when it reads a file), so no permutation is needed here: a
GGUF-born model exports as the HF checkpoint it was converted from.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from typing import Mapping

import jax
import numpy as np
from flax import nnx

from hindsight.models.config import ModelConfig, UnsupportedModelError
from hindsight.models.decoder import Decoder
from hindsight.models.loading.hf import HF_TABLE
from hindsight.models.partition import is_stacked, param_path

MAX_SHARD_BYTES = 5 * 10**9  # transformers' default `max_shard_size="5GB"`
HF_CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
              "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
              "qwen3": ("Qwen3Config", "Qwen3ForCausalLM")}
INDEX_FILE = "model.safetensors.index.json"


def decoder_params(model: Decoder) -> dict[str, np.ndarray]:
    """Decoder path -> host array of every `nnx.Param` (`"embed"` `[V, D]`,
    `"layers/attn/q_proj/kernel"` `[L, D, H*hd]` stacked or `"layers/3/attn/q_proj/kernel"`
    `[D, H*hd]` unrolled, ...), gathered from whatever sharding the model is placed with."""
    return {param_path(path): np.asarray(jax.device_get(var[...]))
            for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def hf_tensors(params: Mapping[str, np.ndarray], cfg: ModelConfig, *, dtype=None) -> dict[str, np.ndarray]:
    """HF tensor name -> C-contiguous array, the inverse of `HF_TABLE` (see module doc).

    Args:
      params: decoder path -> array, as `decoder_params` returns (stacked or unrolled layers).
      cfg: the decoder's architecture (layer count and tied head are checked against `params`).
      dtype: cast every tensor to it (e.g. `jnp.bfloat16`); None keeps each array's own dtype.
    Raises:
      ValueError naming a parameter no rule covers, a stack whose layer axis is not
      `cfg.num_layers`, or a head that contradicts `cfg.tie_embeddings`.
    """
    if ("lm_head" in params) == cfg.tie_embeddings:
        raise ValueError(f"params {'hold' if cfg.tie_embeddings else 'lack'} an 'lm_head' but "
                         f"cfg.tie_embeddings={cfg.tie_embeddings}")
    out = {}
    for path, value in params.items():
        if is_stacked(path):
            if value.shape[0] != cfg.num_layers:
                raise ValueError(f"stacked parameter {path!r} has shape {value.shape}, expected a "
                                 f"leading layer axis of cfg.num_layers={cfg.num_layers}")
            parts = [(f"layers/{i}/{path[len('layers/'):]}", value[i]) for i in range(cfg.num_layers)]
        else:
            parts = [(path, value)]
        for unstacked, array in parts:
            rule, name = _rule(unstacked)
            # HF_TABLE has no `transform` (HF files are already in the decoder's order): only the
            # transpose is undone.
            array = array.T if rule.transpose else array
            out[name] = np.ascontiguousarray(array if dtype is None else array.astype(dtype))
    return dict(sorted(out.items(), key=lambda item: _order(item[0])))


def _rule(path: str):
    for rule in HF_TABLE:
        name = rule.match(path)
        if name is not None:
            return rule, name
    raise ValueError(f"no HF name for decoder parameter {path!r}")


def _order(name: str) -> tuple:
    """transformers' order: embedding, layers by index, final norm, head (so a shard holds whole
    consecutive layers)."""
    m = re.match(r"model\.layers\.(\d+)\.(.*)", name)
    if m:
        return 1, int(m.group(1)), m.group(2)
    return (0 if name.startswith("model.embed") else 2), 0, name


def hf_config(cfg: ModelConfig, *, dtype: str, bos_token_id: int | None = None,
              eos_token_id: int | None = None, pad_token_id: int | None = None) -> dict:
    """The HF `config.json` dict of `cfg` (`LlamaForCausalLM` / `Qwen2ForCausalLM` /
    `Qwen3ForCausalLM`), written by the installed transformers' own config class so that its field
    names (`rope_parameters`, `dtype`) are the ones its loader reads; `ModelConfig.from_hf_config`
    of the result gives `cfg` back.

    Args:
      dtype: the stored tensors' dtype name ("float32", "bfloat16"); `from_pretrained` loads in it.
      bos_token_id / eos_token_id / pad_token_id: the tokenizer's special ids (None: unset).
    Raises:
      UnsupportedModelError for a combination the family's HF class cannot express (a Llama or
      Qwen3 with q/k/v bias but no output bias, a Qwen2 without q/k/v bias, QK-norm outside Qwen3).
    """
    import transformers

    config_class, architecture = HF_CLASSES[cfg.family]
    where = f"family={cfg.family!r}, qkv_bias={cfg.qkv_bias}, o_bias={cfg.o_bias}, qk_norm={cfg.qk_norm}"
    if cfg.qk_norm != (cfg.family == "qwen3"):
        raise UnsupportedModelError(f"HF {architecture} cannot express this model ({where}): QK-norm "
                                    f"is Qwen3's and only Qwen3's")
    kwargs = {}
    if cfg.family == "qwen2":
        if not cfg.qkv_bias or cfg.o_bias:
            raise UnsupportedModelError(f"HF {architecture} has q/k/v bias and no output bias ({where})")
    elif cfg.qkv_bias != cfg.o_bias:
        raise UnsupportedModelError(f"HF {architecture} has one `attention_bias` for q/k/v and the "
                                    f"output projection ({where})")
    else:
        kwargs["attention_bias"] = cfg.qkv_bias
    if cfg.rope_scaling is not None:
        kwargs["rope_scaling"] = {"rope_type": "llama3", **dataclasses.asdict(cfg.rope_scaling)}
    config = getattr(transformers, config_class)(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, hidden_act="silu", rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta, max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_embeddings, bos_token_id=bos_token_id,
        eos_token_id=eos_token_id, pad_token_id=pad_token_id, dtype=dtype,
        architectures=[architecture], **kwargs)
    return config.to_diff_dict()


def shard_groups(sizes: Mapping[str, int], *, max_shard_bytes: int = MAX_SHARD_BYTES) -> list[list[str]]:
    """Tensor names (in `sizes`' order) cut into consecutive shards of at most `max_shard_bytes`
    each (a tensor larger than that gets a shard of its own, as transformers does)."""
    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    groups, total = [[]], 0
    for name, size in sizes.items():
        if groups[-1] and total + size > max_shard_bytes:
            groups.append([])
            total = 0
        groups[-1].append(name)
        total += size
    return groups if groups[0] else []


def write_safetensors(folder: str, tensors: Mapping[str, np.ndarray], *,
                      max_shard_bytes: int = MAX_SHARD_BYTES) -> list[str]:
    """Write `tensors` into `folder` (which must exist) as `model.safetensors`, or, when they
    exceed `max_shard_bytes`, as `model-0000k-of-0000n.safetensors` shards plus
    `model.safetensors.index.json` (`metadata.total_size`, `weight_map`). Every file carries
    `{"format": "pt"}` metadata, which transformers requires. Returns the file names written."""
    from safetensors.numpy import save_file

    groups = shard_groups({k: v.nbytes for k, v in tensors.items()}, max_shard_bytes=max_shard_bytes)
    names = (["model.safetensors"] if len(groups) == 1 else
             [f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors" for k in range(len(groups))])
    for name, group in zip(names, groups):
        save_file({k: tensors[k] for k in group}, os.path.join(folder, name), metadata={"format": "pt"})
    if len(groups) == 1:
        return names
    index = {"metadata": {"total_size": int(sum(v.nbytes for v in tensors.values()))},
             "weight_map": {k: name for name, group in zip(names, groups) for k in group}}
    with open(os.path.join(folder, INDEX_FILE), "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2)
    return names + [INDEX_FILE]


def save_hf_folder(model: Decoder, tokenizer, out: str, *, dtype: str | None = None,
                   max_shard_bytes: int | None = None) -> dict:
    """Write ``model`` and its transformers ``tokenizer`` to the HF folder ``out`` (a new or empty
    directory): safetensors (cast to ``dtype``, None: the params' own; shards above
    ``max_shard_bytes``, None: 5 GB), ``config.json``, ``generation_config.json`` (the tokenizer's
    BOS / EOS / pad ids) and the tokenizer files. Written under a temporary name and renamed when
    complete, so ``out`` never holds a partial folder. Returns ``{"out", "architecture", "dtype",
    "files", "num_params"}``."""
    import jax.numpy as jnp
    from transformers import GenerationConfig

    params = decoder_params(model)
    dtype = dtype or params["embed"].dtype.name  # every param shares the model's param_dtype
    tensors = hf_tensors(params, model.config, dtype=jnp.dtype(dtype))
    ids = {k: getattr(tokenizer, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(os.path.abspath(out))}.partial-{os.getpid()}")
    os.makedirs(tmp)
    try:
        write_safetensors(tmp, tensors, max_shard_bytes=max_shard_bytes or MAX_SHARD_BYTES)
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(hf_config(model.config, dtype=dtype, **ids), f, indent=2, sort_keys=True)
        GenerationConfig(**{k: v for k, v in ids.items() if v is not None}).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, out)  # an empty `out` is replaced; a reader never sees half a folder
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"out": out, "architecture": HF_CLASSES[model.config.family][1], "dtype": dtype,
            "files": sorted(os.listdir(out)),
            "num_params": int(sum(t.size for t in tensors.values()))}
