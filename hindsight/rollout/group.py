"""GRPO groups: ``G`` independent samples per prompt, verified (spec §1.1).

Each prompt is one engine request (prefilled once, fanned out to ``G`` slots); the group goes to
the verifier's workers as soon as its rows finish, while other prompts keep decoding.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hindsight.rollout.assemble import GroupRows
from hindsight.rollout.prompts import policy_prompt
from hindsight.rollout.runtime import PhaseClock, fit_width, longest, make_engine, request_key
from hindsight.rollout.verification import Checked, Verifier
from hindsight.sampling import SamplingParams
from hindsight.tasks import Example


def sample_groups(model, tokenizer, verifier: Verifier, examples: Sequence[Example], *, key,
                  params: SamplingParams, group_size: int, slots: int | None = None,
                  chunk_steps: int = 16, clock: PhaseClock | None = None,
                  first_index: int = 0, prompts=None, writer=None) -> list[GroupRows]:
    """Sample and verify ``group_size`` responses for each example.

    Args:
      verifier: checks each group's rows (its task's ``verify``) while other prompts decode.
      examples: P examples; group ``k`` answers ``examples[k]``.
      key: PRNG key; request ``k`` uses ``fold_in(key, first_index + k)``, so a prompt's samples do
        not depend on which batch or slot it lands in.
      params: sampling parameters (stop tokens included); ``T = params.max_new_tokens``.
      group_size: ``G``.
      slots, chunk_steps: engine settings (:func:`hindsight.rollout.runtime.make_engine`).
      clock: records seconds and tokens under ``"roots"``, and ``"verify"`` / ``"verify_wait"``
        (:meth:`hindsight.rollout.runtime.PhaseClock.run`).
      first_index: offset of ``examples[0]`` in the caller's numbering (``example_index``).
      prompts: P token-id lists the rows are sampled after (default: each example's policy
        prompt, :func:`hindsight.rollout.prompts.policy_prompt`).
      writer: a :class:`hindsight.rollout.generated.PartWriter`: after its verdicts each group
        writes its generated context parts (SEED's skills) from its rows' caches in the same
        engine (sized for the writer's turns); None: none.
    Returns:
      P :class:`GroupRows` in example order, ``loss_mask`` = the response mask.
    """
    clock = clock if clock is not None else PhaseClock()
    width = params.max_new_tokens
    if prompts is None:
        prompts = [policy_prompt(tokenizer, ex) for ex in examples]
    if len(prompts) != len(examples):
        raise ValueError(f"{len(prompts)} prompts for {len(examples)} examples")
    prompts = [np.asarray(p, np.int32) for p in prompts]
    room = 0 if writer is None else longest(prompts) + width + writer.room()
    engine = make_engine(model, params, longest_prompt=longest(prompts), max_new_tokens=width,
                         rows=len(prompts) * group_size, slots=slots, chunk_steps=chunk_steps,
                         min_len=room)
    for k, prompt in enumerate(prompts):
        engine.submit(prompt, num_samples=group_size, key=request_key(key, first_index + k),
                      keep_cache=writer is not None, tag=k)
    groups: dict[int, GroupRows] = {}

    def on_result(tag, res):
        if isinstance(tag, tuple):  # a generated part: (group, part name)
            writer.store(groups[tag[0]], tag[1], res)
            return
        k = tag
        clock.tokens["roots"] += int(res.lengths.sum())
        tokens = fit_width(res.tokens, width)

        def verified(checked: Checked):
            groups[k] = GroupRows(
                example=examples[k], example_index=first_index + k, prompt=prompts[k],
                tokens=tokens, lengths=res.lengths.astype(np.int32),
                logprobs=fit_width(res.logprobs, width),
                policy_logprobs=fit_width(res.policy_logprobs, width),
                loss_mask=fit_width(res.mask, width), rewards=checked.rewards,
                branch_positions=np.zeros(group_size, np.int32), texts=checked.texts,
                feedback=checked.feedback, generated_tokens=int(res.lengths.sum()))
            if writer is not None:
                writer.submit(engine, k, groups[k], res)

        with clock.host_phase("verify"):
            verifier.submit(examples[k], tokens, res.lengths, verified)

    clock.run([engine], on_result, verifier)
    return [groups[k] for k in range(len(prompts))]
