"""The ``completions`` rollout (SFT's): one row per example holding its own answer (+ EOS) after
the policy prompt, logp_old its teacher-forced log-prob, cuts counted, bad input refused."""
import jax
import numpy as np
import pytest

from hindsight.rollout import collect, context_logprobs
from hindsight.sampling import SamplingParams
from hindsight.tasks import Example
from tests.rollout.helpers import ScriptedTask, configured

PARAMS = SamplingParams(max_new_tokens=8)


def test_rows_are_the_answers(model, tokenizer):
    exs = [Example(prompt="q0?", answer="abc", data=("one",)),
           Example(prompt="q1?", answer="a much longer answer", data=("zero",))]
    batch, stats = collect(configured("sft", group_size=1), model, tokenizer, ScriptedTask(), exs,
                           key=jax.random.key(0), sampling=PARAMS)
    eos = tokenizer.eos_token_id
    lengths = (batch["mask"] > 0).sum(1)
    np.testing.assert_array_equal(lengths, [4, 8])
    np.testing.assert_array_equal(batch["targets"][0, :4], tokenizer.encode("abc") + [eos])
    np.testing.assert_array_equal(batch["targets"][1], tokenizer.encode("a much longer answer")[:8])
    assert stats.truncated == 1 and stats.generated_tokens == [0, 0]
    np.testing.assert_array_equal(batch["rewards"], [1.0, 0.0])  # the task's verdicts on them
    mask = batch["mask"] > 0
    np.testing.assert_allclose(np.where(mask, context_logprobs(model, batch), 0),
                               batch["logp_old"], atol=1e-5)


def test_bad_input_is_refused(model, tokenizer):
    with pytest.raises(ValueError, match="example 0 has no completion"):
        collect(configured("sft", group_size=1), model, tokenizer, ScriptedTask(),
                [Example(prompt="q", answer=" ", data=("one",))], key=jax.random.key(0),
                sampling=PARAMS)
    with pytest.raises(ValueError, match="group_size must be 1"):
        collect(configured("sft", group_size=2), model, tokenizer, ScriptedTask(),
                [Example(prompt="q", answer="a", data=("one",))], key=jax.random.key(0),
                sampling=PARAMS)


def test_gkd_rows_come_from_the_student_the_dataset_or_the_teacher(model, tokenizer):
    from hindsight.testing import char_model
    exs = [Example(prompt="q0?", answer="abc", data=("one",))]
    run = lambda teacher=None, **kw: collect(
        configured("gkd", group_size=1, temperature=0.9, **kw), model, tokenizer, ScriptedTask(),
        exs, key=jax.random.key(0), sampling=SamplingParams(max_new_tokens=8, temperature=0.9),
        teacher_model=teacher)
    batch, stats = run(lmbda=0.0)
    assert stats.source == "dataset"
    np.testing.assert_array_equal(batch["targets"][0, :3], tokenizer.encode("abc"))
    _, stats = run(lmbda=1.0)
    assert stats.source == "on_policy" and stats.generated_tokens[0] > 0
    teacher = char_model(1)
    batch, stats = run(teacher, lmbda=0.0, seq_kd=True)
    assert stats.source == "teacher"
    mask = batch["mask"] > 0  # the teacher's sample: its own log-probs, not the student's
    np.testing.assert_allclose(np.where(mask, context_logprobs(teacher, batch, temperature=0.9),
                                        0), batch["logp_old"], atol=1e-5)
    with pytest.raises(ValueError, match="seq_kd=True samples from the teacher"):
        run(lmbda=0.0, seq_kd=True)
