"""GRPO groups: advantages of the verified rewards, and `target_index` alignment of the policy
context and of every extra context (teacher-forcing the batch reproduces the sampler's log-probs /
scoring the concatenated sequence directly)."""
import jax
import numpy as np

from hindsight.batch import check_batch
from hindsight.methods import get_method
from hindsight.objectives import group_advantages
from hindsight.rollout import RolloutConfig, collect, context_logprobs, probe_context, \
    teacher_context
from hindsight.sampling import SamplingParams, score_logprobs
from tests.rollout.helpers import ScriptedTask, configured, examples

PARAMS = SamplingParams(max_new_tokens=16)


def test_grpo_group_batch_alignment_and_advantages(model, tokenizer):
    task = ScriptedTask()
    exs = examples("mixed", "one")
    batch, stats = collect(configured("grpo", group_size=4), model, tokenizer, task, exs,
                           key=jax.random.key(0), sampling=PARAMS)
    b, t = check_batch(batch, method="grpo", fields=("logp_old", "advantages", "rewards"))
    assert (b, t) == (8, 16)
    np.testing.assert_array_equal(batch["rewards"], [1, 0, 1, 0, 1, 1, 1, 1])
    np.testing.assert_allclose(batch["advantages"], group_advantages(batch["rewards"], 4))
    mask = batch["mask"] > 0
    lengths = mask.sum(1)
    # policy context: teacher forcing `tokens` and gathering at `target_index` gives logp_old
    lp = context_logprobs(model, batch)
    np.testing.assert_allclose(np.where(mask, lp, 0), batch["logp_old"], atol=1e-5)
    for i in range(b):  # the targets follow the prompt verbatim
        n = int(batch["target_index"][i, 0]) + 1
        np.testing.assert_array_equal(batch["tokens"][i, n:n + lengths[i]],
                                      batch["targets"][i, :lengths[i]])
    assert stats.generated_tokens == [int(lengths[:4].sum()), int(lengths[4:].sum())]
    assert stats.reward_mean == 0.75 and stats.num_groups == 2 and stats.group_size == 4
    assert set(stats.seconds) >= {"roots", "verify", "total"}


def test_logp_old_is_the_untruncated_policy_at_the_sampling_temperature(model, tokenizer):
    """With temperature and min-p/top-k truncation, ``logp_old`` is what the trainer computes at loss
    temperature T on the same weights (ratio exactly 1 before the first update), not the
    truncated distribution's log-prob (larger: truncation renormalises onto fewer tokens)."""
    params = SamplingParams(max_new_tokens=16, temperature=0.7, min_p=0.2, top_k=20)
    batch, _ = collect(configured("grpo", group_size=4, temperature=0.7), model, tokenizer,
                       ScriptedTask(), examples("mixed", "one"), key=jax.random.key(1),
                       sampling=params)
    mask = batch["mask"] > 0
    np.testing.assert_allclose(np.where(mask, context_logprobs(model, batch, temperature=0.7), 0),
                               batch["logp_old"], atol=1e-5)
    assert not np.allclose(np.where(mask, context_logprobs(model, batch), 0), batch["logp_old"],
                           atol=1e-3)


def test_extra_contexts_match_direct_scoring(model, tokenizer):
    exs = examples("mixed", "zero")
    batch, _ = collect(configured("opsd_pmi", group_size=2), model, tokenizer, ScriptedTask(),
                       exs, key=jax.random.key(1), sampling=PARAMS)
    method = get_method("opsd_pmi")
    check_batch(batch, method="opsd_pmi", contexts=method.contexts, fields=method.fields)
    lengths = (batch["mask"] > 0).sum(1)
    responses = [batch["targets"][i, :n] for i, n in enumerate(lengths)]
    for name, build in (("teacher", teacher_context), ("probe", probe_context)):
        ctx = [build(tokenizer, exs[i // 2]) for i in range(4)]
        ref = np.asarray(score_logprobs(model, ctx, responses))
        got = context_logprobs(model, batch, name)
        for i, n in enumerate(lengths):
            np.testing.assert_allclose(got[i, :n], ref[i, :n], atol=1e-5)
            k = batch[f"{name}_target_index"][i, 0] + 1
            np.testing.assert_array_equal(batch[f"{name}_tokens"][i, :k], ctx[i])
