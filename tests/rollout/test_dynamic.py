"""DAPO dynamic sampling with a scripted verifier: all-equal groups dropped, refill until the target
or the cap, overlong shaping in tokens."""
import jax
import numpy as np

from hindsight.objectives import group_advantages, overlong_penalty
from hindsight.rollout import RolloutConfig, collect
from hindsight.sampling import SamplingParams
from tests.rollout.helpers import ScriptedTask, configured, examples

PARAMS = SamplingParams(max_new_tokens=16)
KINDS = ("zero", "mixed", "one", "zero", "mixed", "mixed", "mixed", "mixed")


def _run(model, tokenizer, **overrides):
    method = configured("dapo", group_size=2, max_new_tokens=16,
                        **{"overlong_buffer": 8, **overrides})
    return collect(method, model, tokenizer, ScriptedTask(), examples(*KINDS),
                   key=jax.random.key(2), sampling=PARAMS,
                   rollout=RolloutConfig(stop_at_eos=False), num_groups=2)


def test_refill_until_enough_mixed_groups(model, tokenizer):
    batch, stats = _run(model, tokenizer)
    # batch 1: zero (drop), mixed; batch 2: one, zero (both dropped); batch 3: mixed, mixed
    assert (stats.gen_batches, stats.dropped_groups, stats.filled_groups) == (3, 3, 0)
    assert stats.num_groups == 2 and batch["targets"].shape == (4, 16)
    verifier = np.array([1, 0, 1, 0], np.float32)  # both kept groups are "mixed"
    lengths = (batch["mask"] > 0).sum(1)
    assert (lengths == 16).all()  # stop tokens off: every row hits L_max, penalty -1
    shaped = verifier + np.asarray(overlong_penalty(lengths, max_length=16, buffer=8))
    np.testing.assert_allclose(batch["rewards"], shaped)
    np.testing.assert_allclose(batch["rewards"], verifier - 1.0)
    np.testing.assert_allclose(batch["advantages"], group_advantages(shaped, 2))
    assert stats.reward_mean == 0.5  # verifier rewards, before shaping


def test_cap_stops_refill_and_fills_with_zero_advantage_groups(model, tokenizer):
    batch, stats = _run(model, tokenizer, max_num_gen_batches=2)
    assert (stats.gen_batches, stats.dropped_groups, stats.filled_groups) == (2, 3, 1)
    np.testing.assert_array_equal(batch["advantages"][2:], 0.0)  # the filler ("zero" group 3)
    assert np.abs(batch["advantages"][:2]).min() > 0.5
    no_shaping = _run(model, tokenizer, overlong=False)[0]
    np.testing.assert_allclose(no_shaping["rewards"], [1, 0, 1, 0])
