"""Config-only registry entries (qwen3-8b, llama-3.1-8b): shipped HF configs, no weights. The
abstract decoder has transformers' parameters (counted on its meta device) and RoPE; loading
weights or a tokenizer from them is refused."""
import json
import os

import jax
import numpy as np
import pytest

from hindsight.models import (CONFIG_ONLY, ConfigOnlyError, abstract_model, load, load_tokenizer,
                              model_config, resolve)
from hindsight.models.registry import CONFIG_DIR

ARCH = {  # from the public config.json of each model
    "qwen3-8b": dict(family="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                     num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128, qk_norm=True,
                     tie_embeddings=False, rope_theta=1e6, rope_scaling=None),
    "llama-3.1-8b": dict(family="llama", vocab_size=128256, hidden_size=4096,
                         intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8,
                         head_dim=128, qk_norm=False, tie_embeddings=False, rope_theta=5e5),
}


def _hf_config(name):
    from transformers import AutoConfig
    with open(os.path.join(CONFIG_DIR, CONFIG_ONLY[name].config_file)) as f:
        raw = json.load(f)
    return AutoConfig.for_model(raw.pop("model_type"), **raw)


@pytest.mark.parametrize("name", list(CONFIG_ONLY))
def test_the_shipped_configs_describe_the_models(name):
    cfg = model_config(name)
    for key, value in ARCH[name].items():
        assert getattr(cfg, key) == value, key
    if name == "llama-3.1-8b":
        s = cfg.rope_scaling
        assert (s.factor, s.low_freq_factor, s.high_freq_factor,
                s.original_max_position_embeddings) == (8.0, 1.0, 4.0, 8192)


@pytest.mark.parametrize("name", list(CONFIG_ONLY))
def test_abstract_model_has_transformers_parameters(name):
    """The abstract decoder's parameter count equals transformers' model built from the same
    config.json on the meta device (no memory), and nothing of ours is allocated."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(_hf_config(name))
    expected = sum(p.numel() for p in hf.parameters())
    from flax import nnx
    model = abstract_model(name)
    leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    assert sum(int(np.prod(x.shape)) for x in leaves) == expected


def test_llama31_rope_matches_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from hindsight.models.layers import rope_inv_freq

    cfg = model_config("llama-3.1-8b")
    ref, scaling = ROPE_INIT_FUNCTIONS["llama3"](_hf_config("llama-3.1-8b"))
    ours = np.asarray(rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling))
    assert scaling == 1.0
    np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-6)


@pytest.mark.parametrize("call", [load, load_tokenizer, resolve])
def test_weights_and_tokenizers_are_refused(call):
    with pytest.raises(ConfigOnlyError, match="config-only entry: no weights; use --dry_run"):
        call("qwen3-8b")
