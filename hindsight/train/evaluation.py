"""Evaluation on a task's held-out split: per problem ``n`` samples, verified off the decode path,
and pass@k by the unbiased estimator.

    rewards = sample_rewards(model, tokenizer, task, examples, key=key, params=params, samples=8)
    pass_at_k(rewards >= 1.0, k=8)

Used by the training loop's held-out reward (one sample per problem, :func:`hindsight.train.loop.
evaluate`) and by ``python -m experiments.evaluate`` (greedy pass@1 and sampled pass@k).
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

import numpy as np

from hindsight.rollout import Verifier, sample_groups
from hindsight.rollout.runtime import PhaseClock
from hindsight.sampling import SamplingParams
from hindsight.tasks import Example


@dataclasses.dataclass(frozen=True)
class Samples:
    """What :func:`sample_rewards` returns.

    Attributes:
      rewards: ``[P, n]`` float32 verifier rewards.
      feedback: per problem, the ``n`` feedback lines.
      texts: per problem, the ``n`` responses.
      lengths: ``[P, n]`` int32 response lengths (tokens).
      seconds: wall-clock of the whole call; verify_wait: seconds decoding waited for verifiers.
    """
    rewards: np.ndarray
    feedback: list[list[str]]
    texts: list[list[str]]
    lengths: np.ndarray
    seconds: float
    verify_wait: float

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())


def sample_rewards(model, tokenizer, task, examples: Sequence[Example], *, key,
                   params: SamplingParams, samples: int, slots: int | None = None,
                   chunk_steps: int = 16, verify_workers: int = 4, block: int | None = None,
                   progress: bool = False, desc: str = "eval", first_index: int = 0) -> Samples:
    """``samples`` responses per example under ``params`` (stop tokens included), verified.

    Args:
      key: request ``k`` (example ``k``) uses ``fold_in(key, first_index + k)`` whatever
        ``block`` is (``first_index``: the number of ``examples[0]`` in the caller's list).
      block: examples per engine run (None: all at once); a progress bar (``progress``) advances
        per block.
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"`samples` must be a positive int, got {samples!r}")
    if not examples:
        raise ValueError("`examples` is empty: nothing to evaluate")
    block = block or len(examples)
    start, clock, groups = time.perf_counter(), PhaseClock(), []
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(examples), desc=desc, unit="problem", dynamic_ncols=True)
    with Verifier(task, tokenizer, workers=verify_workers) as verifier:
        for first in range(0, len(examples), block):
            part = list(examples[first:first + block])
            groups += sample_groups(model, tokenizer, verifier, part, key=key, params=params,
                                    group_size=samples, slots=slots, chunk_steps=chunk_steps,
                                    clock=clock, first_index=first_index + first)
            if bar is not None:
                bar.update(len(part))
                bar.set_postfix(reward=f"{np.mean([g.rewards.mean() for g in groups]):.3f}")
    if bar is not None:
        bar.close()
    return Samples(rewards=np.stack([g.rewards for g in groups]),
                   feedback=[g.feedback for g in groups], texts=[g.texts for g in groups],
                   lengths=np.stack([g.lengths for g in groups]),
                   seconds=time.perf_counter() - start,
                   verify_wait=clock.seconds().get("verify_wait", 0.0))


def pass_at_k(correct: np.ndarray, *, k: int) -> float:
    """Mean over problems of the unbiased pass@k estimator (Chen et al. 2021, HumanEval):
    ``1 - C(n - c, k) / C(n, k)`` for ``n`` samples of which ``c`` are correct.

    Args:
      correct: ``[P, n]`` bool.
      k: ``1 <= k <= n``.
    """
    correct = np.asarray(correct, bool)
    if correct.ndim != 2:
        raise ValueError(f"`correct` must be [problems, samples], got shape {correct.shape}")
    n = correct.shape[1]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError(f"`k` must be an int in [1, {n}] (the samples per problem), got {k!r}")
    c = correct.sum(1)
    return float(np.mean([1.0 - (math.comb(n - int(ci), k) / math.comb(n, k)) for ci in c]))
