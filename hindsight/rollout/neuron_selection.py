"""Neuron-OPSD's data selection (spec ``other-methods.md`` §8, steps 1-4): the preparation
``neuron_selection`` (:mod:`hindsight.rollout.prepare`), run once per run with the frozen initial
policy.

1. The pool: ``pool_size`` training examples drawn from the run's seed (the whole train split of
   a fixed-list task when it is smaller), repeated questions kept once.
2. One zero-shot response per pool item from the frozen policy: greedy by default (OUR CHOICE:
   ``N(x)`` then describes the model's most likely answer, not one draw;
   ``zero_shot="rollout"`` samples at the rollout's settings instead). Nothing is verified: no
   label is read anywhere.
3. ``N(x)`` per item (:mod:`hindsight.signals.neurons`): the response teacher-forced after the
   question, each layer's neuron scores for the token each position predicts reduced inside the
   decoder's layer loop (:class:`hindsight.models.MLPReduce`): per chunk of response tokens the
   layer's top ``neurons_per_layer`` pairs, merged into a running top ``num_neurons`` over the
   layers; ``N(x)`` is the union over the chunks, a ``[L * F]`` mask. The scoring pass runs
   :data:`FORWARD_ROWS` rows at a time, so its memory is one layer's ``[rows, T, F]`` scores
   plus the running top-K, whatever the pool size or depth.
4. Consensus ``s(x) = |N(x)|``; the bottom ``select_fraction`` of the pool by ``s`` is trained on;
   each selected item's few-shot context is its ``num_shots`` nearest other pool items in Jaccard
   distance, each shown as its question and the frozen policy's own zero-shot response (OUR
   CHOICE: the spec's demonstrations are annotation-free, so they cannot be reference answers).

The result (pool prompts, zero-shot responses, ``s(x)``, the selection, each selected item's
neighbours and distances, the seconds of the zero-shot decode and of the scoring pass) is ``<workdir>/prepare/neuron_selection.json``; the run trains on a
:class:`~hindsight.rollout.prepare.TrainSubset` of the selected examples, each carrying its
demonstrations as ``extras["few_shot"]``, which the ``few_shot`` teacher-context part shows.
"""
from __future__ import annotations

import dataclasses
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hindsight.models import MLPReduce
from hindsight.rollout.prepare import PREPARATIONS, Preparation, PrepareInputs, TrainSubset
from hindsight.rollout.prompts import policy_prompt
from hindsight.rollout.runtime import fit_width, make_engine, request_key, with_eos
from hindsight.sampling.buckets import prompt_bucket
from hindsight.signals import (bottom_fraction, chunk_candidates, consensus, init_top,
                               jaccard_distances, merge_top, nearest, neuron_scores, union_mask)
from hindsight.tasks import EpisodeTask, Example

FORWARD_ROWS = 8
"""Rows per scoring forward pass: its working memory is one layer's float32 scores
``[rows, T, F]`` (8 x 256 x 4,864 floats, 40 MB, for Qwen2.5-0.5B at 256 new tokens)."""
ZERO_SHOT_STREAM = 0x4E53  # fold_in index of the zero-shot rollout's key (apart from the steps')


def pool_examples(task, *, pool_size: int, seed: int) -> list[Example]:
    """The selection pool: ``pool_size`` train examples of ``task`` drawn from ``seed`` (a
    fixed-list task's whole train split when it holds fewer), each question once: a generated
    task's small item space repeats questions, and a repeat would be its twin's nearest
    neighbour (distance 0 under greedy decoding), its own answer as a demonstration."""
    if isinstance(task, EpisodeTask):
        raise ValueError(f"task {task.name!r} is played as episodes; Neuron-OPSD's data selection "
                         f"needs single-turn questions")
    count = pool_size
    if hasattr(task, "split_examples"):
        count = min(pool_size, len(task.split_examples("train")))
    pool, seen = [], set()
    for ex in task.examples(split="train", count=count, seed=seed):
        if ex.prompt not in seen:
            seen.add(ex.prompt)
            pool.append(ex)
    return pool


def check_sizes(pool: int, config, prompts_per_step: int) -> None:
    """Raise ValueError unless the selection keeps at least ``prompts_per_step`` examples and each
    has a neighbour."""
    kept = math.ceil(config.select_fraction * pool)
    if pool < 2 or kept < prompts_per_step:
        raise ValueError(f"Neuron-OPSD's pool of {pool} examples (method_config.pool_size="
                         f"{config.pool_size}) keeps {kept} (method_config.select_fraction="
                         f"{config.select_fraction}), fewer than rollout.prompts_per_step="
                         f"{prompts_per_step} or without a neighbour; enlarge the pool")


def zero_shot(model, tokenizer, examples, *, params, key, slots: int | None = None,
              chunk_steps: int = 16) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """One response per example from ``model`` after its question (the policy prompt).

    Returns:
      ``(prompts, tokens, lengths)``: the prompt ids (int32 arrays), ``[P, T]`` int32 responses
      (0 after each length; ``T = params.max_new_tokens``), ``[P]`` int32 lengths.
    """
    width = params.max_new_tokens
    prompts = [np.asarray(policy_prompt(tokenizer, ex), np.int32) for ex in examples]
    engine = make_engine(model, params, longest_prompt=max(len(p) for p in prompts),
                         max_new_tokens=width, rows=len(prompts), slots=slots,
                         chunk_steps=chunk_steps, name="zero_shot")
    for k, prompt in enumerate(prompts):
        engine.submit(prompt, key=request_key(key, k), tag=k)
    results = engine.run()
    tokens = np.concatenate([fit_width(results[k].tokens, width) for k in range(len(prompts))])
    lengths = np.concatenate([results[k].lengths for k in range(len(prompts))])
    return prompts, tokens.astype(np.int32), lengths.astype(np.int32)


@nnx.jit(static_argnames=("start", "neurons_per_layer", "num_neurons", "chunk_tokens"))
def response_neuron_sets(model, tokens, positions, attention_mask, targets, mask, *, start: int,
                         neurons_per_layer: int, num_neurons: int,
                         chunk_tokens: int) -> jax.Array:
    """``N(x)`` of each row's response (spec §8 steps 1-2, :mod:`hindsight.signals.neurons`).

    Args:
      model: the decoder (any ``scan_layers``).
      tokens, positions, attention_mask: ``[B, S]`` the question left-padded to ``start`` tokens,
        then the response.
      targets: ``[B, T]`` int32 the response tokens: sequence position ``start - 1 + t``
        predicts ``targets[:, t]``.
      mask: ``[B, T]`` bool, the real response tokens.
      start, neurons_per_layer, num_neurons, chunk_tokens: static.
    Returns:
      ``[B, L * F]`` bool, neuron ``i`` of layer ``l`` at ``l * F + i``.
    """
    cfg = model.config
    b, t = targets.shape
    f = cfg.intermediate_size
    # e_y for every position: the unembedding column of the token it predicts, [B, T, D]
    unembed_rows = jnp.moveaxis(jnp.take(model.unembedding(), targets, axis=1), 0, -1)

    def step(top, activations, down_kernel, layer):
        scores = neuron_scores(activations[:, start - 1:start - 1 + t], down_kernel, unembed_rows)
        candidates = chunk_candidates(scores, mask, neurons_per_layer=neurons_per_layer,
                                      chunk_tokens=chunk_tokens)
        return merge_top(*top, candidates, layer * f)

    fold = MLPReduce(init_top(b, math.ceil(t / chunk_tokens), num_neurons=num_neurons), step)
    _, _, (values, ids) = model(tokens, positions, attention_mask=attention_mask,
                                return_hidden=True, mlp_reduce=fold)
    return union_mask(values, ids, size=cfg.num_layers * f)


def neuron_sets(model, prompts, responses: np.ndarray, lengths: np.ndarray, *,
                neurons_per_layer: int, num_neurons: int, chunk_tokens: int,
                rows: int = FORWARD_ROWS) -> np.ndarray:
    """``N(x)`` of every ``(prompt, response)`` pair, ``rows`` pairs per forward pass.

    Args:
      prompts: ``P`` prompt id arrays; responses: ``[P, T]`` int32; lengths: ``[P]`` int32.
    Returns:
      ``[P, L * F]`` bool.
    """
    p, t = responses.shape
    start = prompt_bucket(max(len(x) for x in prompts))  # one compiled shape for the pool
    span = np.arange(start + t)
    out = []
    for lo in range(0, p, rows):
        tokens = np.zeros((rows, start + t), np.int32)
        attention = np.zeros((rows, start + t), bool)
        positions = np.zeros((rows, start + t), np.int32)
        targets = np.zeros((rows, t), np.int32)
        mask = np.zeros((rows, t), bool)  # padding rows keep an empty mask: empty sets, dropped
        for r, i in enumerate(range(lo, min(lo + rows, p))):
            pad = start - len(prompts[i])
            tokens[r, pad:start] = prompts[i]
            tokens[r, start:] = responses[i]
            attention[r, pad:] = True
            positions[r] = np.maximum(span - pad, 0)
            targets[r] = responses[i]
            mask[r] = np.arange(t) < lengths[i]
        sets = response_neuron_sets(model, tokens, positions, attention, targets, mask,
                                    start=start, neurons_per_layer=neurons_per_layer,
                                    num_neurons=num_neurons, chunk_tokens=chunk_tokens)
        out.append(np.asarray(sets)[:min(rows, p - lo)])
    return np.concatenate(out)


def compute(task, model, tokenizer, *, config, inputs: PrepareInputs) -> dict:
    """Steps 1-4 on ``task``'s pool with the frozen ``model``; the JSON-able result (see the
    module doc)."""
    pool = pool_examples(task, pool_size=config.pool_size, seed=inputs.seed)
    check_sizes(len(pool), config, inputs.prompts_per_step)
    params = inputs.sampling
    if config.zero_shot == "greedy":
        params = dataclasses.replace(params, temperature=0.0)
    start = time.perf_counter()
    prompts, tokens, lengths = zero_shot(
        model, tokenizer, pool, params=with_eos(params, tokenizer),
        key=jax.random.fold_in(jax.random.key(inputs.seed), ZERO_SHOT_STREAM),
        slots=inputs.rollout.slots, chunk_steps=inputs.rollout.chunk_steps)
    decoded = time.perf_counter()
    sets = neuron_sets(model, prompts, tokens, lengths, neurons_per_layer=config.neurons_per_layer,
                       num_neurons=config.num_neurons, chunk_tokens=config.chunk_tokens)
    scored = time.perf_counter()
    sizes = np.asarray(consensus(sets))
    selected = np.asarray(bottom_fraction(jnp.asarray(sizes), fraction=config.select_fraction))
    distances = np.asarray(jaccard_distances(sets[selected], sets))
    neighbours = np.asarray(nearest(distances, k=config.num_shots, exclude=selected))
    return {"prompts": [ex.prompt for ex in pool],
            "responses": [tokenizer.decode([int(i) for i in tokens[k, :lengths[k]]],
                                           skip_special_tokens=True) for k in range(len(pool))],
            "consensus": sizes.tolist(), "selected": selected.tolist(),
            "neighbours": neighbours.tolist(),
            "distances": np.take_along_axis(distances, neighbours, 1).tolist(),
            "seconds": {"zero_shot": decoded - start, "neuron_sets": scored - decoded}}


def apply(task, result: dict, *, config, inputs: PrepareInputs) -> TrainSubset:
    """The selected pool items, each with its demonstrations (``extras["few_shot"]``: the
    neighbours' questions and zero-shot responses, nearest first)."""
    pool = pool_examples(task, pool_size=config.pool_size, seed=inputs.seed)
    if [ex.prompt for ex in pool] != result["prompts"]:
        raise ValueError(f"task {task.name!r} no longer draws the pool Neuron-OPSD selected from "
                         f"(its saved result holds other questions): the task changed since the "
                         f"run started; start a new run directory")
    check_sizes(len(pool), config, inputs.prompts_per_step)
    responses = result["responses"]
    examples = []
    for i, near in zip(result["selected"], result["neighbours"]):
        shots = tuple((pool[j].prompt, responses[j]) for j in near)
        extras = pool[i].extras + (("few_shot", shots),)
        examples.append(dataclasses.replace(pool[i], extras=extras))
    return TrainSubset(task, examples)


@PREPARATIONS.register("neuron_selection")
def neuron_selection() -> Preparation:
    return Preparation(compute=compute, apply=apply)
