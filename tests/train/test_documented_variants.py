"""Every documented config variant builds, and the SmolLM2 ones run their first rollout.

``configs/<method>.py:<variant>`` for every method, with the variants of ``configs/base.py``:
``tiny`` trains fully in tests/train/test_loop.py; here every ``smollm2-<task>`` (each registered
task) and ``demo`` variant resolves and passes the launcher's pre-flight checks (model name,
task options, sampling), and the default ``smollm2-count_letters`` variant of one method per rollout
shape and context set (:func:`_rollout_cases`) and the ``demo`` variants that ``make demo`` runs
(grpo, hdl) run the
loop's first rollout, :data:`ROLLOUT_TOKENS` new tokens long, (:func:`hindsight.train.loop.rollout_step`) on the real SmolLM2-135M-Instruct
and hand the method a batch its contract accepts; HDL's trees are checked against the real
weights (:func:`_check_trees`) (slow: the model is loaded once for the module).
"""
import importlib

import numpy as np
import pytest

from configs.base import DEFAULT_VARIANT
from hindsight.batch import check_batch
from hindsight.methods import REGISTRY
from hindsight.rollout import context_logprobs
from hindsight.tasks import get_task, synthetic
from hindsight.train.experiment import resolve
from hindsight.train.loop import load_policy, preflight, rollout_step
from hindsight.train.mesh import make_mesh

SMOLLM2_VARIANTS = ["demo", "smollm2-math"] + [f"smollm2-{t}" for t in synthetic.TASKS]
QWEN_VARIANTS = ["qwen0.5b-math", "qwen0.5b-humaneval"]


ROLLOUT_TOKENS = 32
# The rollout tests run float32 whatever `model.dtype=auto` picks on this CPU (bf16 where it has
# bf16 matmul instructions): HDL's tree check compares the sampler's log-probs with a re-score to
# 2e-4, and a bf16 decode and re-score round differently (~2e-2 apart).
ROLLOUT_DTYPE = "float32"
"""The first rollouts decode this many new tokens (a command-line override, as a user's
``--config.rollout.max_new_tokens``; every value derived from it is resolved after it), not the
variants' 96-128: the suite's time budget (the twelve rollouts took 13.5 min of one worker's time
at 128 tokens, 2026-12-02; five took 143 s at 48 tokens, 2026-12-04)."""


def _resolved(method: str, variant: str, max_new_tokens: int | None = None, dtype: str | None = None):
    config = importlib.import_module(f"configs.{method}").get_config(variant)
    if max_new_tokens is not None:
        config.rollout.max_new_tokens = max_new_tokens
    if dtype is not None:
        config.model.dtype = dtype
    xp = resolve(config)
    return xp, *preflight(xp)


@pytest.mark.parametrize("method", sorted(REGISTRY))
@pytest.mark.parametrize("variant", SMOLLM2_VARIANTS)
def test_every_smollm2_variant_passes_preflight(method, variant):
    xp, task, sampling = _resolved(method, variant)
    assert xp.config.method == method and xp.config.model.name == "smollm2-135m-instruct"
    assert sampling.max_new_tokens == xp.config.rollout.max_new_tokens


@pytest.mark.parametrize("method", sorted(REGISTRY))
@pytest.mark.parametrize("variant", QWEN_VARIANTS)
def test_every_qwen_variant_resolves(method, variant):
    """The model is optional (``make qwen``), so only the config and the task are checked."""
    config = importlib.import_module(f"configs.{method}").get_config(variant)
    xp = resolve(config)
    assert xp.config.model.name == "qwen2.5-coder-0.5b-instruct"
    get_task(xp.config.task.name, **xp.config.task.options)


def _rollout_cases():
    # One method per rollout shape and set of contexts (what the first rollout builds differs only
    # by these): grpo (group, no context), opsd_pmi (group + teacher + probe: the teacher
    # context's path too), dapo (dynamic), hdl (trees). Left out for the suite's time budget, their configs
    # passing the preflight test above:
    # * craft (group + teacher: opsd_pmi's rollout builds the same plus the probe context; passed
    #   in the suite up to 2026-12-04, 24 s at 48 tokens);
    # * drgrpo (as grpo), opsd, pcsd, demopsd (as craft): all passed in the suite up to 06e4c86
    #   (34-36 s each on a busy 2-core machine); rlsd (as craft: group + teacher context);
    # * seed (as craft, plus the skill each group writes from a row's cache: SmolLM2's chat
    #   template continued after its own end-of-turn; passed when run on 2026-12-04, a 30 s
    #   rollout, every group with a skill);
    # * hdl on smollm2-reverse (the README's example; as hdl on smollm2-count_letters, 75 s) and
    #   the smollm2-<task> rollouts of grpo, dapo and hdl on the other tasks (all passed when run on
    #   2026-12-02, 1-2 min each for dapo/hdl);
    # * the ``demo`` variants: the same task, model, sampling and group shape as their
    #   smollm2-count_letters rollout, which this test runs at the same width (``ROLLOUT_TOKENS``);
    #   they differ in prompts per step and slots (4 through 8 vs 2 through 32), the reflection
    #   caps (12 vs 16) and step counts (``make demo`` runs them in full; every method's passed
    #   up to d835f11, grpo's and hdl's up to 82610bc).
    return [(m, DEFAULT_VARIANT) for m in ("dapo", "grpo", "hdl", "opsd_pmi")]


@pytest.fixture(scope="module")
def smollm2():
    xp, _, _ = _resolved("grpo", DEFAULT_VARIANT, ROLLOUT_TOKENS, ROLLOUT_DTYPE)
    return xp.config.model, load_policy(xp.config.model, make_mesh(xp.config.train.mesh))


@pytest.mark.slow
@pytest.mark.parametrize("method, variant", _rollout_cases())
def test_documented_smollm2_variant_runs_its_first_rollout(smollm2, method, variant):
    section, (model, tokenizer) = smollm2
    xp, task, sampling = _resolved(method, variant, ROLLOUT_TOKENS, ROLLOUT_DTYPE)
    assert xp.config.model == section  # every SmolLM2 variant shares the loaded model
    batch, stats = rollout_step(xp, model, tokenizer, task, sampling, step=0)
    m = xp.method
    rows, width = check_batch(batch, method=method, contexts=m.contexts, fields=m.fields)
    assert width == xp.config.rollout.max_new_tokens == ROLLOUT_TOKENS
    assert rows == xp.rows
    assert rows % m.group_size == 0 and rows // m.group_size == xp.config.rollout.prompts_per_step
    mask = np.asarray(batch["mask"]) > 0
    assert mask.any(axis=1).sum() >= rows // 2   # responses were generated
    assert np.all(np.isfinite(np.asarray(batch["logp_old"])[mask]))
    assert np.all(np.asarray(batch["logp_old"])[mask] <= 0)
    rewards = np.asarray(batch["rewards"])
    assert np.all(np.isfinite(rewards)) and np.all(np.isfinite(np.asarray(batch["advantages"])))
    assert sum(stats.generated_tokens) >= int(mask.sum())
    if method == "hdl":
        _check_trees(batch, stats, model, sampling)


TREE_ROWS = {0: (0, range(1, 5)), 1: (0, range(5, 8)), 2: (8, range(9, 13)), 3: (8, range(13, 16))}
"""HDL's group of 16 rows: branch point i (two per root) -> (its root's row, its continuations)."""


def _check_trees(batch, stats, model, sampling):
    """HDL trees from real weights: each group's sampled tokens are its rows' loss tokens (the
    continuations' suffixes) plus its reflections; a continuation repeats its root's tokens up to
    its branch point (it was branched from the root's cache); the first group's ``logp_old``
    equals a re-score of its whole sequences at the sampling temperature."""
    targets, mask = np.asarray(batch["targets"]), np.asarray(batch["mask"]) > 0
    assert len(stats.branch_positions) == len(stats.generated_tokens) == targets.shape[0] // 16
    assert len(stats.reflections) >= 1 and sum(stats.reflection_tokens) > 0
    for g, points in enumerate(stats.branch_positions):
        rows = slice(16 * g, 16 * (g + 1))
        assert stats.generated_tokens[g] == int(mask[rows].sum()) + stats.reflection_tokens[g]
        for i, b in enumerate(np.array(points).reshape(-1)):
            if b > 0:
                root, continuations = TREE_ROWS[i]
                for r in continuations:
                    np.testing.assert_array_equal(targets[16 * g + r, :b],
                                                  targets[16 * g + root, :b])
    # the first group only: the re-score materialises [rows, S, V] float32 logits
    first = {k: np.asarray(batch[k])[:16]
             for k in ("tokens", "positions", "attention_mask", "target_index", "targets")}
    lp = context_logprobs(model, first, temperature=sampling.policy_temperature)
    np.testing.assert_allclose(np.where(mask[:16], lp, 0),
                               np.where(mask[:16], np.asarray(batch["logp_old"])[:16], 0), atol=2e-4)
