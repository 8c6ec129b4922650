"""BIRD: prompt-switch SFT on the policy's own correct samples under a concise instruction, then
on-policy self-distillation warm-started from it, with the same network under the concise
instruction as the teacher (seed ``003_*``, "BIRD"; there is no spec section: this docstring is
the spec, written from the seed's summary of the paper, OUR CHOICE where we choose).

    python -m experiments.run --config=configs/bird.py:tiny --workdir=/tmp/b
    python -m experiments.run --config=configs/bird.py:smollm2-math --workdir=runs/bird-math \\
        --config.stages.sft.train.num_steps=4 --config.stages.opsd.train.num_steps=4

A multi-stage config (:mod:`hindsight.train.stages`): ``stages.sft`` then ``stages.opsd``, each a
full experiment config of the registered method of that name, so BIRD has no loss of its own.
One command runs both (stage ``k`` in ``<workdir>/stage<k>-<method>``, each with its resolved
``config.json``); the same command again resumes the stage in progress. Variants: those of
``configs/base.py`` for single-turn tasks (``tiny``: the random model on ``even_length``;
``smollm2-math``: SmolLM2-135M-Instruct on ``math_word``; ...), applied to both stages.

Notation: ``x`` a training question, ``c`` the concise instruction (``Templates.concise_part``,
OUR CHOICE wording: the seed quotes it only as "answer concisely"), ``y`` a response.

**Stage 1, Prompt-Switch SFT** (static bootstrap; ``sft`` with ``completions="policy"``):

1. For each training question ``x`` the policy samples under ``x + c`` (the context recipe
   ``("concise",)``: the same text the stage-2 teacher reads). The seed samples one trajectory;
   OUR CHOICE: ``num_samples=4``, so a small model keeps a sample for more questions.
2. Only samples whose answer the task's verifier accepts (reward >= 0.5) are kept; OUR CHOICE:
   only samples that ended before the cap (``finished_only``: a sample cut at the cap has no
   final answer even when a lenient verifier finds one in it, and trained on, it teaches the
   policy not to end; seen on ``smollm2-count_letters``, where such a 128-token cut sample was
   the one correct sample of its question).
3. OUR CHOICE: of several correct samples the shortest is kept (``select="shortest"``, the concise
   one; ``"first"`` keeps the first in sampling order, the seed's single sample when
   ``num_samples=1``).
4. Prompt switch: the kept ``y`` is trained after the plain question ``x`` (``prompt_switch``),
   ``L = -mean_t log pi(y_t | x, y_<t)``, token mean; the concise style becomes the default, not
   a response to the instruction. A question with no correct sample gives a row with loss mask 0
   (the batch keeps one row per question). Metrics: ``kept_fraction``, ``kept_length`` vs
   ``sampled_length``, ``sampled_reward``.

   Seed: one epoch, one trajectory per question, at most 2,048 tokens, LoRA. Here: every step
   draws new questions (generated tasks never repeat one; a fixed dataset is one epoch for
   ``train.num_steps * rollout.prompts_per_step`` up to its size), one row per question, the
   samples capped at ``rollout.max_new_tokens`` (<= 2,048 in every variant), and full
   fine-tuning (OUR CHOICE: the library has no LoRA). The loss and the samples are at
   temperature 1 (plain cross-entropy; the variant's min-p / top-p still truncate the samples).

**Stage 2, Warm-Start OPSD** (dynamic refinement; ``opsd``):

1. The policy starts from stage 1's final params (``model.init_from``, set to stage 1's run
   directory by :func:`hindsight.train.stages.run_stages`).
2. The student samples ``y ~ pi_theta(. | x)`` (the plain question; groups as the variant's).
3. The teacher is ``p_t = pi_bar(. | x, c, y_<t)``: the same network under the question and the
   concise instruction (``teacher_context=("concise",)``), ``pi_bar`` a stop-gradient copy of the
   student synced periodically. OUR CHOICE: the EMA reference (``teacher="reference"``,
   ``train.reference="ema"``, ``train.ema_decay=0.95``: SDPO's rate 0.05), updated after every
   optimizer update and starting at stage 1's params: the library's closest to a periodic copy
   (an EMA of decay ``d`` lags ``d / (1 - d) = 19`` updates on average, a copy synced every
   ``K`` updates ``(K - 1) / 2``).
4. Loss: the reverse KL ``KL(q_t || p_t) = sum_v q_t(v) log(q_t(v) / p_t(v))``, ``q_t =
   pi_theta(. | x, y_<t)``, over the full vocabulary (``beta=1.0``, ``divergence="full"``),
   token mean, logits divided by the sampling temperature (the variant's). The seed applies the
   KL to the first 1,024 response tokens; here the response cap ``rollout.max_new_tokens``
   (<= 1,024 in every variant) bounds it: no position past it is sampled.

Not here: the paper's benchmarks (MATH-500, AIME) and its token-efficiency metric
``accuracy / ln(length)``; the held-out reward each stage reports is the task's.
"""
import ml_collections

import configs.opsd
import configs.sft

STAGE_ORDER = ("sft", "opsd")
CONCISE = ("concise",)


def get_config(variant: str | None = None):
    sft = configs.sft.get_config(variant)
    sft.method_config.update(completions="policy", num_samples=4, sample_context=CONCISE,
                             select="shortest", prompt_switch=True, finished_only=True)
    opsd = configs.opsd.get_config(variant)
    opsd.method_config.update(teacher_context=CONCISE, beta=1.0, divergence="full",
                              teacher="reference")
    opsd.train.update(reference="ema", ema_decay=0.95)
    config = ml_collections.ConfigDict()
    config.stages = ml_collections.ConfigDict({"sft": sft, "opsd": opsd})
    config.stage_order = STAGE_ORDER
    return config
