"""Real weights: SmolLM2-135M-Instruct from the embedded GGUF vs transformers loading the same GGUF."""
import os

import numpy as np
import pytest

import jax.numpy as jnp
from flax import nnx

import hindsight.models as hm

pytestmark = pytest.mark.slow
NEW_TOKENS = 20


@nnx.jit
def _step(model, tokens, positions, cache):
    logits, cache = model(tokens, positions, cache=cache)
    return logits, cache


def greedy(model, prompt: list[int], steps: int) -> tuple[np.ndarray, list[int]]:
    """Minimal greedy loop over the KV cache: prefill, then one token per call. Returns the prefill
    logits `[S, V]` and the generated ids."""
    n = len(prompt)
    cache = model.init_cache(1, n + steps)
    logits, cache = _step(model, jnp.asarray([prompt], jnp.int32), jnp.arange(n, dtype=jnp.int32)[None], cache)
    prefill = np.asarray(logits[0])
    out = [int(prefill[-1].argmax())]
    for t in range(steps - 1):
        logits, cache = _step(model, jnp.asarray([[out[-1]]], jnp.int32), jnp.asarray([[n + t]], jnp.int32), cache)
        out.append(int(np.asarray(logits[0, -1]).argmax()))
    return prefill, out


def test_smollm2_gguf_matches_transformers(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    path = hm.resolve("smollm2-135m-instruct")
    model, tok = hm.load("smollm2-135m-instruct", cache_dir=str(tmp_path))  # converts the tokenizer
    cached = hm.load_gguf_tokenizer(path, cache_dir=str(tmp_path))          # reads the converted copy
    assert model.config.family == "llama" and model.config.tie_embeddings and model.config.num_layers == 30
    messages = [{"role": "user", "content": "Write a haiku about the sea."}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert "<|im_start|>assistant" in prompt
    assert cached.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == prompt
    assert cached(prompt, add_special_tokens=False)["input_ids"] == ids
    assert (cached.eos_token_id, cached.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)

    prefill, ours = greedy(model, ids, NEW_TOKENS)

    torch.set_num_threads(2)
    hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                              dtype=torch.float32).eval()
    with torch.no_grad():
        x = torch.tensor([ids])
        ref = hf(x).logits[0].numpy()
        gen = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS, do_sample=False,
                          eos_token_id=None, pad_token_id=tok.pad_token_id)[0, len(ids):].tolist()
    assert np.abs(prefill - ref).max() / np.abs(ref).max() < 1e-3
    assert ours == gen, (tok.decode(ours), tok.decode(gen))
