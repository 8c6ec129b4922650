"""Greedy decoding equals HF transformers `generate`; group fan-out and per-row RNG streams."""
import jax
import numpy as np
import pytest

from hindsight.models import load_hf_folder
from hindsight.sampling import SamplingParams, generate

from .conftest import HF_CASES


def hf_greedy(torch_model, prompt, n_new):
    import torch

    with torch.no_grad():
        out = torch_model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                   max_new_tokens=n_new, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].numpy()


@pytest.mark.parametrize("family", list(HF_CASES))
def test_greedy_equals_hf_generate(hf_checkpoints, family):
    folder, torch_model = hf_checkpoints[family]
    model = load_hf_folder(folder)
    prompts = [[5, 17, 99, 3, 42, 8, 71], [11, 2, 64]]
    out = generate(model, prompts, SamplingParams(temperature=0.0, max_new_tokens=24))
    for i, prompt in enumerate(prompts):
        np.testing.assert_array_equal(out.tokens[i], hf_greedy(torch_model, prompt, 24))
    assert out.lengths.tolist() == [24, 24] and out.mask.all()


@pytest.mark.slow
def test_greedy_equals_hf_generate_smollm2():
    import os

    import torch
    import transformers
    from hindsight.models import load, resolve

    model, tok = load("smollm2-135m-instruct")
    path = resolve("smollm2-135m-instruct")
    kw = dict(gguf_file=os.path.basename(path)) if path.endswith(".gguf") else {}
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path) if kw else path, dtype=torch.float32, **kw).eval()
    prompt = tok("The capital of France is a city that")["input_ids"]
    ours = generate(model, [prompt], SamplingParams(temperature=0.0, max_new_tokens=32))
    np.testing.assert_array_equal(ours.tokens[0], hf_greedy(hf, prompt, 32))


def test_group_rows_share_prompt_and_differ(tiny):
    out = generate(tiny, [[1, 2, 3], [4, 5]], SamplingParams(max_new_tokens=12), num_samples=4,
                   key=jax.random.key(0))
    assert out.tokens.shape == (8, 12)
    assert out.prompt_lengths.tolist() == [3] * 4 + [2] * 4
    assert len({tuple(t) for t in out.tokens[:4]}) > 1
    np.testing.assert_array_equal(out.sequence(5)[:2], [4, 5])


def test_row_draws_do_not_depend_on_batch_neighbours(tiny):
    """A row's tokens depend only on its key and prompt: alone or among other rows, same output."""
    params = SamplingParams(max_new_tokens=16, top_k=20, top_p=0.9)
    keys = jax.random.split(jax.random.key(4), 6)
    batch = generate(tiny, [[7, 8, 9], [1, 2], [3]], params, num_samples=2, row_keys=keys, max_len=64)
    alone = generate(tiny, [[1, 2]], params, row_keys=keys[3:4], max_len=64)
    np.testing.assert_array_equal(alone.tokens[0], batch.tokens[3])
    np.testing.assert_allclose(alone.logprobs[0], batch.logprobs[3], rtol=1e-5, atol=1e-6)


def test_stop_tokens_per_row_and_max_new(tiny):
    params = SamplingParams(max_new_tokens=20)
    keys = jax.random.split(jax.random.key(1), 2)
    free = generate(tiny, [[1, 2, 3]], params, num_samples=2, row_keys=keys, max_len=64)
    stop0 = int(free.tokens[0, 5])
    first = int(np.nonzero(free.tokens[0] == stop0)[0][0])
    out = generate(tiny, [[1, 2, 3]], params, num_samples=2, row_keys=keys, max_len=64,
                   stop_tokens=[[stop0], []], max_new_tokens=[20, 7])
    assert out.lengths[0] == first + 1 and out.stopped[0]
    np.testing.assert_array_equal(out.tokens[0, : first + 1], free.tokens[0, : first + 1])
    assert out.tokens[0, first + 1:].sum() == 0 and not out.mask[0, first + 1:].any()
    assert out.lengths[1] == 7 and not out.stopped[1]
    np.testing.assert_array_equal(out.tokens[1, :7], free.tokens[1, :7])
    np.testing.assert_allclose(out.policy_logprobs[1, :7], free.policy_logprobs[1, :7], rtol=1e-5)


def test_end_to_end_first_token_distribution(tiny):
    """4096 rows from one prompt: the first token's empirical distribution matches the model's
    top-k/temperature-truncated next-token distribution (total variation)."""
    import jax.numpy as jnp

    params = SamplingParams(temperature=0.8, top_k=10, max_new_tokens=1)
    prompt = [4, 9, 2]
    out = generate(tiny, [prompt], params, num_samples=4096, key=jax.random.key(9))
    logits = np.asarray(tiny(jnp.asarray([prompt]), jnp.arange(3)[None])[0])[0, -1].astype(np.float64) / 0.8
    kth = np.sort(logits)[::-1][9]
    p = np.where(logits >= kth, np.exp(logits - logits.max()), 0.0)
    p /= p.sum()
    freq = np.bincount(out.tokens[:, 0], minlength=p.size) / 4096
    assert 0.5 * np.abs(freq - p).sum() < 0.04
    np.testing.assert_allclose(out.logprobs[:, 0], np.log(p[out.tokens[:, 0]]), rtol=1e-4, atol=1e-5)
