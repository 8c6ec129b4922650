"""SEED's two stages from one command (spec other-methods §11; "SEED: Self-Evolving On-Policy
Distillation", arXiv 2607.14777): SFT that teaches the policy to write skills from its finished
trajectories, then the ``seed`` method warm-started from it.

    python -m experiments.run --config=configs/seed_stages.py:tiny --workdir=/tmp/seed
    python -m experiments.run --config=configs/seed_stages.py:smollm2-math --workdir=runs/seed \\
        --config.stages.sft.train.num_steps=4 --config.stages.seed.train.num_steps=4

A multi-stage config (:mod:`hindsight.train.stages`): ``stages.sft`` then ``stages.seed``, each a
full experiment config of the registered method of that name (stage ``k`` in
``<workdir>/stage<k>-<method>``); the same command again resumes the stage in progress.
Variants: those of ``configs/base.py`` for single-turn tasks, applied to both stages.

**Stage 1, skill-writing SFT** (``sft`` with ``completions="generated"``; the paper: SFT on 180
tasks x 8 rollouts so the policy "can write hindsight skills from finished trajectories"; its
data is not described further, so the source is OUR CHOICE):

1. For each training question the policy samples ``num_samples = 8`` answers (the paper's 8
   rollouts per task) after the plain question, verified.
2. It writes the group's skill exactly as in stage 2 (:mod:`hindsight.rollout.generated`,
   ``skill``): the conversation of the group's first finished success (else first finished
   failure) is continued with the request turn (``Templates.skill_request``), at most
   ``rollout.generated_max_tokens`` tokens, in the rollout's engine from the row's cache.
3. OUR CHOICE, usefulness: the skill is kept only when conditioning on it raises the mean
   log-prob of the group's successful answers, ``Delta = mean_t [log pi(y_t | question + skill)
   - log pi(y_t | question)] > 0`` over every token of the successes, the stage-2 teacher's
   context against the policy's (``select="useful"``,
   :func:`hindsight.rollout.generated.context_gain`); a group without a success has nothing to
   score and keeps none; with ``finished_only`` only skills that ended before their cap.
4. The kept skill is trained after the conversation that asked for it (question, answer,
   request turn): ``L = -mean_t log pi(s_t | conversation, s_<t)``, token mean, temperature 1;
   a question without a kept skill gives a row with loss mask 0. Metrics: ``kept_fraction``,
   ``kept_length`` / ``sampled_length`` (tokens of kept / written skills), ``sampled_reward``.

   The skills are the policy's own (rejection-sampling fine-tuning on skills): stage 1 sharpens
   what the initial policy already writes towards what its own teacher finds supportive.

**Stage 2** (``seed``, :mod:`hindsight.methods.seed`): warm-started from stage 1's final params
(``model.init_from``), GRPO + ``0.01 x`` SDAR's gated distillation towards the policy conditioned
on the skill it writes for each group during the rollout (``beta = 5``).
"""
import ml_collections

import configs.seed
import configs.sft

STAGE_ORDER = ("sft", "seed")


def get_config(variant: str | None = None):
    seed = configs.seed.get_config(variant)
    sft = configs.sft.get_config(variant)
    sft.method_config.update(completions="generated", generated_part="skill", num_samples=8,
                             select="useful", finished_only=True)
    # the skills stage 1 teaches are the ones stage 2 writes
    sft.rollout.generated_max_tokens = seed.rollout.generated_max_tokens
    config = ml_collections.ConfigDict()
    config.stages = ml_collections.ConfigDict({"sft": sft, "seed": seed})
    config.stage_order = STAGE_ORDER
    return config
