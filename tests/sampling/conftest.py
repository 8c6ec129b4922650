"""Fixtures for the sampler tests: one tiny random decoder (shared so that the jitted loops compile
once per test session) and tiny random HF checkpoints of each family, saved as safetensors."""
import pytest
from flax import nnx

from hindsight.models import Decoder, ModelConfig

TINY = ModelConfig(family="llama", vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=1000.0)

HF_COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                 initializer_range=0.2)
HF_CASES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=False, rope_theta=1000.0)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(tie_word_embeddings=False, head_dim=24)),
}


@pytest.fixture(scope="session")
def tiny():
    """A tiny random Llama-family decoder (f32, scanned layers)."""
    model = Decoder(TINY, rngs=nnx.Rngs(0))
    # Larger embeddings than the 0.02 init, so next-token distributions are far from uniform and
    # greedy / truncation tests see clear gaps between tokens.
    model.embed[...] = model.embed[...] * 40.0
    return model


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
    """family -> (HF folder, torch model): seeded random HF models saved with `save_pretrained`."""
    import torch
    import transformers

    out = {}
    for name, (cfg_cls, model_cls, extra) in HF_CASES.items():
        torch.manual_seed(0)
        config = getattr(transformers, cfg_cls)(**HF_COMMON, **extra)
        model = getattr(transformers, model_cls)(config).eval()
        folder = tmp_path_factory.mktemp(f"hf_{name}")
        model.save_pretrained(folder, safe_serialization=True)
        out[name] = (str(folder), model)
    return out
