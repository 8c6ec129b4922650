"""Teacher contexts from registered parts: SDPO's successful peer (first other success, thinking
stripped), the feedback fallback, rows without a context, HSD's random peer, H2SD's routing, the
recipe syntax, and the rollout layer's ``teacher_row_mask``."""
import jax
import numpy as np
import pytest

from hindsight.batch import check_batch
from hindsight.rollout import (CONTEXT_PARTS, GroupView, RolloutConfig, Templates, collect,
                               context_logprobs, teacher_context, teacher_contexts)
from hindsight.rollout.contexts import parse_recipe, row_context, strip_thinking
from hindsight.sampling import SamplingParams, score_logprobs
from hindsight.sampling.text import encode_prompt
from hindsight.tasks import Example
from tests.rollout.helpers import ScriptedTask, configured, examples

T = Templates()
EX = Example(prompt="What is 2+3?", answer="5")


def view(rewards, texts=None, feedback=None, seed=0, example=EX):
    n = len(rewards)
    texts = texts or [f"answer {i}" for i in range(n)]
    feedback = feedback or ["verified correct" if r >= 0.5 else f"wrong {i}"
                            for i, r in enumerate(rewards)]
    return GroupView(example=example, texts=texts, rewards=np.asarray(rewards, np.float32),
                     feedback=feedback, templates=T, rng=np.random.default_rng(seed))


def test_successful_peer_is_the_first_other_success_with_thinking_stripped():
    v = view([0, 1, 0.5, 0.2], texts=["a", "<think>scratch</think> peer one", "peer two", "d"])
    peer = lambda row: CONTEXT_PARTS.get("successful_peer")(v, row)
    assert peer(0) == T.peer_part.format(solution="peer one")
    assert peer(1) == T.peer_part.format(solution="peer two")  # never the row itself
    assert peer(2) == T.peer_part.format(solution="peer one")
    assert strip_thinking("<think>never closed") == ""


def test_sdpo_recipe_falls_back_to_feedback_and_masks_rows_with_neither():
    recipe = ("successful_peer|feedback",)
    v = view([0, 1, 0], feedback=["off by one", "verified correct", ""])
    ctx = [row_context(v, r, recipe) for r in range(3)]
    assert "Correct solution:\nanswer 1" in ctx[0] and "off by one" not in ctx[0]
    assert ctx[1] is None  # the only success: no other success, no feedback on a success
    assert "Correct solution:\nanswer 1" in ctx[2]
    v = view([0, 0], feedback=["off by one", "  "])
    assert T.feedback_part.format(feedback="off by one") in row_context(v, 0, recipe)
    assert row_context(v, 1, recipe) is None  # blank feedback is no feedback
    full = row_context(view([0, 1]), 0, recipe)
    assert full == T.instruction.format(question=EX.prompt,
                                        passages=T.peer_part.format(solution="answer 1"))


def test_hsd_recipe_keeps_the_reference_and_draws_peers_uniformly():
    recipe = ("random_successful_peer", "reference")
    v = view([1, 1, 1, 0], texts=["p0", "p1", "p2", "x"])
    assert row_context(view([0, 0]), 0, recipe) == T.instruction.format(
        question=EX.prompt, passages=T.reference_part.format(answer="5"))
    drawn = [row_context(v, 3, recipe) for _ in range(300)]
    counts = {p: sum(T.peer_part.format(solution=p) in d for d in drawn) for p in ("p0", "p1", "p2")}
    assert all(70 < c < 130 for c in counts.values()), counts
    assert all(T.reference_part.format(answer="5") in d for d in drawn)
    assert all("p0" not in row_context(v, 0, recipe) for _ in range(50))  # never itself
    again = view([1, 1, 1, 0], texts=["p0", "p1", "p2", "x"])
    assert [row_context(again, 3, recipe) for _ in range(300)] == drawn  # seeded


def test_h2sd_recipe_routes_by_correctness():
    recipe = ("own_success|hint",)
    v = view([1, 0], texts=["<think>hm</think>it is 5", "it is 6"])
    assert T.own_success_part.format(solution="it is 5") in row_context(v, 0, recipe)
    assert "Hint" not in row_context(v, 0, recipe)
    assert T.hint_part.format(answer="5") in row_context(v, 1, recipe)


def test_recipe_errors_name_the_option_and_the_parts():
    with pytest.raises(ValueError, match="unknown context part 'peer'.*'successful_peer'"):
        parse_recipe(("peer|feedback",))
    with pytest.raises(ValueError, match="non-empty tuple"):
        parse_recipe("reference")
    from hindsight.methods import get_method
    with pytest.raises(ValueError, match="teacher_context"):
        get_method("sdpo").make_config(teacher_context=("a||b",))
    method = configured("sdpo", group_size=2, teacher_context=("nonesuch",))
    with pytest.raises(ValueError, match="method_config.teacher_context.*'nonesuch'"):
        collect(method, None, None, ScriptedTask(), examples("mixed"), key=jax.random.key(0),
                sampling=SamplingParams(max_new_tokens=4))


def test_teacher_contexts_row_mask_and_the_reference_recipe(tokenizer):
    ids, keep = teacher_contexts(tokenizer, [view([1, 0]), view([0, 0], feedback=["", ""])],
                                 ("successful_peer|feedback",))
    np.testing.assert_array_equal(keep, [0, 1, 0, 0])
    assert ids[0] == encode_prompt(tokenizer, EX.prompt)  # placeholder: the plain question
    assert teacher_context(tokenizer, EX) == encode_prompt(tokenizer, T.instruction.format(
        question=EX.prompt, passages=T.reference_part.format(answer="5")))
    with pytest.raises(ValueError, match="example 3 has no reference answer"):
        teacher_context(tokenizer, Example(prompt="q", answer=""), index=3)


def test_collect_builds_per_row_contexts_and_their_row_mask(model, tokenizer):
    """SDPO through the rollout layer: each row's teacher context is its recipe's, the batch marks
    the rows without one, and the teacher-forced context scores the response as direct scoring
    of ``context + response`` does."""
    exs = examples("mixed", "one", "zero")
    task = ScriptedTask()
    batch, _ = collect(configured("sdpo", group_size=2), model, tokenizer, task, exs,
                       key=jax.random.key(0), sampling=SamplingParams(max_new_tokens=8))
    check_batch(batch, method="sdpo", contexts=("teacher",), fields=("logp_old",))
    rewards = batch["rewards"]
    np.testing.assert_array_equal(rewards, [1, 0, 1, 1, 0, 0])
    # group 0: row 0 (the only success) has none, row 1 has row 0 as its peer; group 1: each the
    # other; group 2: failures whose feedback is "expected a2"
    np.testing.assert_array_equal(batch["teacher_row_mask"], [0, 1, 1, 1, 1, 1])
    lengths = (batch["mask"] > 0).sum(1)
    responses = [batch["targets"][i, :n] for i, n in enumerate(lengths)]
    texts = [tokenizer.decode(r, skip_special_tokens=True) for r in responses]
    for i in range(6):
        g = i // 2
        v = GroupView(example=exs[g], texts=texts[2 * g:2 * g + 2], rewards=rewards[2 * g:2 * g + 2],
                      feedback=["verified correct" if r else f"expected a{g}"
                                for r in rewards[2 * g:2 * g + 2]], templates=T,
                      rng=np.random.default_rng(0))
        user = row_context(v, i % 2, ("successful_peer|feedback",))
        want = encode_prompt(tokenizer, exs[g].prompt if user is None else user)
        k = batch["teacher_target_index"][i, 0] + 1
        np.testing.assert_array_equal(batch["teacher_tokens"][i, :k], want)
        ref = np.asarray(score_logprobs(model, [want], [responses[i]]))[0]
        np.testing.assert_allclose(context_logprobs(model, batch, "teacher")[i, :lengths[i]],
                                   ref[:lengths[i]], atol=1e-5)


def test_a_reference_recipe_on_an_example_without_an_answer_is_refused(model, tokenizer):
    """Never a placeholder context on a row that should have one: the example is named."""
    from hindsight.rollout.collect import _contexts
    method = configured("opsd", group_size=2, temperature=1.1)
    with pytest.raises(ValueError, match="example 0 has answer=''"):
        collect(method, model, tokenizer, ScriptedTask(),
                [Example(prompt="q", answer="", data=("one",))], key=jax.random.key(0),
                sampling=SamplingParams(max_new_tokens=4, temperature=1.1))
    # the contexts' own check (what an iterator of examples, never checked up front, meets)
    from hindsight.rollout import GroupRows
    group = GroupRows(example=Example(prompt="q", answer=""), example_index=7,
                      prompt=np.zeros(1, np.int32), tokens=np.zeros((2, 1), np.int32),
                      lengths=np.ones(2, np.int32), logprobs=np.zeros((2, 1), np.float32),
                      policy_logprobs=np.zeros((2, 1), np.float32),
                      loss_mask=np.ones((2, 1), bool), rewards=np.zeros(2, np.float32),
                      branch_positions=np.zeros(2, np.int32), texts=["a", "b"],
                      generated_tokens=2, feedback=["", ""])
    with pytest.raises(ValueError, match="example 7 has no reference answer"):
        _contexts(method, tokenizer, [group], Templates(), seed=0)


def test_concise_part_is_the_question_and_the_instruction_on_every_row(model, tokenizer):
    """BIRD's teacher context: question + the concise instruction, on every row (successes and
    failures alike), needing no reference answer; OPSD's batch then carries no row mask and its
    teacher tokens are that context."""
    recipe = ("concise",)
    want = T.instruction.format(question=EX.prompt, passages=T.concise_part)
    v = view([1, 0])
    assert [row_context(v, r, recipe) for r in range(2)] == [want, want]
    no_answer = Example(prompt=EX.prompt, answer=None)
    assert teacher_context(tokenizer, no_answer, recipe=recipe) == encode_prompt(tokenizer, want)
    ids, keep = teacher_contexts(tokenizer, [view([1, 0]), view([0, 0])], recipe)
    np.testing.assert_array_equal(keep, [1, 1, 1, 1])
    with pytest.raises(ValueError, match=r"part\(s\) \['feedback'\], which read the group's"):
        teacher_context(tokenizer, EX, recipe=("concise", "feedback"))
    exs = [Example(prompt="q0?", answer=None, data=("mixed",)),
           Example(prompt="q1?", answer=None, data=("zero",))]
    batch, _ = collect(configured("opsd", group_size=2, temperature=1.1, teacher_context=recipe),
                       model, tokenizer, ScriptedTask(), exs, key=jax.random.key(0),
                       sampling=SamplingParams(max_new_tokens=4, temperature=1.1))
    assert "teacher_row_mask" not in batch
    for i in range(4):
        ctx = encode_prompt(tokenizer, T.instruction.format(question=exs[i // 2].prompt,
                                                           passages=T.concise_part))
        np.testing.assert_array_equal(batch["teacher_tokens"][i, :len(ctx)], ctx)
