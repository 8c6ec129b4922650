"""Counterfactual recoverability's rollout (spec other-methods §10): the labels on the spec's
numbers, the error position against a float64 reference, the budget-matched arms, the batch
layout per label, and the rollout on the tiny model: the continue arm keeps the erroneous token,
the rollback arm resamples it, each branch being exactly the teacher's sample under its context,
token by token."""
import jax
import numpy as np
import pytest

from hindsight.batch import check_batch
from hindsight.rollout import GroupRows, RolloutConfig, Templates, collect, teacher_context
from hindsight.rollout.recoverability import (Arm, StateInfo, arms, choose_states,
                                              error_positions, group_rows, label_states,
                                              sample_recoverability)
from hindsight.rollout.runtime import make_engine, request_key, with_eos
from hindsight.rollout.verification import Verifier
from hindsight.sampling import SamplingParams, score_logprobs
from hindsight.tasks import Example
from tests.rollout.helpers import ScriptedTask, configured, examples

WIDTH = 24


def test_labels_on_the_spec_numbers():
    config = configured("recoverability", group_size=4).config
    p_cont, p_roll = np.array([0.6, 0.2, 0.4, 0.1]), np.array([0.1, 0.7, 0.6, 0.3])
    # recoverable, irreversible-but-avoidable, ambiguous, ambiguous
    np.testing.assert_array_equal(label_states(p_cont, p_roll, config), [1, 2, 0, 0])
    # inclusive thresholds: p_cont = 0.5 is recoverable, 0.25 with p_roll = 0.5 irreversible
    np.testing.assert_array_equal(label_states(np.array([0.5, 0.25]), np.array([0.0, 0.5]),
                                               config), [1, 2])


def _reference_positions(ls, lt, lengths, eligible, head, tail):
    """Float64 loop: the largest l_S - l_T over the eligible window with a positive gap."""
    out = []
    for b in range(ls.shape[0]):
        best, pos = 0.0, -1
        for t in range(head, int(lengths[b]) - tail):
            d = float(np.float64(ls[b, t]) - np.float64(lt[b, t]))
            if eligible[b, t] and d > 0 and d > best:
                best, pos = d, t
        out.append(pos)
    return np.array(out)


def test_error_position_matches_a_float64_reference():
    rng = np.random.default_rng(0)
    n, t = 7, 16
    ls = np.log(rng.uniform(0.01, 1.0, (n, t))).astype(np.float32)
    lt = np.log(rng.uniform(0.01, 1.0, (n, t))).astype(np.float32)
    lengths = np.array([16, 9, 0, 1, 5, 12, 16])
    lt[5] = ls[5] + 0.5        # the teacher prefers every token: no error state
    ls[6, 0] = lt[6, 0] + 9.0  # the largest gaps at t = 0 and inside the tail guard: excluded
    ls[6, 15] = lt[6, 15] + 9.0
    eligible = rng.uniform(size=(n, t)) > 0.2
    eligible[1, 3] = False
    ls[1, 3] = lt[1, 3] + 9.0  # a stop token (ineligible), however large its gap
    for b, m in enumerate(lengths):  # garbage past the lengths
        ls[b, m:], lt[b, m:] = np.nan, -np.inf
    got, delta = error_positions(ls, lt, lengths, eligible, head_guard=1, tail_guard=2)
    want = _reference_positions(ls, lt, lengths, eligible, 1, 2)
    np.testing.assert_array_equal(got, want)
    assert got[2] == got[3] == got[5] == -1 and got[1] != 3 and got[6] not in (0, 15)
    assert (got >= 0).sum() >= 3
    assert np.all(np.isfinite(delta)) and np.all(delta[2] == 0)
    got, _ = error_positions(ls, lt, lengths, eligible, head_guard=4, tail_guard=2)
    np.testing.assert_array_equal(got, _reference_positions(ls, lt, lengths, eligible, 4, 2))


def test_states_are_the_largest_gaps_first():
    delta = np.zeros((5, 8), np.float32)
    positions = np.array([2, -1, 3, 1, 4])
    delta[0, 2], delta[2, 3], delta[3, 1], delta[4, 4] = 0.5, 2.0, 0.5, 1.0
    assert choose_states(positions, delta, 3) == [2, 4, 0]  # ties: the lower row
    assert choose_states(positions, delta, 9) == [2, 4, 0, 3]


def test_arms_are_budget_matched():
    response = np.arange(10, 20)
    (cont, cont_budget), (roll, roll_budget) = arms(response, 4, WIDTH)
    np.testing.assert_array_equal(cont, response[:5])  # keeps the erroneous token
    np.testing.assert_array_equal(roll, response[:4])  # resamples it
    # T - e tokens from the pre-error state in both arms; full responses of at most T tokens
    assert cont_budget + 1 == roll_budget == WIDTH - 4
    assert cont.size + cont_budget == roll.size + roll_budget == WIDTH


def _arm(tokens, lengths, rewards):
    n = len(rewards)
    return Arm(tokens=np.asarray(tokens, np.int32), lengths=np.asarray(lengths, np.int32),
               logprobs=np.full((n, 8), -1.0, np.float32),
               policy_logprobs=np.full((n, 8), -2.0, np.float32),
               rewards=np.asarray(rewards, np.float32), texts=[f"b{i}" for i in range(n)],
               feedback=[""] * n, new_tokens=5)


def test_batch_layout_and_weights_per_label():
    """Three states of one group, three supervision slots: recoverable (row 1, e = 3),
    irreversible (row 2, e = 2), ambiguous (row 3, e = 4: its slot is left empty)."""
    g, width = 4, 8
    tokens = np.arange(1, 1 + g * width, dtype=np.int32).reshape(g, width)
    lengths = np.array([8, 7, 6, 8], np.int32)
    mask = np.arange(width)[None] < lengths[:, None]
    group = GroupRows(example=Example(prompt="q", answer="a"), example_index=0,
                      prompt=np.array([1, 2], np.int32), tokens=tokens, lengths=lengths,
                      logprobs=np.zeros((g, width), np.float32),
                      policy_logprobs=np.zeros((g, width), np.float32), loss_mask=mask,
                      rewards=np.array([1, 0, 0, 0], np.float32),
                      branch_positions=np.zeros(g, np.int32), texts=list("abcd"),
                      generated_tokens=int(lengths.sum()), feedback=[""] * g)
    branch = lambda row, keep, lengths, rewards: _arm(
        [np.concatenate([tokens[row, :keep], np.full(width - keep, 90 + i)])
         for i in range(len(rewards))], lengths, rewards)
    info = StateInfo(
        rows=np.array([1, 2, 3]), positions=np.array([3, 2, 4]), delta=np.zeros((g, width)),
        p_cont=np.array([0.5, 0.0, 0.25]), p_roll=np.array([0.0, 0.5, 0.25]),
        labels=np.array([1, 2, 0], np.int32),
        arms=[{"continue": branch(1, 4, [6, 7], [0, 1]), "rollback": branch(1, 3, [5, 5], [0, 0])},
              {"continue": branch(2, 3, [4, 4], [0, 0]), "rollback": branch(2, 2, [5, 8], [0, 1])},
              {"continue": branch(3, 5, [6, 6], [1, 0]), "rollback": branch(3, 4, [6, 6], [0, 1])}])
    out = group_rows(group, info, 3)
    t = np.arange(width)
    assert out.size == 7 and out.tokens.shape == (7, width)
    np.testing.assert_array_equal(out.row_roles, [0, 0, 0, 0, 1, 2, 0])
    np.testing.assert_array_equal(out.tokens[:g], tokens)  # the samples, unchanged
    # recoverable: the student's row before e only; the corrective row (continue branch 1, the
    # first success) keeps the prefix through e and is trained after it
    np.testing.assert_array_equal(out.loss_mask[1], t < 3)
    np.testing.assert_array_equal(out.tokens[4], info.arms[0]["continue"].tokens[1])
    np.testing.assert_array_equal(out.tokens[4, :4], tokens[1, :4])
    np.testing.assert_array_equal(out.loss_mask[4], (t > 3) & (t < 7))
    # irreversible: the doomed suffix (e on) untrained; the rollback row trained from e on
    np.testing.assert_array_equal(out.loss_mask[2], t < 2)
    np.testing.assert_array_equal(out.tokens[5], info.arms[1]["rollback"].tokens[1])
    np.testing.assert_array_equal(out.loss_mask[5], (t >= 2) & (t < 8))
    # ambiguous and success rows: the whole response (SOD); the unused slot trains nothing
    np.testing.assert_array_equal(out.loss_mask[3], mask[3])
    np.testing.assert_array_equal(out.loss_mask[0], mask[0])
    assert not out.loss_mask[6].any() and out.lengths[6] == 0
    np.testing.assert_array_equal(out.branch_positions, [0, 0, 0, 0, 4, 2, 0])
    np.testing.assert_array_equal(out.rewards, [1, 0, 0, 0, 1, 1, 0])
    assert out.texts[4:] == ["b1", "b1", ""] and out.generated_tokens == lengths.sum() + 6 * 5


@pytest.fixture(scope="module")
def replayed(model, tokenizer):
    """Two prompts of 4 samples on the tiny model, every other verify call rewarded (rows 1 and 3
    fail; each arm of 4 branches gets 2 successes: every state is recoverable)."""
    method = configured("recoverability", group_size=4, max_new_tokens=WIDTH, tail_guard=2)
    params = with_eos(SamplingParams(temperature=1.0, max_new_tokens=WIDTH), tokenizer)
    exs = examples("mixed", "mixed")
    key = jax.random.key(3)
    with Verifier(ScriptedTask(), tokenizer, workers=0) as verifier:
        groups, infos = sample_recoverability(model, tokenizer, verifier, exs, key=key,
                                              params=params, config=method.config,
                                              samples=method.samples_per_group)
    return dict(method=method, params=params, examples=exs, key=key, groups=groups,
                infos=infos)


def test_the_rollout_replays_failing_rows(replayed, model, tokenizer):
    method, groups, infos = replayed["method"], replayed["groups"], replayed["infos"]
    config = method.config
    assert sum(len(i.rows) for i in infos) >= 2  # error states were found and replayed
    for grp, info in zip(groups, infos):
        assert grp.size == 6 and grp.tokens.shape == (6, WIDTH)
        np.testing.assert_array_equal(grp.rewards[:4], [1, 0, 1, 0])
        assert set(info.rows) <= {1, 3} and len(info.rows) <= 2
        for j, (row, e) in enumerate(zip(info.rows, info.positions)):
            n = grp.lengths[row]
            assert 1 <= e <= n - 1 - config.tail_guard and info.delta[row, e] > 0
            for name in ("continue", "rollback"):
                arm = info.arms[j][name]
                assert arm.tokens.shape == (config.branches, WIDTH)
                assert np.all(arm.lengths <= WIDTH)
            np.testing.assert_allclose(info.p_cont[j], 0.5)
            np.testing.assert_allclose(info.p_roll[j], 0.5)
            assert info.labels[j] == 1
            row_out = 4 + j
            assert grp.row_roles[row_out] == 1
            np.testing.assert_array_equal(grp.tokens[row_out, :e + 1], grp.tokens[row, :e + 1])
            np.testing.assert_array_equal(grp.loss_mask[row, :grp.lengths[row]],
                                          np.arange(grp.lengths[row]) < e)
            assert grp.loss_mask[row_out, :e + 1].sum() == 0 and grp.loss_mask[row_out].any()


def test_branches_are_the_teachers_samples_token_by_token(replayed, model, tokenizer):
    """Continue keeps the erroneous token, rollback resamples it; each branch equals a fresh
    engine's sample of ``teacher context + prefix`` with the same key and budget, and its sampled
    log-probs are the teacher context's teacher-forced ones."""
    method, params = replayed["method"], replayed["params"]
    config = method.config
    requests = 2 * sum(len(i.rows) for i in replayed["infos"])
    checked = 0
    for k, (ex, grp, info) in enumerate(zip(replayed["examples"], replayed["groups"],
                                             replayed["infos"])):
        ctx = np.asarray(teacher_context(tokenizer, ex, index=k, templates=Templates()), np.int32)
        for j, (row, e) in enumerate(zip(info.rows, info.positions)):
            student = grp.tokens[row]
            for a, (name, (prefix, budget)) in enumerate(zip(
                    ("continue", "rollback"), arms(student, int(e), WIDTH))):
                arm = info.arms[j][name]
                start = prefix.size  # e + 1 (the erroneous token kept) or e (resampled)
                assert start == (e + 1 if name == "continue" else e)
                np.testing.assert_array_equal(arm.tokens[:, :start],
                                              np.broadcast_to(student[:start], (4, start)))
                # the rollout's engine shape (slots, cache length): the same compiled decode
                engine = make_engine(model, params, longest_prompt=ctx.size,
                                     max_new_tokens=WIDTH, rows=requests * config.branches,
                                     slots=None, chunk_steps=16)
                engine.submit(np.concatenate([ctx, prefix]), num_samples=config.branches,
                              max_new_tokens=budget,
                              key=request_key(replayed["key"], k, 1 + a, j), tag="x")
                fresh = engine.run()["x"]
                np.testing.assert_array_equal(arm.lengths, start + fresh.lengths)
                for b in range(config.branches):
                    m = int(fresh.lengths[b])
                    np.testing.assert_array_equal(arm.tokens[b, start:start + m],
                                                  fresh.tokens[b, :m])
                    assert not arm.tokens[b, start + m:].any()
                scored = np.asarray(score_logprobs(
                    model, [ctx], [arm.tokens[b, :arm.lengths[b]] for b in range(4)]))
                for b in range(config.branches):
                    np.testing.assert_allclose(arm.policy_logprobs[b, start:arm.lengths[b]],
                                               scored[b, start:arm.lengths[b]], atol=2e-4)
                checked += 1
    assert checked >= 4


def test_collect_assembles_the_supervision_rows(model, tokenizer):
    method = configured("recoverability", group_size=4, max_new_tokens=WIDTH, tail_guard=2)
    batch, stats = collect(method, model, tokenizer, ScriptedTask(), examples("mixed", "mixed"),
                           key=jax.random.key(3), rollout=RolloutConfig(verify_workers=0),
                           sampling=SamplingParams(temperature=1.0, max_new_tokens=WIDTH))
    rows, width = check_batch(batch, method="recoverability", contexts=method.contexts,
                              fields=method.fields)
    assert (rows, width) == (12, WIDTH) and method.group_size == 6
    role = np.asarray(batch["row_role"]).reshape(2, 6)
    assert not role[:, :4].any()
    assert stats.recoverability["states"] == stats.recoverability["recoverable"] == \
        int((role == 1).sum()) >= 2
    assert stats.reward_mean == 0.5  # the samples' rewards, not the supervision rows'
    assert stats.seconds["branches"] > 0 and stats.phase_tokens["branches"] > 0


def test_refusals():
    with pytest.raises(ValueError, match="teacher.*'reference' is not available"):
        configured("recoverability", group_size=4, teacher="reference")
    method = configured("recoverability", group_size=4, teacher_context=("successful_peer",))
    with pytest.raises(ValueError, match="teacher_context.*read the group's sampled rows"):
        collect(method, None, None, ScriptedTask(), examples("mixed"), key=jax.random.key(0),
                sampling=SamplingParams(max_new_tokens=8))
