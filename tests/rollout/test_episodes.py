"""Episodes on the engine's cache (tiny char model, the textgame environment): the exact token
layout, per-turn logp_old equal to a teacher-forced re-score of the whole sequence, observations
computed once from the cache (never the history again), the context cap, a failing environment."""
import jax
import numpy as np
import pytest

from hindsight.envs import EnvPool, EnvSpec
from hindsight.rollout import assemble, context_logprobs
from hindsight.rollout.episodes import EpisodeOptions, env_pool, play, sample_episodes
from hindsight.rollout.prompts import followup_turn
from hindsight.rollout.runtime import PhaseClock
from hindsight.sampling import SamplingParams
from hindsight.sampling.text import encode_prompt
from hindsight.tasks import get_task
from hindsight.tasks.episodic import TextGameTask

PARAMS = SamplingParams(max_new_tokens=10, stop_tokens=(2,))


def _play(model, tokenizer, task, examples, *, group_size=2, max_turns=3, episode_tokens=512,
          workers=None):
    clock = PhaseClock()
    with EnvPool(task.env, workers=workers or len(examples) * group_size, step_timeout=30.0,
                 reset_timeout=60.0) as pool:
        groups, played = sample_episodes(model, tokenizer, task, pool, examples,
                                         key=jax.random.key(0), params=PARAMS,
                                         group_size=group_size, max_turns=max_turns,
                                         episode_tokens=episode_tokens, clock=clock)
    return groups, played, clock


def test_three_turn_layout_logprobs_and_cache_reuse(model, tokenizer):
    task = get_task("textgame")
    examples = task.examples(split="train", count=2, seed=0)
    groups, played, clock = _play(model, tokenizer, task, examples)
    engine = clock.engines["main"]
    observation_tokens = 0
    for k, (group, eps) in enumerate(zip(groups, played)):
        for g, ep in enumerate(eps):
            assert ep.status == "turns" and len(ep.actions) == 3 and len(ep.rewards) == 3
            # prompt, action, observation, action, observation, action
            kinds = [p.turn for p in ep.pieces]
            assert kinds == [0, -1, 1, -1, 2]
            first = encode_prompt(tokenizer, task.first_turn(examples[k], ep.observations[0]))
            np.testing.assert_array_equal(ep.prompt, first)
            at = 0
            for j, (ids, plp, _, _, turn, search) in enumerate(ep.pieces):
                assert search is None  # textgame has no searches
                n = len(ids)
                np.testing.assert_array_equal(group.tokens[g, at:at + n], ids)
                assert (group.loss_mask[g, at:at + n] == (turn >= 0)).all()
                assert (group.turn_ids[g, at:at + n] == turn).all()
                if turn < 0:  # the observation as the next user turn, verbatim
                    want = followup_turn(tokenizer, ep.observations[(j + 1) // 2])
                    np.testing.assert_array_equal(ids, want)
                    observation_tokens += n
                    assert not plp.any()
                else:
                    assert 1 <= n <= PARAMS.max_new_tokens
                at += n
            assert at == group.lengths[g] and not group.loss_mask[g, at:].any()
            assert (group.turn_ids[g, at:] == -1).all()
        assert group.num_turns.tolist() == [3, 3] and group.turn_rewards.shape == (2, 3)
    # the cache reuse: each distinct first prompt prefilled once, each observation's tokens
    # computed once (plus the turn's last token, which decoding never feeds)
    prompts = {ep.prompt.tobytes(): ep.prompt.size for eps in played for ep in eps}
    assert engine["prefill_tokens"] == sum(prompts.values())
    assert engine["extend_tokens"] == observation_tokens
    # per-turn logp_old equals a teacher-forced re-score of the whole sequence
    batch = assemble(groups, np.zeros(4, np.float32), np.zeros(4, np.float32))
    rescored = context_logprobs(model, batch)
    m = batch["mask"] > 0
    np.testing.assert_allclose(rescored[m], batch["logp_old"][m], atol=1e-5, rtol=1e-5)
    assert (batch["turn_id"][~m] == -1).all() and batch["turn_id"].shape == batch["mask"].shape
    assert "env" in clock.seconds() and "turns" in clock.tokens


def test_context_cap_ends_the_episode(model, tokenizer):
    task = get_task("textgame")
    examples = task.examples(split="train", count=1, seed=1)
    groups, played, _ = _play(model, tokenizer, task, examples, max_turns=5, episode_tokens=120)
    for ep in played[0]:
        assert ep.status == "context" and "budget (120)" in ep.feedback
        # ended by the budget before the turn cap, what was played kept (every action's reward)
        assert ep.length <= 120 and 1 <= len(ep.actions) < 5
        assert len(ep.rewards) == len(ep.actions) and ep.pieces[-1].turn >= 0
    assert (groups[0].lengths <= 120).all()


def test_group_must_fit_the_pool(model, tokenizer):
    task = get_task("textgame")
    with pytest.raises(ValueError, match="need as many environment workers"):
        _play(model, tokenizer, task, task.examples(split="train", count=2, seed=0), workers=3)


class _Crashing(TextGameTask):
    name = "crashing"

    def __init__(self):
        super().__init__()
        self.env = EnvSpec.of("faulty", module="tests.envs.faulty")

    def setup(self, example):
        return {}

    def parse_action(self, text):
        return "crash"


def test_a_crashing_environment_ends_its_episode_not_the_run(model, tokenizer):
    task = _Crashing()
    examples = get_task("textgame").examples(split="train", count=1, seed=0)
    groups, played, _ = _play(model, tokenizer, task, examples)
    assert [ep.status for ep in played[0]] == ["crashed", "crashed"]
    assert "died" in played[0][0].feedback
    assert not groups[0].loss_mask.any() and groups[0].lengths.min() >= 1


def test_one_pool_serves_successive_rollouts(model, tokenizer):
    """A training run keeps one pool: later rollouts reuse its environment processes."""
    task = get_task("textgame")
    options = EpisodeOptions(max_turns=2, episode_tokens=256, step_timeout=30.0,
                             reset_timeout=60.0)
    with env_pool(task, workers=4, options=options) as pool:
        for seed in range(2):
            groups, _, _ = play(model, tokenizer, task, task.examples(split="train", count=2,
                                                                      seed=seed),
                                key=jax.random.key(seed), params=PARAMS, group_size=2,
                                options=options, pool=pool)
            assert [g.size for g in groups] == [2, 2]
        assert pool.stats["workers"] == 4 and pool.stats["requests"] > 8
    with env_pool(_Crashing(), workers=2, options=options) as other:
        with pytest.raises(ValueError, match="runs environment 'faulty'"):
            play(model, tokenizer, task, task.examples(split="train", count=1, seed=0),
                 key=jax.random.key(0), params=PARAMS, group_size=2, options=options, pool=other)
