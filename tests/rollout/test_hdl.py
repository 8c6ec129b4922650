"""HDL trees end to end on a tiny model: branch points where the (patched) hindsight score peaks,
the 4/3 assignment, continuations sharing the root prefix token for token, suffix-only loss masks,
exact token accounting, the hindsight context's alignment, and fallbacks that keep 16 rows."""
import dataclasses

import jax
import numpy as np
import pytest

import hindsight.rollout.hdl as hdl_module
from hindsight.batch import check_batch
from hindsight.methods import get_method
from hindsight.rollout import (RolloutConfig, Templates, TreeOptions, collect, context_logprobs,
                               tree_advantages, tree_layout)
from hindsight.sampling import SamplingParams, score_logprobs
from tests.rollout.helpers import ScriptedTask, configured, examples

SHORT = Templates(reflection="{feedback}|reflect",
                  hindsight="{question}|{feedback}|{reflection}|solve")
TREE = TreeOptions(reflection_max_tokens=8, hindsight_reflection_tokens=6, templates=SHORT,
                   rescore_original=True)
# eligible 12..39 for a 48-token root (head guard: the first quarter; tail guard 8); d_min = 16.
# Root 0: 25 is suppressed by 20, 3 is in the head. Root 1: 44 is in the tail, 10 in the head.
PEAKS = ({20: 5.0, 25: 4.0, 3: 9.0, 37: 3.0}, {38: 2.0, 44: 9.0, 10: 8.0, 16: 1.0})
EXPECT = [[20, 37], [38, 16]]


def fake_scores(model, contexts, responses, **kw):
    """One call scores the roots under ``h`` (the first two contexts: known dips, so
    ``|logp_h - logp_orig|`` peaks where PEAKS say) and, re-scored, after the prompt (the last
    two: log-prob 0 everywhere)."""
    assert len(contexts) == 2 * len(PEAKS)
    out = np.zeros((len(responses), max(len(r) for r in responses)), np.float32)
    for r, peaks in enumerate(PEAKS):
        for t, v in peaks.items():
            out[r, t] = -v
    return out


def test_tree_branches_at_peaks_with_suffix_masks(model, tokenizer, monkeypatch):
    monkeypatch.setattr(hdl_module, "score_logprobs", fake_scores)
    method = dataclasses.replace(configured("hdl", min_prefix_fraction=0.25),
                                 contexts=("hindsight",))
    exs = examples("mixed", "zero")
    batch, stats = collect(method, model, tokenizer, ScriptedTask(), exs, key=jax.random.key(3),
                           sampling=SamplingParams(max_new_tokens=48),
                           rollout=RolloutConfig(stop_at_eos=False, tree=TREE))
    b, t = check_batch(batch, method="hdl", contexts=("hindsight",), fields=method.fields)
    assert (b, t) == (32, 48)
    assert stats.branch_positions == [EXPECT, EXPECT]
    assert stats.branch_sources == [["nms", "nms"]] * 2
    lengths = np.full(b, 48)  # stop tokens off: every response runs to the cap
    positions = [0] + [20] * 4 + [37] * 3 + [0] + [38] * 4 + [16] * 3
    tt = np.arange(t)
    for g in range(2):
        for i, bpos in enumerate(positions):
            row, root = 16 * g + i, 16 * g + (0 if i < 8 else 8)
            np.testing.assert_array_equal(batch["targets"][row, :bpos],
                                          batch["targets"][root, :bpos])
            np.testing.assert_array_equal(batch["mask"][row] > 0,
                                          (tt >= bpos) & (tt < lengths[row]))
    # continuations were sampled from the original context: logp_old of every loss token is the
    # policy's log-prob after prompt + prefix (teacher forcing the batch reproduces it)
    mask = batch["mask"] > 0
    np.testing.assert_allclose(np.where(mask, context_logprobs(model, batch), 0),
                               np.where(mask, batch["logp_old"], 0), atol=1e-5)
    np.testing.assert_allclose(batch["advantages"], tree_advantages(
        batch["rewards"], [tree_layout(np.array(EXPECT), get_method("hdl").config)] * 2,
        group_size=16))
    # tokens: roots in full, continuations' new suffixes, and the reflections
    for g in range(2):
        new = sum(48 - p for p in positions)
        assert stats.generated_tokens[g] == new + stats.reflection_tokens[g]
        assert stats.generated_tokens[g] == int(mask[16 * g:16 * g + 16].sum()) \
            + stats.reflection_tokens[g]
        assert 2 <= stats.reflection_tokens[g] <= 16
    assert sum(stats.generated_tokens) == sum(stats.phase_tokens.values())
    assert stats.phase_tokens["continuations"] == 2 * sum(48 - p for p in positions if p)
    assert set(stats.seconds) >= {"roots", "reflection", "scoring", "continuations", "total"}
    # the hindsight context holds h (never the attempt) and aligns like the policy context
    h_lp = context_logprobs(model, batch, "hindsight")
    for row in (0, 9):
        n = int(batch["hindsight_target_index"][row, 0]) + 1
        h = batch["hindsight_tokens"][row, :n]
        text = tokenizer.decode(h.tolist(), skip_special_tokens=True)
        assert text.startswith("<user>q0?|") and text.endswith("|solve\n<assistant>")
        ref = np.asarray(score_logprobs(model, [h], [batch["targets"][row]]))[0]
        np.testing.assert_allclose(h_lp[row], ref, atol=1e-5)


def test_short_roots_fall_back_and_keep_16_rows(model, tokenizer):
    method = configured("hdl", baseline="node", tail_guard=0)
    cfg = method.config
    exs = examples("mixed")
    batch, stats = collect(method, model, tokenizer, ScriptedTask(), exs, key=jax.random.key(4),
                           sampling=SamplingParams(max_new_tokens=2),
                           rollout=RolloutConfig(stop_at_eos=False, tree=TREE))
    assert batch["targets"].shape == (16, 2)
    # a 2-token root has one branchable position (1): 4 continuations there, 3 fresh rollouts
    assert stats.branch_positions == [[[1, -1], [1, -1]]]
    assert stats.branch_sources == [["relaxed", "relaxed"]]
    expect = np.ones((16, 2), bool)
    expect[[1, 2, 3, 4, 9, 10, 11, 12], 0] = False
    np.testing.assert_array_equal(batch["mask"] > 0, expect)
    lay = tree_layout(np.array([[1, -1], [1, -1]]), cfg)
    np.testing.assert_allclose(batch["advantages"], tree_advantages(
        batch["rewards"], [lay], group_size=16, baseline="node"), atol=1e-6)
    assert stats.generated_tokens[0] == 32 - 8 + stats.reflection_tokens[0]
    assert stats.phase_tokens["fresh"] == 12


@pytest.mark.parametrize("bad", [0, True])
def test_tree_options_validate(bad):
    with pytest.raises(ValueError, match="reflection_max_tokens"):
        TreeOptions(reflection_max_tokens=bad)


def test_reflection_cap_defaults_to_an_eighth_of_the_response_cap():
    assert TreeOptions().reflection_cap(128) == 16 and TreeOptions().hindsight_cap(128) == 16
    assert TreeOptions().reflection_cap(32) == 8  # floor
    opts = TreeOptions(reflection_max_tokens=40, hindsight_reflection_tokens=10)
    assert opts.reflection_cap(128) == 40 and opts.hindsight_cap(128) == 10
    assert TreeOptions(reflection_max_tokens=40).hindsight_cap(128) == 40


def test_default_tree_reflections_stay_under_the_cap(model, tokenizer):
    exs = examples("mixed")
    _, stats = collect(configured("hdl"), model, tokenizer, ScriptedTask(), exs,
                       key=jax.random.key(5), sampling=SamplingParams(max_new_tokens=96),
                       rollout=RolloutConfig(stop_at_eos=False, tree=TreeOptions(templates=SHORT)))
    assert 2 <= stats.reflection_tokens[0] <= 2 * 12  # two reflections of at most 96 // 8


@pytest.mark.parametrize("scoring_temperature,rescored",
                         [(1.0, False), (None, False), (0.7, False), (0.5, True)])
def test_scoring_temperature(model, tokenizer, monkeypatch, scoring_temperature, rescored):
    """The score's two log-probs are at ``scoring_temperature`` (the spec's 1.0 by default): at
    the sampling temperature (None, or equal) and at 1 the sampler's log-probs are reused (it
    records both); at another one (0.5) the roots are re-scored after the prompt in the same call.
    Every context is scored from the roots' cached K/V: the same log-probs as a full re-score."""
    calls = []

    def spy(model, contexts, responses, **kw):
        calls.append((len(contexts), kw["temperature"], kw["prefix"] is not None))
        got = score_logprobs(model, contexts, responses, **kw)
        full = score_logprobs(model, contexts, responses, **{**kw, "prefix": None})
        np.testing.assert_allclose(got, full, rtol=1e-5, atol=1e-5)
        return got

    monkeypatch.setattr(hdl_module, "score_logprobs", spy)
    method = configured("hdl", temperature=0.7, scoring_temperature=scoring_temperature)
    collect(method, model, tokenizer, ScriptedTask(), examples("mixed"), key=jax.random.key(5),
            sampling=SamplingParams(max_new_tokens=24, temperature=0.7),
            rollout=RolloutConfig(stop_at_eos=False, tree=dataclasses.replace(
                TREE, rescore_original=False)))
    want = 0.7 if scoring_temperature is None else scoring_temperature
    assert calls == [(4 if rescored else 2, want, True)]


def test_a_tasks_branch_mask_reaches_the_tree(model, tokenizer):
    """A task whose ``branch_mask`` forbids every token leaves no branch point: the tree is its
    roots and fresh rollouts."""
    class Forbidding(ScriptedTask):
        def branch_mask(self, example, pieces):
            return [False] * len(pieces)

    _, stats = collect(configured("hdl", tail_guard=2), model, tokenizer, Forbidding(),
                       examples("mixed"), key=jax.random.key(6),
                       sampling=SamplingParams(max_new_tokens=24),
                       rollout=RolloutConfig(stop_at_eos=False, tree=TREE))
    assert stats.branch_positions == [[[-1, -1], [-1, -1]]]
    assert stats.branch_sources == [["fresh", "fresh"]]


def test_trees_sampled_together_equal_trees_sampled_alone(model, tokenizer):
    """A tree samples, scores and branches the same tokens whether other trees share the engine's
    slot batch or not (its requests' keys come from its prompt's number, ``first_index``)."""
    method = configured("hdl", temperature=0.7, tail_guard=2)
    sampling = SamplingParams(max_new_tokens=24, temperature=0.7)
    rollout = RolloutConfig(stop_at_eos=False, tree=dataclasses.replace(TREE, rescore_original=False))
    exs = examples("mixed", "zero", "mixed")
    together, t_stats = collect(method, model, tokenizer, ScriptedTask(), exs,
                                key=jax.random.key(7), sampling=sampling, rollout=rollout)
    for i in range(3):
        alone, a_stats = collect(method, model, tokenizer, ScriptedTask(), exs[i:i + 1],
                                 key=jax.random.key(7), sampling=sampling, rollout=rollout,
                                 first_index=i)
        rows = slice(16 * i, 16 * i + 16)
        np.testing.assert_array_equal(together["targets"][rows], alone["targets"])
        np.testing.assert_array_equal(together["mask"][rows], alone["mask"])
        assert t_stats.branch_positions[i] == a_stats.branch_positions[0]
        assert t_stats.reflection_tokens[i] == a_stats.reflection_tokens[0]
