"""Load a GGUF file (llama.cpp format) with the `gguf` package: config from the metadata, tensors
dequantized to float32 (`gguf.quants.dequantize`), llama.cpp's q/k row permutation undone for the
`llama` architecture (its converter interleaves the two RoPE halves of each head; Qwen2/Qwen3 files
are written in HF order). The tokenizer and chat template come from the same file via transformers.
"""
from __future__ import annotations

import hashlib
import os
import shutil

import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from hindsight.models.config import ModelConfig, UnsupportedModelError
from hindsight.models.decoder import Decoder
from hindsight.models.loading.build import NameRule, SourceTensor, WeightLoadError, build_model
from hindsight.models.partition import DEFAULT_RULES
from hindsight.models.paths import default_cache_dir

GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3")


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Invert llama.cpp's q/k permutation: per head, rows [0,2,4,...,1,3,5,...] -> HF rotate-half
    order. `w [n_head*hd, ...]` (weight or bias)."""
    hd = w.shape[0] // n_head
    return w.reshape(n_head, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _unpermute(kind: str):
    def transform(w: np.ndarray, cfg: ModelConfig) -> np.ndarray:
        if cfg.family != "llama":
            return w
        return unpermute_rows(w, cfg.num_heads if kind == "q" else cfg.num_kv_heads)
    return transform


_B = "blk.{layer}."
GGUF_TABLE: tuple[NameRule, ...] = (
    NameRule("embed", "token_embd.weight"),
    NameRule("final_norm/scale", "output_norm.weight"),
    NameRule("lm_head", "output.weight", transpose=True),
    NameRule("layers/{layer}/attn_norm/scale", _B + "attn_norm.weight"),
    NameRule("layers/{layer}/mlp_norm/scale", _B + "ffn_norm.weight"),
    NameRule("layers/{layer}/attn/q_proj/kernel", _B + "attn_q.weight", True, _unpermute("q")),
    NameRule("layers/{layer}/attn/k_proj/kernel", _B + "attn_k.weight", True, _unpermute("k")),
    NameRule("layers/{layer}/attn/v_proj/kernel", _B + "attn_v.weight", True),
    NameRule("layers/{layer}/attn/o_proj/kernel", _B + "attn_output.weight", True),
    NameRule("layers/{layer}/attn/q_proj/bias", _B + "attn_q.bias", False, _unpermute("q")),
    NameRule("layers/{layer}/attn/k_proj/bias", _B + "attn_k.bias", False, _unpermute("k")),
    NameRule("layers/{layer}/attn/v_proj/bias", _B + "attn_v.bias"),
    NameRule("layers/{layer}/attn/o_proj/bias", _B + "attn_output.bias"),
    NameRule("layers/{layer}/attn/q_norm/scale", _B + "attn_q_norm.weight"),
    NameRule("layers/{layer}/attn/k_norm/scale", _B + "attn_k_norm.weight"),
    NameRule("layers/{layer}/mlp/gate_proj/kernel", _B + "ffn_gate.weight", True),
    NameRule("layers/{layer}/mlp/up_proj/kernel", _B + "ffn_up.weight", True),
    NameRule("layers/{layer}/mlp/down_proj/kernel", _B + "ffn_down.weight", True),
)


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def gguf_config(reader, path: str) -> ModelConfig:
    """`ModelConfig` from the metadata of an open `GGUFReader` (`path` for error messages)."""
    arch = _field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise UnsupportedModelError(f"{path}: unsupported GGUF architecture {arch!r}; supported: "
                                    f"{', '.join(GGUF_ARCHITECTURES)}")
    names = {t.name for t in reader.tensors}
    scaling = _field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None) or "rope_freqs.weight" in names:
        raise UnsupportedModelError(f"{path}: GGUF RoPE scaling ({scaling!r}, rope_freqs) is not supported; "
                                    "load the HF folder instead (Llama-3 scaling is read from config.json)")

    def need(key):
        value = _field(reader, f"{arch}.{key}")
        if value is None:
            raise WeightLoadError(f"{path}: GGUF metadata key {arch}.{key!s} is missing")
        return value

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    embd = [t for t in reader.tensors if t.name == "token_embd.weight"]
    if not embd:
        raise WeightLoadError(f"missing tensor 'token_embd.weight' in {path}")
    return ModelConfig(
        family=arch,
        vocab_size=int(embd[0].shape[-1]),  # ggml order: [D, V]
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=heads,
        num_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(_field(reader, f"{arch}.attention.key_length", hidden // heads)),
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        qkv_bias=arch == "qwen2" or "blk.0.attn_q.bias" in names,
        o_bias="blk.0.attn_output.bias" in names,
        qk_norm=arch == "qwen3",
        tie_embeddings="output.weight" not in names,
        max_position_embeddings=int(_field(reader, f"{arch}.context_length", 2048)),
    )


def load_gguf(path: str, *, dtype=jnp.float32, param_dtype=jnp.float32, mesh: Mesh | None = None,
              scan_layers: bool = True, remat: bool = False, attention: str = "auto",
              rules=DEFAULT_RULES) -> Decoder:
    """Load a `Decoder` from a `.gguf` file (any quantization `gguf` can dequantize).

    Every tensor's shape is checked against the metadata before anything is dequantized.
    Raises UnsupportedModelError / WeightLoadError naming the file and tensor."""
    from gguf import GGUFReader

    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such GGUF file: {path}")
    try:
        reader = GGUFReader(path)
    except Exception as e:
        raise WeightLoadError(f"{path}: not a readable GGUF file ({e})") from e
    cfg = gguf_config(reader, path)
    tensors = [SourceTensor(name=t.name, file=path, shape=tuple(int(n) for n in reversed(t.shape)),
                            read=lambda t=t: _dequantize(t)) for t in reader.tensors]
    return build_model(cfg, tensors, GGUF_TABLE, origin=path, dtype=dtype, param_dtype=param_dtype,
                       scan_layers=scan_layers, remat=remat, attention=attention, mesh=mesh,
                       rules=rules)


def _dequantize(t) -> np.ndarray:
    from gguf.quants import dequantize

    shape = tuple(int(n) for n in reversed(t.shape))
    return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)


def load_gguf_tokenizer(path: str, *, cache_dir: str | None = None):
    """The tokenizer (with chat template) stored in the GGUF, via transformers (no network).

    Converting a GGUF vocabulary is slow (seconds: transformers re-parses the file and rebuilds the
    BPE), so the converted tokenizer is saved once under `cache_dir/tokenizers/` (default
    `$HINDSIGHT_CACHE` or `~/.cache/hindsight`), keyed by the file's path, size and mtime and the
    transformers version, and later loads read that folder."""
    import transformers
    from transformers import AutoTokenizer

    path = os.path.abspath(path)
    stat = os.stat(path)
    key = hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}:{transformers.__version__}".encode())
    folder = os.path.join(cache_dir or default_cache_dir(), "tokenizers",
                          f"{os.path.basename(path)}-{key.hexdigest()[:16]}")
    if os.path.isdir(folder):
        return AutoTokenizer.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    tmp = f"{folder}.partial-{os.getpid()}"
    tok.save_pretrained(tmp)
    try:
        os.replace(tmp, folder)  # atomic: a reader never sees a half-written folder
    except OSError:  # another process published it first
        shutil.rmtree(tmp, ignore_errors=True)
    return tok
