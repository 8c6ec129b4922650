"""Continuous batching gives exactly what `generate` and `branch` give, whatever the slot schedule."""
import jax
import numpy as np
import pytest

from hindsight.sampling import SamplingParams, branch, generate
from hindsight.sampling.engine import Engine

PARAMS = SamplingParams(max_new_tokens=20, stop_tokens=(3,))
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10]]


def test_engine_matches_generate_and_branch(tiny):
    keys = jax.random.split(jax.random.key(1), 9)
    bkeys = jax.random.split(jax.random.key(5), 3)
    ref = generate(tiny, PROMPTS, PARAMS, num_samples=3, row_keys=keys, max_len=64)
    # 4 slots < 9 rows + 9 continuations: rows of different prompts and branches share the batch
    engine = Engine(tiny, PARAMS, slots=4, max_len=64, chunk_steps=4)
    for i, p in enumerate(PROMPTS):
        engine.submit(p, num_samples=3, row_keys=keys[3 * i: 3 * i + 3], keep_cache=True, tag=i)

    def on_result(tag, res):
        if isinstance(tag, int):
            engine.submit_branch(res, [0, 1], [min(2, res.lengths[0] - 1), 0], [2, 1], row_keys=bkeys,
                                 tag=("b", tag))

    out = engine.run(on_result)
    assert engine.idle and len(out) == 6
    for i in range(3):
        rows = slice(3 * i, 3 * i + 3)
        np.testing.assert_array_equal(out[i].tokens, ref.tokens[rows])
        np.testing.assert_allclose(out[i].logprobs, ref.logprobs[rows], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(out[i].lengths, ref.lengths[rows])
        expect = branch(tiny, ref, [3 * i, 3 * i + 1], [min(2, ref.lengths[3 * i] - 1), 0], [2, 1], row_keys=bkeys)
        got = out[("b", i)]
        np.testing.assert_array_equal(got.tokens, expect.tokens)
        np.testing.assert_array_equal(got.branch_positions, expect.branch_positions)
        np.testing.assert_allclose(got.policy_logprobs, expect.policy_logprobs, rtol=1e-5, atol=1e-6)


def test_prompts_prefilled_in_power_of_two_batches_without_padding_rows(tiny):
    """Three prompts placed at once prefill as 2 + 1 (not padded to 4) and sample what `generate`
    samples."""
    keys = jax.random.split(jax.random.key(2), 9)
    ref = generate(tiny, PROMPTS, PARAMS, num_samples=3, row_keys=keys, max_len=64)
    engine = Engine(tiny, PARAMS, slots=16, max_len=64)
    for i, p in enumerate(PROMPTS):
        engine.submit(p, num_samples=3, row_keys=keys[3 * i: 3 * i + 3], tag=i)
    out = engine.run()
    assert engine.stats["prefills"] == 2
    assert engine.stats["row_steps"] == int((ref.lengths).sum())  # one decoded token per row-step
    for i in range(3):
        np.testing.assert_array_equal(out[i].tokens, ref.tokens[3 * i: 3 * i + 3])
        np.testing.assert_allclose(out[i].policy_logprobs, ref.policy_logprobs[3 * i: 3 * i + 3],
                                   rtol=1e-5, atol=1e-6)


def test_engine_rejects_bad_input(tiny):
    engine = Engine(tiny, PARAMS, slots=2, max_len=32)
    with pytest.raises(ValueError, match="exceeds the engine's max_len"):
        engine.submit(list(range(1, 20)))
    with pytest.raises(ValueError, match="empty"):
        engine.submit([])
    with pytest.raises(ValueError, match="unknown stop token"):
        engine.submit([1, 2], stop_tokens=[96])
    engine.submit([1, 2], tag="x")
    res = engine.run()["x"]
    with pytest.raises(ValueError, match="keep_cache"):
        engine.submit_branch(res, [0], [1])
