"""Decoder configuration: one frozen dataclass for the Llama / Qwen2 / Qwen3 families.

Built from an HF `config.json` dict (`ModelConfig.from_hf_config`) or from GGUF metadata
(`hindsight.models.loading.gguf`). Everything the forward pass needs is here; nothing is read from
the HF config at call time.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

SUPPORTED_FAMILIES = ("llama", "qwen2", "qwen3")


class UnsupportedModelError(ValueError):
    """The config describes a family or a feature this decoder does not implement."""


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama-3.x frequency-dependent RoPE scaling (HF `rope_type="llama3"`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of a causal decoder.

    Attributes:
      family: "llama" (also SmolLM2, Llama-3.x), "qwen2" (q/k/v bias) or "qwen3" (QK-norm).
      vocab_size, hidden_size (D), intermediate_size (F), num_layers (L).
      num_heads (H), num_kv_heads (KV, divides H), head_dim (hd; may differ from D // H in Qwen3).
      rms_norm_eps: epsilon of every RMSNorm.
      rope_theta: RoPE base; rope_scaling: None or `Llama3RopeScaling`.
      qkv_bias: bias on the q/k/v projections; o_bias: bias on the output projection.
      qk_norm: RMSNorm over head_dim on q and k (per head) before RoPE.
      tie_embeddings: the LM head is the transpose of the token embedding.
      max_position_embeddings: context length the checkpoint was trained for (informational).
    """

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Llama3RopeScaling | None = None
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    max_position_embeddings: int = 2048

    def __post_init__(self):
        if self.family not in SUPPORTED_FAMILIES:
            raise UnsupportedModelError(
                f"unsupported model family {self.family!r}; supported: {', '.join(SUPPORTED_FAMILIES)}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                             f"({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> "ModelConfig":
        """Build from an HF `config.json` dict (transformers 4.x `rope_theta`/`rope_scaling` or 5.x
        `rope_parameters`). Raises `UnsupportedModelError` naming `model_type` / `architectures` for
        families or features this decoder does not implement."""
        model_type = config.get("model_type")
        archs = config.get("architectures")
        where = f"model_type={model_type!r}, architectures={archs!r}"
        if model_type not in SUPPORTED_FAMILIES:
            raise UnsupportedModelError(
                f"unsupported model ({where}); supported model_type: {', '.join(SUPPORTED_FAMILIES)}")
        act = config.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedModelError(f"unsupported hidden_act {act!r} ({where}); only 'silu' (SwiGLU)")
        if config.get("mlp_bias"):
            raise UnsupportedModelError(f"mlp_bias=True is not supported ({where})")
        if config.get("use_sliding_window"):
            raise UnsupportedModelError(f"sliding-window attention is not supported ({where})")
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        head_dim = config.get("head_dim") or hidden // heads
        theta, scaling = _rope_from_hf(config, where)
        attention_bias = bool(config.get("attention_bias", False))
        return cls(
            family=model_type,
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            # Qwen2 always has q/k/v bias and never an output bias; Llama/Qwen3 use `attention_bias`
            # for all four projections.
            qkv_bias=True if model_type == "qwen2" else attention_bias,
            o_bias=False if model_type == "qwen2" else attention_bias,
            qk_norm=model_type == "qwen3",
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
        )


def _rope_from_hf(config: Mapping[str, Any], where: str) -> tuple[float, Llama3RopeScaling | None]:
    params = dict(config.get("rope_parameters") or {})
    legacy = config.get("rope_scaling") or {}
    params = {**legacy, **params}
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type == "llama3":
        return theta, Llama3RopeScaling(
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]))
    raise UnsupportedModelError(f"unsupported rope_type {rope_type!r} ({where}); supported: default, llama3")
