"""Shared pieces of every experiment config: the full key set with defaults, and the variants.

A method's file is ``get_config(variant)`` = :func:`experiment` (every key of
:class:`hindsight.train.experiment.ExperimentConfig`, ``method_config`` filled with the method's
spec defaults, so any key can be overridden from the command line) + the method's own settings +
one of :data:`VARIANTS`::

    python -m experiments.run --config=configs/hdl.py:smollm2-count_letters --config.train.num_steps=5

Variants (the part after ``:``):
  * ``smollm2-<task>`` (default ``smollm2-count_letters``): SmolLM2-135M-Instruct on a synthetic
    task with step-by-step explanations (temperature 0.7, min-p 0.2), the documented longer run
    (16 steps of 2 prompts, held-out greedy reward on 32 test items every 4 steps).
  * ``smollm2-math``, ``qwen0.5b-math``, ``qwen0.5b-humaneval``: real tasks (procedural math word
    problems checked by math-verify; HumanEval run in the sandbox) on the embedded models
    (``make qwen`` installs Qwen2.5-Coder-0.5B-Instruct), a few steps on 2 CPU cores.
  * ``demo``: what ``make demo`` runs per method: a few steps, minutes on 2 CPU cores.
  * ``tiny``: the 2-layer random ``tiny-random`` model on ``even_length`` (which it solves about
    half the time, so every method gets a gradient), seconds per step (tests, smoke runs).
  * ``tiny-textgame``: ``tiny-random`` playing 3-turn episodes of the ``textgame`` environment
    (methods on the ``group`` rollout without teacher contexts, and HDL: trees of 8 episodes).
  * ``smollm2-scienceworld``, ``smollm2-search_qa``: SmolLM2 playing ScienceWorld episodes (up to 8
    actions) or search-augmented QA (up to 4 turns), 2 prompts x 4 episodes per step (HDL: 2
    trees of 2 x (1 + 2 + 1) episodes).
"""
from __future__ import annotations

import dataclasses
import types
import typing

import ml_collections
from ml_collections import config_dict

from hindsight.methods import get_method
from hindsight.tasks import synthetic
from hindsight.train.experiment import ExperimentConfig

VARIANTS = ("smollm2-<task>", "smollm2-math", "qwen0.5b-math", "qwen0.5b-humaneval",
            "smollm2-scienceworld", "smollm2-search_qa", "demo", "tiny", "tiny-textgame")
DEFAULT_VARIANT = "smollm2-count_letters"


def _optional_type(hint):
    """``int | None`` -> ``int`` (for a typed placeholder), else None."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:   # ``tuple[int, ...] | None`` -> ``tuple``
            return typing.get_origin(args[0]) or args[0]
    return None


def _as_config(obj) -> ml_collections.ConfigDict:
    """A dataclass instance -> ConfigDict; ``None`` fields become typed placeholders so they can
    be set from the command line."""
    hints = typing.get_type_hints(type(obj))
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out[f.name] = _as_config(value)
        elif value is None and _optional_type(hints[f.name]) is not None:
            out[f.name] = config_dict.placeholder(_optional_type(hints[f.name]))
        else:
            out[f.name] = value
    return ml_collections.ConfigDict(out)


def experiment(method: str) -> ml_collections.ConfigDict:
    """Every key with its default for ``method``.

    The options that follow the rollout section (:meth:`hindsight.methods.Method.derived_options`:
    the loss temperature, CRAFT's group size, DAPO's overlong window, Dr.GRPO's normaliser) are
    typed placeholders (None): they are derived after the command line is applied, and a value set
    on the command line wins. The method's spec temperature becomes the rollout's default (the
    two must agree, so it is set in one place)."""
    m = get_method(method)
    config = _as_config(ExperimentConfig(method=method))
    options = _as_config(m.config)
    if "temperature" in m.option_names():
        config.rollout.temperature = m.config.temperature
    hints = typing.get_type_hints(type(m.config))
    for name in m.derived_options(ExperimentConfig().rollout):
        kind = _optional_type(hints[name]) or hints[name]
        options[name] = config_dict.placeholder(kind)
    config.method_config = options
    return config


def _smollm2_sampling(config: ml_collections.ConfigDict, task: str) -> None:
    """SmolLM2 on ``task`` with step-by-step explanations at temperature 0.7, min-p 0.2.

    Why: at temperature 1 without truncation SmolLM2-135M-Instruct solves almost none of the
    synthetic items (reverse: 0 of 128 rows in the session-2 demo, so every group had zero
    advantage and zero gradient); at 0.7 / min-p 0.2 with ``style="explain"`` it writes coherent
    explanations of ~100 tokens (the length HDL's token economics are measured on) and solves
    ~25% of ``count_letters`` items (``experiments/bench/hdl_tokens.py``)."""
    config.task.name = task
    config.task.options = {"style": "explain"}
    config.rollout.update(temperature=0.7, min_p=0.2)


MODELS = {"smollm2": "smollm2-135m-instruct", "qwen0.5b": "qwen2.5-coder-0.5b-instruct"}


def _real_task(config: ml_collections.ConfigDict, variant: str, *, hdl: bool) -> None:
    """``<model>-math`` (the procedural ``math_word`` task, answers in ``\\boxed{}``) and
    ``qwen0.5b-humaneval`` (HumanEval: 136 problems trained on, the other 28 held out by a hash of the task id:
    ``task.options.train_fraction``), a few steps on 2 CPU cores.

    Sampling: SmolLM2 as the synthetic variants (temperature 0.7, min-p 0.2); Qwen2.5-Coder at its
    generation config's temperature 0.7, top-p 0.8, top-k 20. Responses are capped at 256 tokens
    (HumanEval: 384; the model's greedy solutions average ~150 tokens)."""
    model, task = variant.split("-", 1)
    config.model.name = MODELS[model]
    if task == "math":
        config.task.name = "math_word"
        config.task.options = {"style": "reasoning"}
    else:
        config.task.name = "humaneval"
        config.task.options = {"train_fraction": 0.8}
    if model == "smollm2":
        config.rollout.update(temperature=0.7, min_p=0.2)
    else:
        config.rollout.update(temperature=0.7, top_p=0.8, top_k=20)
    config.rollout.update(prompts_per_step=2, max_new_tokens=384 if task == "humaneval" else 256,
                          slots=32, reflection_max_tokens=32, hindsight_reflection_tokens=32,
                          feedback_max_tokens=48)
    if not hdl:
        config.rollout.group_size = 8
    config.train.update(num_steps=8, save_every=2)
    config.train.optim.update(learning_rate=1e-6 if model == "qwen0.5b" else 2e-5)
    config.eval.update(num_examples=32, every=0)


def apply_variant(config: ml_collections.ConfigDict,
                  variant: str | None) -> ml_collections.ConfigDict:
    """Set the model / task / sizes of ``variant`` (see the module doc)."""
    variant = variant or DEFAULT_VARIANT
    hdl = get_method(config.method).rollout == "hdl_tree"
    if variant == "tiny":
        # The random model solves even_length about half the time: mixed rewards, a gradient.
        config.model.update(name="tiny-random", dtype="float32")  # tests compare float32 numbers
        config.task.name = "even_length"
        config.rollout.update(prompts_per_step=2, max_new_tokens=24, slots=16,
                              reflection_max_tokens=16, hindsight_reflection_tokens=16,
                              feedback_max_tokens=48)  # one character per token
        if not hdl:
            config.rollout.group_size = 4
        config.train.update(num_steps=3, save_every=2)
        config.train.optim.update(name="sgd", learning_rate=0.1)
        config.eval.update(num_examples=4, every=0)
        if hdl:
            config.method_config.update(tail_guard=2, min_gap_floor=2)
    elif variant == "tiny-textgame":
        # episodes in the test environment: the random model mostly writes invalid actions, so
        # rewards are rare; this variant exercises the episode path end to end in seconds
        config.model.update(name="tiny-random", dtype="float32")
        config.task.name = "textgame"
        config.rollout.update(prompts_per_step=2, max_new_tokens=16, slots=8, max_turns=3,
                              episode_tokens=384)
        config.rollout.group_size = 2
        config.train.update(num_steps=2, save_every=2)
        config.train.optim.update(name="sgd", learning_rate=0.1)
        config.eval.update(num_examples=2, every=0)
        if hdl:  # trees of 2 x (1 + 2 + 1) = 8 episodes; a random model's turns are short
            config.method_config.update(counts=(2, 1), tail_guard=2, min_gap_floor=2)
            config.rollout.update(reflection_max_tokens=8, hindsight_reflection_tokens=8,
                                  feedback_max_tokens=48)
    elif variant == "demo":
        _smollm2_sampling(config, "count_letters")
        # 4 prompts x 16 rows through 8 slots: more rows than slots, as in a training step
        # (throughput-bound). At 2 prompts / 32 slots (the demo before 2026-12-07) GRPO's 32 rows
        # decoded in one pass while HDL's trees ran their phases one after another, so HDL's
        # rollout was the slower one (wall-clock saving -0.28 for a token saving of 0.32 on a Zen 5
        # EPYC). Here GRPO decodes no slower per token than there (224 vs 212 tok/s) and HDL's
        # saving shows in time (Zen 5: 0.13-0.17 for a token saving of 0.29; `hdl_tokens` at this
        # shape 0.28 for 0.40), for twice the rows per update (about 7 instead of 4 minutes)
        config.rollout.update(prompts_per_step=4, max_new_tokens=96, slots=8,
                              reflection_max_tokens=12, hindsight_reflection_tokens=12)
        config.train.update(num_steps=3, save_every=3)
        config.train.optim.update(learning_rate=1e-5)
        config.eval.update(num_examples=16, every=0)
        # float32 on every machine (not `auto`, which is bf16 on a CPU with bf16 matmul
        # instructions): the demo then samples the same tokens, rewards and held-out scores on
        # every machine kind (seen on an AVX2-only and a Zen 5 AMD EPYC: token saving 0.325,
        # held-out 0 -> 0.50 / 0.56), so its figures compare across machines; bf16 took 3.1 instead
        # of 4.2 minutes on the Zen 5 and sampled other tokens (token saving 0.13)
        config.model.dtype = "float32"
        if hdl:
            # the head guard (OUR CHOICE, `hindsight.methods.hdl.min_prefix`): branch points in
            # the first quarter of a root are where h's wording shows, and a continuation from
            # there regenerates most of a response. At this shape (hdl_tokens, P = 2, T = 96,
            # 32 slots, float32) the spec's t >= 1 gave a token saving of 0.20 (branch points at
            # 0.31 of the root), the guard 0.37 (0.53), in the paper's 0.35-0.61
            config.method_config.min_prefix_fraction = 0.25
    elif variant in ("smollm2-scienceworld", "smollm2-search_qa"):
        # SmolLM2 playing episodes: ScienceWorld's CPU-sized subset (gold paths of 5-10 actions)
        # or search-augmented QA over the shipped corpus; 2 prompts x 4 episodes per step
        task = variant[len("smollm2-"):]
        config.model.name = MODELS["smollm2"]
        config.task.name = task
        config.rollout.update(temperature=0.7, min_p=0.2, prompts_per_step=2, slots=8,
                              max_new_tokens=48)
        if task == "scienceworld":
            config.rollout.update(max_turns=8, episode_tokens=1536)
        else:
            config.rollout.update(max_turns=4, episode_tokens=768)
        config.rollout.group_size = 4
        config.train.update(num_steps=4, save_every=2)
        config.train.optim.update(learning_rate=2e-5)
        config.eval.update(num_examples=3, every=0)
        if hdl:  # trees of 2 x (1 + 2 + 1) = 8 episodes, reflections on the game's feedback
            config.method_config.update(counts=(2, 1))
            config.rollout.update(reflection_max_tokens=32, hindsight_reflection_tokens=32,
                                  feedback_max_tokens=64)
            # 16 episodes of up to 1,536 tokens: one update over all of them held 16 GB on the
            # 24 GB machine (float32 [B, K, G, S, S] attention scores), so 4 rows at a time
            config.train.num_microbatches = 4
    elif variant in ("smollm2-math", "qwen0.5b-math", "qwen0.5b-humaneval"):
        _real_task(config, variant, hdl=hdl)
    elif variant.startswith("smollm2-"):
        task = variant[len("smollm2-"):]
        if task not in synthetic.TASKS:
            raise ValueError(f"unknown config variant {variant!r}: smollm2-<task> takes a "
                             f"synthetic task {list(synthetic.TASKS)}; known: {list(VARIANTS)}")
        _smollm2_sampling(config, task)
        config.rollout.update(prompts_per_step=2, max_new_tokens=128, slots=32,
                              reflection_max_tokens=16, hindsight_reflection_tokens=16)
        config.train.update(num_steps=16, save_every=4)
        config.train.optim.update(learning_rate=2e-5)
        config.eval.update(num_examples=32, every=4)
    else:
        raise ValueError(f"unknown config variant {variant!r}; known: {list(VARIANTS)}")
    if hdl:
        config.rollout.group_size = None
    return config


def method_file(method: str, variant: str | None) -> ml_collections.ConfigDict:
    """The start of every ``configs/<method>.py``: the method's keys, then the variant."""
    return apply_variant(experiment(method), variant)
