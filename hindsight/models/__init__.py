"""`hindsight.models`: one Flax NNX decoder for Llama / Qwen2 / Qwen3, weight loaders (HF safetensors
folders, GGUF), a registry of embedded models and FSDP/TP partition rules.

    model, tok = hindsight.models.load("smollm2-135m-instruct")
    logits, _ = model(tokens, positions)                          # [B,S] int32 -> f32 [B,S,V]
    cache = model.init_cache(batch, max_len)
    logits, cache = model(tokens, positions, cache=cache)         # writes slot == position
    hidden, _ = model(tokens, positions, return_hidden=True)      # [B,S,D], head: model.unembedding()
    out, _, carry = model(tokens, positions, mlp_reduce=MLPReduce(init, step))  # fold MLP activations
    abstract = hindsight.models.abstract_model("qwen3-8b")        # shapes only (config-only entry)
"""
from hindsight.models.cache import KVCache, cache_take, init_cache
from hindsight.models.config import Llama3RopeScaling, ModelConfig, UnsupportedModelError
from hindsight.models.decoder import Block, Decoder, MLPReduce
from hindsight.models.layers import matmul
from hindsight.models.loading.build import WeightLoadError
from hindsight.models.loading.gguf import load_gguf, load_gguf_tokenizer
from hindsight.models.loading.hf import load_hf_folder
from hindsight.models.partition import DEFAULT_RULES, partition_specs, shard_state, spec_for
from hindsight.models.registry import (CONFIG_ONLY, QWEN25_CODER_05B_SHA256, REGISTRY, ConfigOnlyError,
                                       IntegrityError, abstract_model, assemble_parts, load,
                                       load_tokenizer, model_config, resolve, tokenizer_mismatch)

__all__ = [
    "KVCache", "cache_take", "init_cache",
    "Llama3RopeScaling", "ModelConfig", "UnsupportedModelError",
    "Block", "Decoder", "MLPReduce", "matmul",
    "WeightLoadError", "load_gguf", "load_gguf_tokenizer", "load_hf_folder",
    "DEFAULT_RULES", "partition_specs", "shard_state", "spec_for",
    "CONFIG_ONLY", "QWEN25_CODER_05B_SHA256", "REGISTRY", "ConfigOnlyError", "IntegrityError",
    "abstract_model", "assemble_parts", "load", "load_tokenizer", "model_config", "resolve",
    "tokenizer_mismatch",
]
