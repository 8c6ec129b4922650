"""DAPO dynamic sampling (spec §1.2): keep sampling generation batches, drop the groups whose
verifier rewards are all equal (no learning signal), until ``P`` mixed groups are kept or
``max_num_gen_batches`` batches were generated (<= 0: unlimited).

Overlong shaping is applied to the kept rows by the caller (:func:`hindsight.methods.dapo.
shaped_rewards`); the filter reads the verifier reward (DAPO's accuracy metric), not the shaped one,
so a length penalty alone never makes a group look informative.

When the cap (or the example stream) runs out with fewer than ``P`` mixed groups, verl raises; we
fill the batch with the latest dropped groups instead (their advantages are exactly 0, so they add
no gradient) so that the batch shape stays fixed for the compiled train step, and report how many
(OUR CHOICE).
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable

import numpy as np

from hindsight.methods.dapo import keep_groups
from hindsight.rollout.assemble import GroupRows
from hindsight.rollout.group import sample_groups
from hindsight.rollout.runtime import PhaseClock
from hindsight.rollout.verification import Verifier
from hindsight.sampling import SamplingParams


def sample_dynamic(model, tokenizer, verifier: Verifier, examples: Iterable, *, key, params: SamplingParams,
                   group_size: int, num_groups: int, max_num_gen_batches: int,
                   slots: int | None = None, chunk_steps: int = 16,
                   clock: PhaseClock | None = None,
                   first_index: int = 0) -> tuple[list[GroupRows], dict]:
    """Dynamic sampling over consecutive batches of ``num_groups`` examples from ``examples``.

    Args:
      examples: a sequence or iterator of examples; generation batch ``i`` samples the next
        ``num_groups`` of them.
      num_groups: ``P``, mixed groups wanted.
      max_num_gen_batches: cap on generation batches (<= 0: unlimited, until ``examples`` ends).
      first_index: the number of the stream's first example (sampled examples are numbered on
        from it; request keys are folded from the numbers).
      Other arguments as :func:`hindsight.rollout.group.sample_groups`.
    Returns:
      ``(groups, info)``: exactly ``P`` groups (mixed ones first, in sampling order, then fillers);
      ``info`` holds ``gen_batches``, ``dropped_groups`` (all-equal groups seen), ``filled_groups``
      (dropped groups used as fillers) and ``sampled_groups``.
    Raises:
      ValueError when fewer than ``P`` groups were sampled in all.
    """
    clock = clock if clock is not None else PhaseClock()
    stream = iter(examples)
    kept: list[GroupRows] = []
    dropped: list[GroupRows] = []
    batches = sampled = 0
    while len(kept) < num_groups and (max_num_gen_batches <= 0 or batches < max_num_gen_batches):
        chunk = list(itertools.islice(stream, num_groups))
        if not chunk:
            break
        groups = sample_groups(model, tokenizer, verifier, chunk, key=key, params=params,
                               group_size=group_size, slots=slots, chunk_steps=chunk_steps,
                               clock=clock, first_index=first_index + sampled)
        batches += 1
        sampled += len(chunk)
        mixed = np.asarray(keep_groups(np.concatenate([g.rewards for g in groups]), group_size))
        for g, keep in zip(groups, mixed):
            (kept if keep else dropped).append(g)
    if len(kept) + len(dropped) < num_groups:
        raise ValueError(f"dynamic sampling needs {num_groups} groups but only {sampled} examples "
                         f"were available; pass more examples")
    filled = max(0, num_groups - len(kept))
    out = kept[:num_groups] + dropped[len(dropped) - filled:]
    return out, dict(gen_batches=batches, dropped_groups=len(dropped), filled_groups=filled,
                     sampled_groups=sampled)
