"""The ``completions`` rollout (SFT's): one row per example holding its own answer (+ EOS) after
the policy prompt, logp_old its teacher-forced log-prob, cuts counted, bad input refused; or
(``completions="policy"``, BIRD's stage 1) the policy's own samples drawn after the concise
prompt, the shortest correct one kept and trained after the plain question."""
import jax
import numpy as np
import pytest

from hindsight.rollout import collect, context_logprobs, teacher_context
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


def test_selection_keeps_the_shortest_correct_sample():
    """``shortest`` (BIRD, OUR CHOICE): among rows with reward >= 0.5 the fewest tokens, the first
    of equal ones; ``first``: the first correct in sampling order; no correct row: None."""
    from hindsight.rollout.completions import SELECTIONS
    rewards, lengths = np.array([0.0, 1.0, 0.5, 1.0, 0.2]), np.array([2, 9, 5, 5, 1])
    assert SELECTIONS["shortest"](rewards, lengths) == 2  # 5 tokens, before row 3's 5
    assert SELECTIONS["first"](rewards, lengths) == 1
    assert SELECTIONS["shortest"](rewards, lengths, threshold=0.9) == 3
    for rule in SELECTIONS.values():
        assert rule(np.array([0.0, 0.4]), np.array([3, 1])) is None


def _group(example, prompt, rows, rewards, width):
    """A hand-built sampled group: ``rows`` token-id lists (as drawn after ``prompt``)."""
    from hindsight.rollout import GroupRows
    g = len(rows)
    tokens = np.zeros((g, width), np.int32)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = r
    lengths = np.array([len(r) for r in rows], np.int32)
    mask = np.arange(width)[None] < lengths[:, None]
    return GroupRows(example=example, example_index=0, prompt=np.asarray(prompt, np.int32),
                     tokens=tokens, lengths=lengths, logprobs=np.zeros((g, width), np.float32),
                     policy_logprobs=np.zeros((g, width), np.float32), loss_mask=mask,
                     rewards=np.asarray(rewards, np.float32),
                     branch_positions=np.zeros(g, np.int32), texts=[f"t{i}" for i in range(g)],
                     generated_tokens=int(lengths.sum()),
                     feedback=["verified correct" if r >= 0.5 else "wrong" for r in rewards])


def test_kept_sample_is_trained_after_the_plain_question(model, tokenizer):
    """The prompt switch on a hand-built group drawn after the concise prompt: the kept row is the
    shortest correct sample, its prompt the plain question's tokens, its ``logp_old`` the
    teacher-forced log-prob after the plain question (not after the concise prompt); a group
    with no correct sample keeps a row of length 0, loss mask 0, reward 0."""
    from hindsight.rollout.completions import NO_SAMPLE_FEEDBACK, keep_samples
    from hindsight.rollout.prompts import policy_prompt
    from hindsight.sampling import score_logprobs
    ex = Example(prompt="q0?", answer="a0", data=("one",))
    plain = policy_prompt(tokenizer, ex)
    concise = teacher_context(tokenizer, ex, recipe=("concise",))
    assert concise != plain
    rows = [[5, 6, 7, 8], [9, 10, 11, 12, 13], [14, 15], [16, 17, 18]]
    sampled = [_group(ex, concise, rows, [1, 0, 0, 1], width=8),
               _group(ex, concise, rows, [0, 0, 0, 0], width=8)]
    groups, selection = keep_samples(model, sampled, [plain, plain], select="shortest",
                                     params=PARAMS)
    kept, empty = groups
    np.testing.assert_array_equal(kept.prompt, plain)
    np.testing.assert_array_equal(kept.tokens[0, :3], rows[3])
    assert kept.lengths.tolist() == [3] and kept.loss_mask[0].tolist() == [True] * 3 + [False] * 5
    assert kept.rewards.tolist() == [1.0] and kept.texts == ["t3"]
    assert kept.generated_tokens == 14  # every sample drawn for the question
    ref = np.asarray(score_logprobs(model, [plain], [rows[3]]))[0]
    np.testing.assert_allclose(kept.policy_logprobs[0, :3], ref, atol=1e-5)
    under_concise = np.asarray(score_logprobs(model, [concise], [rows[3]]))[0]
    assert not np.allclose(kept.policy_logprobs[0, :3], under_concise, atol=1e-3)
    assert empty.lengths.tolist() == [0] and not empty.loss_mask.any()
    assert empty.rewards.tolist() == [0.0] and empty.feedback == [NO_SAMPLE_FEEDBACK]
    assert selection.kept_fraction == 0.5 and selection.kept_length == 3.0
    assert selection.sampled_length == 3.5 and selection.sampled_reward == 0.25
    _, nothing = keep_samples(model, sampled[1:], [plain], select="shortest", params=PARAMS)
    assert nothing.kept_fraction == 0.0 and np.isnan(nothing.kept_length)
    # without the switch the row stays after the prompt it was sampled under
    groups, _ = keep_samples(model, sampled[:1], [concise], select="first", params=PARAMS)
    np.testing.assert_array_equal(groups[0].prompt, concise)
    np.testing.assert_array_equal(groups[0].tokens[0, :4], rows[0])


def test_a_sample_cut_at_the_cap_is_never_kept(model, tokenizer):
    """``finished_only`` (OUR CHOICE): a correct row that ran to the response width without a stop
    token is passed over (its question keeps another, or none); one ending on a stop token at the
    width is finished; ``finished_only=False`` keeps the cut row."""
    from hindsight.rollout.completions import finished, keep_samples
    ex = Example(prompt="q0?", answer="a0", data=("one",))
    prompt = teacher_context(tokenizer, ex, recipe=("concise",))
    cut, ended, short = list(range(5, 13)), list(range(5, 12)) + [3], [5, 6, 7]
    group = _group(ex, prompt, [cut, ended, short], [1, 1, 0], width=8)
    np.testing.assert_array_equal(finished(group, (3,)), [False, True, True])
    params = SamplingParams(max_new_tokens=8, stop_tokens=(3,))
    (row,), _ = keep_samples(model, [group], [prompt], select="first", params=params)
    np.testing.assert_array_equal(row.tokens[0], ended)
    alone = _group(ex, prompt, [cut, short], [1, 0], width=8)
    (row,), selection = keep_samples(model, [alone], [prompt], select="first", params=params)
    assert row.lengths.tolist() == [0] and selection.kept_fraction == 0.0
    (row,), _ = keep_samples(model, [alone], [prompt], select="first", params=params,
                             finished_only=False)
    np.testing.assert_array_equal(row.tokens[0], cut)


def test_policy_completions_through_collect(model, tokenizer):
    """SFT with ``completions="policy"``: the rows are the samples drawn after the concise prompt
    (the same draws as sampling that prompt directly), filtered and switched to the plain
    question in the batch's policy context; a question with no correct sample is a masked row."""
    from hindsight.rollout.group import sample_groups
    from hindsight.rollout.prompts import policy_prompt
    from hindsight.rollout.runtime import with_eos
    from hindsight.rollout.verification import Verifier
    exs = [Example(prompt="q0?", answer="a0", data=("mixed",)),
           Example(prompt="q1?", answer="a1", data=("zero",))]
    # the random model seldom ends within 8 tokens: cut samples may be kept here
    method = configured("sft", group_size=1, completions="policy", num_samples=4,
                        sample_context=("concise",), finished_only=False)
    key = jax.random.key(3)
    batch, stats = collect(method, model, tokenizer, ScriptedTask(), exs, key=key,
                           sampling=PARAMS)
    concise = [teacher_context(tokenizer, ex, recipe=("concise",)) for ex in exs]
    with Verifier(ScriptedTask(), tokenizer, workers=0) as verifier:
        drawn = sample_groups(model, tokenizer, verifier, exs, key=key, group_size=4,
                              params=with_eos(PARAMS, tokenizer), prompts=concise)
    g = drawn[0]
    correct = np.flatnonzero(g.rewards >= 0.5)
    best = correct[np.argmin(g.lengths[correct])]
    n = int(g.lengths[best])
    assert (batch["mask"] > 0).sum(1).tolist() == [n, 0]
    np.testing.assert_array_equal(batch["targets"][0, :n], g.tokens[best, :n])
    plain = policy_prompt(tokenizer, exs[0])
    np.testing.assert_array_equal(batch["tokens"][0, :len(plain)], plain)
    assert batch["target_index"][0, 0] == len(plain) - 1
    np.testing.assert_array_equal(batch["rewards"], [1.0, 0.0])
    mask = batch["mask"] > 0
    np.testing.assert_allclose(np.where(mask, context_logprobs(model, batch), 0),
                               batch["logp_old"], atol=1e-5)
    assert stats.selection == dict(kept_fraction=0.5, kept_length=float(n),
                                   sampled_length=float(np.mean([d.lengths for d in drawn])),
                                   sampled_reward=0.25)
    assert stats.generated_tokens == [int(d.lengths.sum()) for d in drawn]


def test_policy_completion_options_are_checked():
    from hindsight.methods import get_method
    from hindsight.rollout.collect import check_contexts
    sft = get_method("sft")
    for bad, match in ((dict(completions="web"), "completions"),
                       (dict(num_samples=0), "num_samples"),
                       (dict(sample_context="concise"), "sample_context"),
                       (dict(prompt_switch=1), "prompt_switch"),
                       (dict(finished_only="yes"), "finished_only")):
        with pytest.raises(ValueError, match=match):
            sft.make_config(**bad)
    with pytest.raises(ValueError, match=r"method_config.sample_context.*\['feedback'\]"):
        check_contexts(configured("sft", group_size=1, completions="policy",
                                  sample_context=("feedback",)))
    with pytest.raises(ValueError, match="method_config.select='longest'"):
        check_contexts(configured("sft", group_size=1, completions="policy", select="longest"))
