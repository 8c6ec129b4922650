"""HDL trees on episodes (tiny char model, the textgame environment): the tree layout, branch points
on action tokens only, a continuation's history equal to its root's up to the branch point and
reused from the root's cache (no prefill), its environment replayed to the branch turn (its later
observations are the environment's answers to its own actions), its logp_old equal to a
teacher-forced re-score, the loss mask from the branch point on."""
from unittest import mock

import jax
import numpy as np
import pytest

from hindsight.envs import EnvPool
from hindsight.envs.textgame import TextGame
from hindsight.methods.hdl import HDLConfig
from hindsight.rollout import assemble, context_logprobs
from hindsight.rollout.branching import TreeLayout
from hindsight.rollout.episode_trees import sample_episode_trees
from hindsight.rollout.hdl import TreeOptions
from hindsight.rollout.runtime import PhaseClock
from hindsight.sampling import SamplingParams, score_logprobs
from hindsight.tasks import get_task

PARAMS = SamplingParams(max_new_tokens=10, stop_tokens=(2,))
CONFIG = HDLConfig(num_roots=2, num_points=2, counts=(2, 1), tail_guard=2, min_gap_floor=2,
                   min_prefix_fraction=0.25)
OPTIONS = TreeOptions(reflection_max_tokens=6, feedback_max_tokens=24)


SCORING_PREFIXES = []  # per hindsight scoring call of the fixture: whether it had a CachedPrefix


@pytest.fixture(scope="module")
def played(model, tokenizer):
    task = get_task("textgame")
    examples = task.examples(split="train", count=2, seed=0)
    clock = PhaseClock()

    def spy(*args, prefix=None, **kwargs):
        SCORING_PREFIXES.append(prefix is not None)
        return score_logprobs(*args, prefix=prefix, **kwargs)

    with EnvPool(task.env, workers=len(examples) * CONFIG.group_size, step_timeout=30.0,
                 reset_timeout=60.0) as pool, \
            mock.patch("hindsight.rollout.episode_trees.score_logprobs", spy):
        groups, infos, episodes = sample_episode_trees(
            model, tokenizer, task, pool, examples, key=jax.random.key(3), params=PARAMS,
            config=CONFIG, options=OPTIONS, max_turns=3, episode_tokens=512, clock=clock)
    return task, examples, groups, infos, episodes, clock


def test_hindsight_scores_from_the_roots_cache_equal_a_full_rescore(played, model):
    """Each root's h continues the root's cached first turn (CachedPrefix): its scores equal
    ``|logp_h - logp_orig|`` with ``logp_h`` scored from scratch (h prefilled whole) and
    ``logp_orig`` the sampler's temperature-1 log-probs, on the root's action tokens."""
    task, examples, groups, infos, episodes, clock = played
    assert SCORING_PREFIXES and all(SCORING_PREFIXES)
    checked = 0
    for g, info, eps in zip(groups, infos, episodes):
        for j, i in enumerate(np.nonzero(info.layout.kind == TreeLayout.ROOT)[0]):
            row = eps[i].arrays(512, 3)
            n = eps[i].length
            if not row["mask"].any():
                continue
            full = np.asarray(score_logprobs(model, [g.hindsight[i]], [row["tokens"][:n]]))[0]
            want = np.where(row["mask"][:n], np.abs(full - row["raw_logprobs"][:n]), 0.0)
            np.testing.assert_allclose(info.scores[j][:n], want, atol=2e-5, rtol=1e-5)
            checked += 1
    assert checked >= 2


def test_layout_and_branch_points_on_action_tokens(played):
    task, examples, groups, infos, episodes, _ = played
    assert len(groups) == 2 and all(g.size == CONFIG.group_size for g in groups)
    for group, info, eps in zip(groups, infos, episodes):
        lay = info.layout
        roots = np.nonzero(lay.kind == TreeLayout.ROOT)[0]
        assert roots.tolist() == [0, 4]
        for j, r in enumerate(roots):
            action = group.loss_mask[r]
            n = int(group.lengths[r])
            # scores only where the root acted; zero on observations and past the end
            assert (info.scores[j][~action] == 0).all() and info.scores.shape[1] == 512
            for p in info.points[j]:
                if p >= 0:
                    assert action[p] and p < n
        for i in range(group.size):
            ep = eps[i]
            assert ep.status in ("done", "turns", "context") and ep.key[1] == i
            if lay.kind[i] != TreeLayout.CONTINUATION:
                assert group.branch_positions[i] == 0
                continue
            r = int(roots[lay.root[i]])
            p = int(group.branch_positions[i])
            assert p == lay.position[i] and p in info.points[lay.root[i]]
            # the shared history: the root's tokens up to the branch point, trained only there
            np.testing.assert_array_equal(group.tokens[i, :p], group.tokens[r, :p])
            turn, _ = eps[r].locate(p)
            assert eps[i].actions[:turn] == eps[r].actions[:turn]
            assert not group.loss_mask[i, :p].any()
            t = np.arange(group.tokens.shape[1])
            acted = (group.turn_ids[i] >= 0)
            np.testing.assert_array_equal(group.loss_mask[i], acted & (t >= p))
            assert group.loss_mask[i, p] and group.turn_ids[i, p] == turn


def test_continuations_replay_their_environment(played):
    task, examples, groups, infos, episodes, _ = played
    checked = 0
    for k, eps in enumerate(episodes):
        for ep in eps:
            env = TextGame(**dict(task.env.options))
            observations = [env.reset(task.setup(examples[k]))]
            rewards = []
            for action in ep.actions:
                step = env.step(action)
                rewards.append(step.reward)
                observations.append(step.observation)
                if step.done:
                    break
            # every observation the row saw is the environment's answer to the row's own actions
            assert ep.observations == observations[:len(ep.observations)]
            assert ep.rewards == pytest.approx(rewards[:len(ep.rewards)])
            checked += ep.branch_position > 0
    assert checked >= 4  # continuations were played, not only roots


def test_logp_old_matches_a_rescore_and_no_prefix_is_prefilled(played, model):
    task, examples, groups, infos, episodes, clock = played
    rows = sum(g.size for g in groups)
    batch = assemble(groups, np.zeros(rows, np.float32), np.zeros(rows, np.float32))
    rescored = context_logprobs(model, batch)
    m = batch["mask"] > 0
    np.testing.assert_allclose(rescored[m], batch["logp_old"][m], atol=1e-5, rtol=1e-5)
    # the temperature-1 log-probs the tree scores with travel with each action piece (sampled at
    # temperature 1 here: equal to the policy's, zero on observations)
    for eps in episodes:
        for ep in eps:
            row = ep.arrays(512, 3)
            np.testing.assert_array_equal(row["raw_logprobs"], row["policy_logprobs"])
            assert (row["raw_logprobs"][row["turn_id"] >= 0] != 0).any()
            assert (row["raw_logprobs"][row["turn_id"] < 0] == 0).all()
    engine = clock.engines["main"]
    # prefills: each distinct first prompt of an example's roots, and each fresh row's; never a
    # continuation's (its history comes from the root's cache of the branched turn)
    want = 0
    for info, eps in zip(infos, episodes):
        kind = info.layout.kind
        want += sum({eps[i].prompt.tobytes(): eps[i].prompt.size
                     for i in np.nonzero(kind == TreeLayout.ROOT)[0]}.values())
        want += sum(eps[i].prompt.size for i in np.nonzero(kind == TreeLayout.FRESH)[0])
    assert engine["prefill_tokens"] == want
    assert clock.tokens["reflection"] > 0 and "scoring" in clock.seconds()
    # generated tokens: each continuation counts only what it sampled after the branch point
    for g, info in zip(groups, infos):
        t = np.arange(g.tokens.shape[1])
        acted = sum(int(((g.turn_ids[i] >= 0) & (t >= g.branch_positions[i])).sum())
                    for i in range(g.size))
        assert g.generated_tokens == acted + int(info.reflection_lengths.sum())
