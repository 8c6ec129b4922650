"""GGUF loading on tiny files written like llama.cpp's converter (F32, permuted llama q/k rows)."""
import numpy as np
import pytest

from hindsight.models import load_gguf
from hindsight.models.loading.gguf import unpermute_rows
from .helpers import COMMON, hf_logits, max_rel_err, ours, padded_batch, write_gguf

LENGTHS = (16, 11)


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3"])
def test_gguf_logits_match_hf(hf_models, tmp_path, name):
    _, hf = hf_models[name]
    path = str(tmp_path / f"{name}.gguf")
    write_gguf(hf, path, arch=name)
    model = load_gguf(path)
    assert model.config.family == name
    assert model.config.tie_embeddings == hf.config.tie_word_embeddings
    tokens, positions, mask = padded_batch(LENGTHS, 16, COMMON["vocab_size"], seed=1)
    err = max_rel_err(ours(model, tokens, positions, mask), hf_logits(hf, tokens, positions, mask), LENGTHS)
    assert err < 1e-4


def test_unpermute_inverts_llama_cpp_permutation():
    rng = np.random.RandomState(0)
    n_head, hd, d = 3, 8, 5
    w = rng.randn(n_head * hd, d)
    permuted = w.reshape(n_head, 2, hd // 2, d).swapaxes(1, 2).reshape(w.shape)
    np.testing.assert_array_equal(unpermute_rows(permuted, n_head), w)
    b = rng.randn(n_head * hd)
    np.testing.assert_array_equal(
        unpermute_rows(b.reshape(n_head, 2, hd // 2).swapaxes(1, 2).reshape(b.shape), n_head), b)
