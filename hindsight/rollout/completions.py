"""Given completions: the ``completions`` rollout shape, one row per example holding the example's
own reference completion (``Example.answer``: a dataset's solution field, a task's answer) after
the policy prompt, nothing sampled. What supervised fine-tuning trains on (the ``sft`` method).

The completion is tokenized without special tokens, the end-of-sequence id appended when the
rollout stops at it (so the policy learns to end its answer), and cut to the response width ``T``
(``rollout.max_new_tokens``; the cut is counted in the stats' ``truncated`` and reported, never
silent). ``logp_old`` is the policy's teacher-forced log-prob of it at the sampling temperature
(what a ratio to the current params would need); the reward is the task's verdict on it
(:func:`hindsight.rollout.verification.check_texts`: a checker that raises gives reward 0 and its
exception as feedback; a reference its own verifier rejects is a data error worth seeing).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hindsight.rollout.assemble import GroupRows
from hindsight.rollout.prompts import policy_prompt
from hindsight.rollout.runtime import PhaseClock, fit_width
from hindsight.rollout.verification import Verifier, check_texts
from hindsight.sampling import SamplingParams, score_logprobs
from hindsight.tasks import Example


def completion_ids(tokenizer, example: Example, *, index: int, eos: int | None) -> list[int]:
    """Token ids of ``example.answer`` (+ ``eos``); ValueError naming the example if it has none."""
    answer = example.answer
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError(f"example {index} has no completion (answer={answer!r}); the "
                         f"'completions' rollout trains on the examples' own answers")
    ids = [int(i) for i in tokenizer.encode(answer, add_special_tokens=False)]
    return ids + ([int(eos)] if eos is not None else [])


def given_completions(model, tokenizer, verifier: Verifier, examples: Sequence[Example], *,
                      params: SamplingParams, clock: PhaseClock | None = None,
                      first_index: int = 0) -> tuple[list[GroupRows], int]:
    """One row per example: its prompt and its own completion.

    Returns:
      ``(groups, truncated)``: P one-row :class:`GroupRows` (loss mask = the completion) and how
      many completions were cut to ``params.max_new_tokens``.
    """
    clock = clock if clock is not None else PhaseClock()
    width = params.max_new_tokens
    eos = getattr(tokenizer, "eos_token_id", None)
    eos = eos if eos is not None and eos in params.stop_tokens else None
    prompts = [np.asarray(policy_prompt(tokenizer, ex), np.int32) for ex in examples]
    full = [completion_ids(tokenizer, ex, index=first_index + k, eos=eos)
            for k, ex in enumerate(examples)]
    truncated = sum(len(ids) > width for ids in full)
    ids = [np.asarray(x[:width], np.int32) for x in full]
    with clock.host_phase("score"):
        logp = fit_width(np.asarray(score_logprobs(
            model, prompts, ids, min_response_len=width,
            temperature=1.0 if params.greedy else params.temperature)), width)
    texts = [tokenizer.decode(list(x), skip_special_tokens=True) for x in ids]
    groups = []
    for k, ex in enumerate(examples):
        n = len(ids[k])
        tokens = np.zeros((1, width), np.int32)
        tokens[0, :n] = ids[k]
        mask = (np.arange(width) < n)[None]
        checked = check_texts(verifier.task, ex, [texts[k]])
        groups.append(GroupRows(
            example=ex, example_index=first_index + k, prompt=prompts[k], tokens=tokens,
            lengths=np.array([n], np.int32), logprobs=logp[k:k + 1] * mask,
            policy_logprobs=logp[k:k + 1] * mask, loss_mask=mask,
            rewards=checked.rewards,
            branch_positions=np.zeros(1, np.int32), texts=[texts[k]],
            feedback=checked.feedback, generated_tokens=0))
    return groups, truncated
