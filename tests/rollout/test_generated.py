"""Generated context parts (SEED's skills, :mod:`hindsight.rollout.generated`): the rule that
picks a group's row and turn; one skill per group written in the rollout's engine by continuing
that row's cached conversation, capped, keyed by the group's number; the teacher context
question + skill, rows of a group without one masked; and SEED's stage-1 data (the skills kept by
their context gain, trained after the conversation that asked for them)."""
import dataclasses
import math

import jax
import numpy as np
import pytest

from hindsight.rollout import GenerationOptions, GroupView, PartWriter, RolloutConfig, collect
from hindsight.rollout.completions import generated_completions, useful
from hindsight.rollout.generated import GENERATORS, context_gain
from hindsight.rollout.group import sample_groups
from hindsight.rollout.prompts import Templates, followup_turn
from hindsight.rollout.verification import Verifier
from hindsight.sampling import SamplingParams
from hindsight.sampling.text import encode_prompt
from hindsight.tasks import Example
from tests.rollout.helpers import ScriptedTask, configured, examples

STOPS = tuple(range(100, 128))  # a quarter of the ids end a row: most rows finish in 16 tokens
PARAMS = SamplingParams(max_new_tokens=16, stop_tokens=STOPS)
CAP = 2  # the random model's skills often end sooner: some end, some are cut


def _view(rewards, feedback):
    return GroupView(example=Example(prompt="q?", answer="a"), texts=[""] * len(rewards),
                     rewards=np.asarray(rewards, np.float32), feedback=feedback,
                     templates=Templates(), rng=np.random.default_rng(0))


def test_the_skill_rule_picks_the_first_finished_success_and_quotes_a_failure():
    request = GENERATORS.get("skill").request
    t = Templates()
    fb = ["verified correct", "wrong: 3", "wrong: 5", "verified correct"]
    got = request(_view([1, 0, 0, 1], fb), np.array([False, False, True, True]))
    assert got.row == 3  # row 0 succeeded but did not finish
    assert got.user == t.skill_request.format(verdict=t.skill_contrast.format(feedback="wrong: 5"))
    got = request(_view([1, 0, 0, 1], fb), np.array([True, False, False, True]))
    assert got.row == 0 and got.user == t.skill_request.format(verdict=t.skill_correct)
    got = request(_view([0, 0, 0, 1], fb), np.array([False, True, True, False]))
    assert got.row == 1
    assert got.user == t.skill_request.format(verdict=t.skill_failed.format(feedback="wrong: 3"))
    assert request(_view([1, 0, 0, 1], fb), np.zeros(4, bool)) is None


def _sample(model, tokenizer, kinds, *, first_index=0, params=PARAMS, cap=CAP, key=0):
    task = ScriptedTask()
    writer = PartWriter(tokenizer, ("skill",), params=params, key=jax.random.key(key),
                        options=GenerationOptions(max_tokens=cap), first_index=first_index)
    with Verifier(task, tokenizer, workers=0) as verifier:
        return sample_groups(model, tokenizer, verifier, examples(*kinds)[first_index:],
                             key=jax.random.key(key), params=params, group_size=4,
                             first_index=first_index, writer=writer)


def test_one_skill_per_group_continues_its_rows_cached_conversation(model, tokenizer):
    groups = _sample(model, tokenizer, ("one", "zero", "one"))
    request = GENERATORS.get("skill").request
    for g in groups:
        skill = g.generated["skill"]
        done = (g.lengths < 16) | np.isin(g.tokens[np.arange(4), g.lengths - 1], STOPS)
        want = request(GroupView(example=g.example, texts=g.texts, rewards=g.rewards,
                                 feedback=g.feedback, templates=Templates(),
                                 rng=np.random.default_rng(0)), done)
        assert skill.row == want.row
        # the conversation: the policy prompt, the row's own answer, then the request turn
        turn = followup_turn(tokenizer, want.user)
        n = int(g.lengths[skill.row])
        np.testing.assert_array_equal(skill.prompt, np.concatenate(
            [g.prompt, g.tokens[skill.row, :n], turn]))
        assert 1 <= len(skill.tokens) <= CAP
        assert skill.finished == bool(skill.tokens[-1] in STOPS)
        assert skill.text == tokenizer.decode(list(skill.tokens), skip_special_tokens=True).strip()
    assert any(not g.generated["skill"].finished for g in groups)  # the cap cuts


def test_a_groups_skill_does_not_depend_on_its_batch(model, tokenizer):
    together = _sample(model, tokenizer, ("one", "zero"))
    alone = _sample(model, tokenizer, ("one", "zero"), first_index=1)
    np.testing.assert_array_equal(alone[0].generated["skill"].tokens,
                                  together[1].generated["skill"].tokens)


def test_the_rollout_builds_question_plus_skill_and_masks_groups_without_one(model, tokenizer):
    method = configured("seed", group_size=4)
    kinds = ("mixed", "zero", "one")
    batch, stats = collect(method, model, tokenizer, ScriptedTask(), examples(*kinds),
                           key=jax.random.key(0), sampling=PARAMS,
                           rollout=RolloutConfig(generated=GenerationOptions(max_tokens=CAP)))
    t = Templates()
    assert len(stats.generated_texts) == 3 and stats.engines["main"]["extends"] == 3
    skills = [text.removeprefix("skill: ") for text in stats.generated_texts]
    assert stats.phase_tokens["generated"] <= 3 * CAP
    np.testing.assert_array_equal(batch["teacher_row_mask"], np.ones(12))
    for b in range(12):
        ex, skill = examples(*kinds)[b // 4], skills[b // 4]
        want = encode_prompt(tokenizer, t.instruction.format(
            question=ex.prompt, passages=t.skill_part.format(skill=skill)))
        n = len(want)
        np.testing.assert_array_equal(batch["teacher_tokens"][b, :n], want)
        length = int((batch["mask"][b] > 0).sum())
        np.testing.assert_array_equal(batch["teacher_tokens"][b, n:n + length],
                                      batch["targets"][b, :length])

    # rarely a stop token: groups with a finished row get a skill, the others' rows no context
    rare = SamplingParams(max_new_tokens=16, stop_tokens=(101,))
    batch, stats = collect(method, model, tokenizer, ScriptedTask(), examples(*kinds, "mixed"),
                           key=jax.random.key(1), sampling=rare,
                           rollout=RolloutConfig(generated=GenerationOptions(max_tokens=4)))
    lengths = (batch["mask"] > 0).sum(1)
    last = batch["targets"][np.arange(16), np.maximum(lengths - 1, 0)]
    done = ((lengths < 16) | np.isin(last, (101, tokenizer.eos_token_id))).reshape(4, 4)
    assert done.any(1).tolist() == [True, False, False, False]  # key 1: one group finishes
    np.testing.assert_array_equal(batch["teacher_row_mask"], np.repeat(done.any(1), 4))
    assert len(stats.generated_texts) == 1 and stats.engines["main"]["extends"] == 1


def test_usefulness_rule():
    assert useful(0.2) and not useful(0.0) and not useful(-0.1) and not useful(math.nan)


def _direct_gain(model, tokenizer, group, temperature):
    """Float64 from the decoder's logits on each whole sequence (right-padded: causal attention
    leaves the real positions alone), every sequence of the group in one forward pass."""
    t = Templates()
    if not group.generated["skill"].text:  # an empty skill is no skill
        return math.nan
    context = encode_prompt(tokenizer, t.instruction.format(
        question=group.example.prompt,
        passages=t.skill_part.format(skill=group.generated["skill"].text)))
    wins = [group.tokens[r, :group.lengths[r]] for r in np.flatnonzero(group.rewards >= 0.5)]
    if not wins:
        return math.nan
    pairs = [(ctx, y) for y in wins for ctx in (context, group.prompt)]
    width = max(len(c) + len(y) for c, y in pairs)
    seqs = np.zeros((len(pairs), width), np.int32)
    for i, (c, y) in enumerate(pairs):
        seqs[i, :len(c) + len(y)] = np.concatenate([c, y])
    logits, _ = model(seqs, np.broadcast_to(np.arange(width, dtype=np.int32), seqs.shape))
    logp = []
    for i, (c, y) in enumerate(pairs):
        z = np.asarray(logits[i], np.float64)[len(c) - 1:len(c) + len(y) - 1] / temperature
        z = z - z.max(-1, keepdims=True)
        logp.append((z - np.log(np.exp(z).sum(-1, keepdims=True)))[np.arange(len(y)), y])
    return np.concatenate([a - b for a, b in zip(logp[0::2], logp[1::2])]).mean()


def test_context_gain_against_direct_scoring(model, tokenizer):
    """The question side comes from the sampler's recorded log-probs (at the sampling
    temperature, 0.8 here), the context side from a teacher-forced score: both against one
    float64 forward pass over the whole sequences."""
    groups = _sample(model, tokenizer, ("one", "zero", "one"),
                     params=dataclasses.replace(PARAMS, temperature=0.8))
    gains = context_gain(model, tokenizer, groups, "skill", temperature=0.8)
    assert math.isnan(gains[1])  # no success to score the skill on
    assert np.isfinite(gains).sum() >= 1
    for g, gain in zip(groups, gains):
        want = _direct_gain(model, tokenizer, g, 0.8)
        if math.isnan(want):
            assert math.isnan(gain)
        else:
            np.testing.assert_allclose(gain, want, rtol=1e-4, atol=1e-5)


def test_stage_one_rows_are_the_kept_skills_after_their_conversations(model, tokenizer):
    kinds = ("one",) * 6 + ("zero",)  # key 1: some skills end and help, some not
    groups = _sample(model, tokenizer, kinds, key=1)
    gains = context_gain(model, tokenizer, groups, "skill", temperature=PARAMS.policy_temperature)
    with Verifier(ScriptedTask(), tokenizer, workers=0) as verifier:
        rows, selection = generated_completions(
            model, tokenizer, verifier, examples(*kinds), key=jax.random.key(1), params=PARAMS,
            num_samples=4, part="skill", options=GenerationOptions(max_tokens=CAP))
    kept = [g.generated["skill"].finished and gain > 0 for g, gain in zip(groups, gains)]
    assert any(kept) and not all(kept), (gains, kept)
    assert selection.kept_fraction == sum(kept) / len(kinds)
    for g, row, keep in zip(groups, rows, kept):
        skill = g.generated["skill"]
        np.testing.assert_array_equal(row.prompt, skill.prompt)
        np.testing.assert_array_equal(row.generated["skill"].tokens, skill.tokens)
        if keep:
            n = len(skill.tokens)
            np.testing.assert_array_equal(row.tokens[0, :n], skill.tokens)
            assert row.loss_mask[0].sum() == n and row.texts == [skill.text]
        else:
            assert row.loss_mask[0].sum() == 0
        assert row.rewards[0] == pytest.approx(g.rewards.mean())
    with pytest.raises(ValueError, match="generated_max_tokens=20 exceeds.*max_new_tokens=16"):
        generated_completions(model, tokenizer, None, examples("one"), key=jax.random.key(0),
                              params=PARAMS, num_samples=2, part="skill",
                              options=GenerationOptions(max_tokens=20))


def test_generated_completions_options_are_checked_before_anything_runs():
    from hindsight.rollout.collect import check_contexts
    sft = lambda **kw: configured("sft", group_size=1, completions="generated", **kw)
    check_contexts(sft(select="useful"))
    with pytest.raises(ValueError, match="select='shortest' is no selection rule of generated"):
        check_contexts(sft(select="shortest"))
    with pytest.raises(ValueError, match="generated_part='hint' is no generated context part"):
        check_contexts(sft(select="useful", generated_part="hint"))
    check_contexts(configured("hsd", group_size=4, teacher_context=("skill|feedback",)))
