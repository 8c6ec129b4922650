"""Logits parity with HF transformers (PyTorch, fp32) on tiny random checkpoints of every family."""
import numpy as np
import pytest

import jax.numpy as jnp

from hindsight.models import load_hf_folder, matmul
from .helpers import CASES, COMMON, hf_logits, max_rel_err, ours, padded_batch

LENGTHS = (24, 17, 9)
TOTAL = 24


@pytest.mark.parametrize("scan_layers", [True, False], ids=["scan", "unrolled"])
@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_hf(hf_models, name, scan_layers):
    folder, hf = hf_models[name]
    tokens, positions, mask = padded_batch(LENGTHS, TOTAL, COMMON["vocab_size"])
    ref = hf_logits(hf, tokens, positions, mask)
    model = load_hf_folder(folder, scan_layers=scan_layers)
    out = ours(model, tokens, positions, mask)
    assert out.dtype == np.float32 and out.shape == ref.shape
    assert max_rel_err(out, ref, LENGTHS) < 1e-4


def test_llama3_inv_freq_matches_hf():
    """The llama3 frequency scaling equals HF's and really changes the frequencies (the parity test
    above then covers it end to end, at positions beyond its original 16-token context)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from hindsight.models import ModelConfig
    from hindsight.models.layers import rope_inv_freq

    _, _, extra = CASES["llama3_rope"]
    hf_cfg = LlamaConfig(**COMMON, **extra)
    ref, scaling = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg)
    cfg = ModelConfig.from_hf_config(hf_cfg.to_dict())
    ours = np.asarray(rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling))
    plain = np.asarray(rope_inv_freq(cfg.head_dim, cfg.rope_theta))
    assert scaling == 1.0
    np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-6)
    assert np.abs(ours - plain).max() / plain.max() > 1e-3


@pytest.mark.parametrize("name", ["qwen3", "qwen2"])
def test_return_hidden_and_unembedding_reproduce_logits(hf_models, name):
    from flax import nnx

    model = load_hf_folder(hf_models[name][0])
    tokens, positions, mask = (jnp.asarray(x) for x in padded_batch(LENGTHS, TOTAL, COMMON["vocab_size"]))

    @nnx.jit
    def both(m, t, p, a):
        hidden, _ = m(t, p, attention_mask=a, return_hidden=True)
        logits, _ = m(t, p, attention_mask=a)
        return hidden, matmul(hidden, m.unembedding(), dtype=m.dtype), logits

    hidden, rebuilt, logits = both(model, tokens, positions, mask)
    assert hidden.shape == (len(LENGTHS), TOTAL, COMMON["hidden_size"])
    assert model.unembedding().shape == (COMMON["hidden_size"], COMMON["vocab_size"])
    np.testing.assert_allclose(np.asarray(rebuilt), np.asarray(logits), rtol=1e-6, atol=1e-6)
