"""Tiny random HF checkpoints (one per family variant), saved as safetensors, plus helpers to run
our decoder on them. No downloads: models come from their torch config classes with seeded init."""
from __future__ import annotations

import numpy as np
import jax.numpy as jnp
from flax import nnx

COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)

# name -> (config class, model class, extra config); covers tied/untied, llama3 rope, bias, QK-norm.
CASES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=False, rope_theta=1000.0)),
    "llama3_rope": ("LlamaConfig", "LlamaForCausalLM", dict(
        tie_word_embeddings=True, rope_theta=5000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=16))),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(tie_word_embeddings=False, head_dim=24)),
}


def make_hf_model(name: str, seed: int = 0):
    """A seeded random HF model; norm weights and biases are perturbed so that they matter."""
    import torch
    import transformers

    cfg_cls, model_cls, extra = CASES[name]
    torch.manual_seed(seed)
    config = getattr(transformers, cfg_cls)(**COMMON, **extra)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname or pname.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def padded_batch(lengths, total: int, vocab: int, seed: int = 0):
    """Right-padded token batch: tokens `[B,total]` int32, positions `arange`, mask 1 on real tokens."""
    rng = np.random.RandomState(seed)
    tokens = rng.randint(0, vocab, (len(lengths), total)).astype(np.int32)
    mask = (np.arange(total)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
    positions = np.broadcast_to(np.arange(total, dtype=np.int32), tokens.shape).copy()
    return tokens, positions, mask


def hf_logits(model, tokens, positions, mask) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor(tokens, dtype=torch.long),
                     attention_mask=torch.tensor(mask, dtype=torch.long),
                     position_ids=torch.tensor(positions, dtype=torch.long)).logits.float().numpy()


@nnx.jit
def forward(model, tokens, positions, mask):
    return model(tokens, positions, attention_mask=mask)[0]


@nnx.jit
def forward_cached(model, tokens, positions, cache):
    return model(tokens, positions, cache=cache)


def ours(model, tokens, positions, mask) -> np.ndarray:
    return np.asarray(forward(model, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask)))


def max_rel_err(out, ref, lengths) -> float:
    """max |out - ref| / max |ref| over the real (unpadded) positions of each row."""
    num = max(float(np.abs(out[b, :n] - ref[b, :n]).max()) for b, n in enumerate(lengths))
    den = max(float(np.abs(ref[b, :n]).max()) for b, n in enumerate(lengths))
    return num / den


GGUF_ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


def write_gguf(hf_model, path: str, *, arch: str, drop: tuple = ()) -> None:
    """Write an HF model as an F32 GGUF the way llama.cpp's converter does (llama.cpp tensor names;
    for `llama`, q/k rows permuted to interleaved RoPE order). `drop` omits tensors by GGUF name."""
    from gguf import GGUFWriter

    cfg = hf_model.config
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    def permute(w, n_head):
        if arch != "llama":
            return w
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    names = {"embed_tokens": "token_embd", "norm": "output_norm", "input_layernorm": "attn_norm",
             "post_attention_layernorm": "ffn_norm", "q_proj": "attn_q", "k_proj": "attn_k",
             "v_proj": "attn_v", "o_proj": "attn_output", "q_norm": "attn_q_norm", "k_norm": "attn_k_norm",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    tensors = {}
    for name, p in hf_model.state_dict().items():
        w = p.detach().float().numpy()
        parts = name.split(".")
        if name == "lm_head.weight":
            if cfg.tie_word_embeddings:
                continue
            gname = "output.weight"
        elif parts[1] == "layers":
            gname = f"blk.{parts[2]}.{names[parts[-2]]}.{parts[-1]}"
            if parts[-2] == "q_proj":
                w = permute(w, cfg.num_attention_heads)
            elif parts[-2] == "k_proj":
                w = permute(w, cfg.num_key_value_heads)
        else:
            gname = f"{names[parts[1]]}.weight"
        if gname not in drop:
            tensors[gname] = np.ascontiguousarray(w)
    writer = GGUFWriter(path, arch=arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(hd)
    writer.add_value_length(hd)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    for gname, w in tensors.items():
        writer.add_tensor(gname, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
