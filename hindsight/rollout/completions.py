"""Given completions: the ``completions`` rollout shape, one row per example holding a completion
after a prompt, trained on as given (what supervised fine-tuning trains on: the ``sft`` method).
Where the completion comes from is the method config's ``completions``:

* ``"dataset"`` (:func:`given_completions`): the example's own reference completion
  (``Example.answer``: a dataset's solution field, a task's answer) after the policy prompt,
  nothing sampled. It is tokenized without special tokens, the end-of-sequence id appended when
  the rollout stops at it (so the policy learns to end its answer), and cut to the response width
  ``T`` (``rollout.max_new_tokens``; the cut is counted in the stats' ``truncated`` and reported,
  never silent). The reward is the task's verdict on it
  (:func:`hindsight.rollout.verification.check_texts`: a checker that raises gives reward 0 and its
  exception as feedback; a reference its own verifier rejects is a data error worth seeing).
* ``"policy"`` (:func:`policy_completions`): the policy's own filtered samples. ``num_samples``
  responses per question are sampled after the context of the recipe ``sample_context`` (e.g.
  question + BIRD's concise instruction; :func:`hindsight.rollout.contexts.teacher_context`) and
  verified; per question :data:`SELECTIONS` ``[select]`` keeps one of the correct ones (reward >=
  :data:`hindsight.tasks.SUCCESS_REWARD`) that ended (``finished_only``, OUR CHOICE: a sample cut
  at the cap has no final answer even when the verifier finds one in it, and training on it
  would teach the policy not to end), trained after the plain question with
  ``prompt_switch`` (BIRD's prompt switch) or after its sampling prompt. A question none of whose
  samples is correct keeps its row with length 0 and loss mask 0 (reward 0, the shape of the batch
  stays ``[P, T]``: no recompile, the term counts only real tokens).
* ``"generated"`` (:func:`generated_completions`, SEED's stage 1): a context part the policy
  writes about its own samples (:mod:`hindsight.rollout.generated`: SEED's ``skill``).
  ``num_samples`` responses per question are sampled after the plain question and verified, the
  group's part is written from them (continuing one row's conversation), and the row trains the
  part's text after that conversation (question, answer, the request turn), kept when
  :data:`PART_SELECTIONS` ``[select]`` accepts its :func:`~hindsight.rollout.generated.context_gain`
  (``"useful"``: conditioning on it raised the mean log-prob of the group's successful responses)
  and, with ``finished_only``, it ended on a stop token. A question whose part is not kept gives
  a row with loss mask 0, as above.

Either way ``logp_old`` is the policy's teacher-forced log-prob of the row after the prompt it is
trained under, at the sampling temperature (what a ratio to the current params would need).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from hindsight.rollout.assemble import GroupRows, finished
from hindsight.rollout.contexts import teacher_context
from hindsight.rollout.generated import GenerationOptions, PartWriter, context_gain
from hindsight.rollout.group import sample_groups
from hindsight.rollout.prompts import Templates, policy_prompt
from hindsight.rollout.runtime import PhaseClock, fit_width
from hindsight.rollout.verification import Checked, Verifier, check_texts
from hindsight.sampling import SamplingParams, score_logprobs
from hindsight.tasks import SUCCESS_REWARD, Example

NO_SAMPLE_FEEDBACK = "no correct sample"


def shortest(rewards: np.ndarray, lengths: np.ndarray, *,
             threshold: float = SUCCESS_REWARD) -> int | None:
    """The shortest row with ``rewards >= threshold`` (the first of equal ones), or None.
    ``rewards``, ``lengths``: ``[n]``. OUR CHOICE for BIRD: among correct samples the concise one."""
    ok = np.flatnonzero(np.asarray(rewards) >= threshold)
    return None if not ok.size else int(ok[np.argmin(np.asarray(lengths)[ok])])


def first(rewards: np.ndarray, lengths: np.ndarray, *,
          threshold: float = SUCCESS_REWARD) -> int | None:
    """The first row with ``rewards >= threshold`` in sampling order, or None: an unbiased draw of
    the success-conditioned policy (BIRD with one sample per question)."""
    ok = np.flatnonzero(np.asarray(rewards) >= threshold)
    return None if not ok.size else int(ok[0])


SELECTIONS = {"shortest": shortest, "first": first}
"""Which correct sample a question keeps (the SFT config's ``select``):
``rule(rewards [n], lengths [n], *, threshold) -> row | None``. Add a rule by adding an entry."""


def useful(gain: float) -> bool:
    """Keep a generated part when conditioning on it raised the mean log-prob of its group's
    successful responses (``gain > 0``; NaN, no success to score it on, is not kept). OUR CHOICE
    for SEED's stage 1: a skill the policy's own teacher would not read as support for what
    worked teaches nothing to write."""
    return bool(gain > 0)


PART_SELECTIONS = {"useful": useful}
"""Which generated parts a question keeps (the SFT config's ``select`` with
``completions="generated"``): ``rule(gain) -> bool`` on the part's
:func:`~hindsight.rollout.generated.context_gain`. Add a rule by adding an entry."""


@dataclasses.dataclass(frozen=True)
class Selection:
    """What the policy's samples gave (the stats of a ``"policy"`` rollout).

    Attributes:
      kept_fraction: questions that kept a sample. kept_length: mean tokens of the kept samples
        (NaN when none was kept: a metric every step has, which the run's summary skips).
        sampled_length, sampled_reward: mean tokens and reward of every sample drawn.
    """
    kept_fraction: float
    kept_length: float
    sampled_length: float
    sampled_reward: float


def completion_ids(tokenizer, example: Example, *, index: int, eos: int | None) -> list[int]:
    """Token ids of ``example.answer`` (+ ``eos``); ValueError naming the example if it has none."""
    answer = example.answer
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError(f"example {index} has no completion (answer={answer!r}); the "
                         f"'completions' rollout trains on the examples' own answers")
    ids = [int(i) for i in tokenizer.encode(answer, add_special_tokens=False)]
    return ids + ([int(eos)] if eos is not None else [])


def completion_rows(model, examples: Sequence[Example], prompts: Sequence, completions: Sequence,
                    checked: Sequence[Checked], *, params: SamplingParams,
                    clock: PhaseClock | None = None, first_index: int = 0,
                    generated_tokens: Sequence[int] | None = None) -> list[GroupRows]:
    """One one-row group per example: ``completions[k]`` (token ids, at most ``T`` of them; empty:
    a row with loss mask 0) after ``prompts[k]``, its verdict ``checked[k]`` (one row) and
    ``logp_old`` its teacher-forced log-prob at the sampling temperature.

    Returns:
      P :class:`GroupRows` of one row each, ``[1, T]`` with ``T = params.max_new_tokens``.
    """
    clock = clock if clock is not None else PhaseClock()
    width = params.max_new_tokens
    prompts = [np.asarray(p, np.int32) for p in prompts]
    ids = [np.asarray(x, np.int32) for x in completions]
    if any(len(x) > width for x in ids):
        raise ValueError(f"a completion is longer than the response width {width}")
    scored = [k for k, x in enumerate(ids) if len(x)]
    logp = np.zeros((len(ids), width), np.float32)
    if scored:
        with clock.host_phase("score"):
            logp[scored] = fit_width(np.asarray(score_logprobs(
                model, [prompts[k] for k in scored], [ids[k] for k in scored],
                min_response_len=width,
                temperature=params.policy_temperature)), width)
    groups = []
    for k, ex in enumerate(examples):
        n = len(ids[k])
        tokens = np.zeros((1, width), np.int32)
        tokens[0, :n] = ids[k]
        mask = (np.arange(width) < n)[None]
        groups.append(GroupRows(
            example=ex, example_index=first_index + k, prompt=prompts[k], tokens=tokens,
            lengths=np.array([n], np.int32), logprobs=logp[k:k + 1] * mask,
            policy_logprobs=logp[k:k + 1] * mask, loss_mask=mask,
            rewards=checked[k].rewards, branch_positions=np.zeros(1, np.int32),
            texts=list(checked[k].texts), feedback=list(checked[k].feedback),
            generated_tokens=0 if generated_tokens is None else int(generated_tokens[k])))
    return groups


def given_completions(model, tokenizer, verifier: Verifier, examples: Sequence[Example], *,
                      params: SamplingParams, clock: PhaseClock | None = None,
                      first_index: int = 0) -> tuple[list[GroupRows], int]:
    """One row per example: its policy prompt and its own completion.

    Returns:
      ``(groups, truncated)``: P one-row :class:`GroupRows` (loss mask = the completion) and how
      many completions were cut to ``params.max_new_tokens``.
    """
    width = params.max_new_tokens
    eos = getattr(tokenizer, "eos_token_id", None)
    eos = eos if eos is not None and eos in params.stop_tokens else None
    prompts = [policy_prompt(tokenizer, ex) for ex in examples]
    full = [completion_ids(tokenizer, ex, index=first_index + k, eos=eos)
            for k, ex in enumerate(examples)]
    truncated = sum(len(ids) > width for ids in full)
    ids = [x[:width] for x in full]
    checked = [check_texts(verifier.task, ex, [tokenizer.decode(x, skip_special_tokens=True)])
               for ex, x in zip(examples, ids)]
    groups = completion_rows(model, examples, prompts, ids, checked, params=params, clock=clock,
                             first_index=first_index)
    return groups, truncated


def keep_samples(model, sampled: Sequence[GroupRows], prompts: Sequence, *, select: str,
                 params: SamplingParams, clock: PhaseClock | None = None,
                 threshold: float = SUCCESS_REWARD,
                 finished_only: bool = True) -> tuple[list[GroupRows], Selection]:
    """Per sampled group the sample ``SELECTIONS[select]`` keeps, as a one-row group after
    ``prompts[k]`` (the prompt switch: the plain question, whatever the samples were drawn after).

    Args:
      sampled: P groups of ``n`` verified samples (:func:`hindsight.rollout.group.sample_groups`).
      prompts: P token-id lists the kept rows are trained after.
      finished_only: only rows that ended on one of ``params.stop_tokens`` before the response
        width may be kept (:func:`finished`).
    Returns:
      ``(groups, selection)``: P one-row groups (a question with no correct sample: length 0,
      loss mask 0, reward 0, feedback :data:`NO_SAMPLE_FEEDBACK`) and the :class:`Selection`.
    """
    rule = SELECTIONS[select]
    eligible = [np.where(finished(g, params.stop_tokens), g.rewards, -np.inf) if finished_only
                else g.rewards for g in sampled]
    kept = [rule(r, g.lengths, threshold=threshold) for r, g in zip(eligible, sampled)]
    completions, checked = [], []
    for g, i in zip(sampled, kept):
        if i is None:
            completions.append([])
            checked.append(Checked(rewards=np.zeros(1, np.float32), feedback=[NO_SAMPLE_FEEDBACK],
                                   texts=[""], errors=0, seconds=0.0))
        else:
            completions.append(g.tokens[i, :g.lengths[i]])
            checked.append(Checked(rewards=g.rewards[i:i + 1], feedback=[g.feedback[i]],
                                   texts=[g.texts[i]], errors=0, seconds=0.0))
    groups = completion_rows(model, [g.example for g in sampled], prompts, completions, checked,
                             params=params, clock=clock,
                             first_index=sampled[0].example_index if sampled else 0,
                             generated_tokens=[g.generated_tokens for g in sampled])
    lengths = [int(g.lengths[i]) for g, i in zip(sampled, kept) if i is not None]
    selection = Selection(
        kept_fraction=len(lengths) / max(len(sampled), 1),
        kept_length=float(np.mean(lengths)) if lengths else math.nan,
        sampled_length=float(np.mean(np.concatenate([g.lengths for g in sampled]))),
        sampled_reward=float(np.mean(np.concatenate([g.rewards for g in sampled]))))
    return groups, selection


def policy_completions(model, tokenizer, verifier: Verifier, examples: Sequence[Example], *,
                       key, params: SamplingParams, num_samples: int, sample_context=(),
                       select: str = "shortest", prompt_switch: bool = True,
                       finished_only: bool = True, templates: Templates = Templates(), slots: int | None = None,
                       chunk_steps: int = 16, clock: PhaseClock | None = None,
                       first_index: int = 0) -> tuple[list[GroupRows], Selection]:
    """One row per example from the policy's own samples (the ``"policy"`` completions).

    Args:
      key, params, slots, chunk_steps, clock, first_index: as
        :func:`hindsight.rollout.group.sample_groups` (``num_samples`` rows per example).
      sample_context: the recipe of the sampling prompt (parts of
        :data:`hindsight.rollout.contexts.EXAMPLE_PARTS`); ``()``: the plain question.
      select: a :data:`SELECTIONS` name. prompt_switch: train after the plain question.
      finished_only: keep only samples that ended before the response width.
    Returns:
      ``(groups, selection)`` as :func:`keep_samples`.
    """
    plain = [policy_prompt(tokenizer, ex) for ex in examples]
    asked = plain if not sample_context else [
        teacher_context(tokenizer, ex, index=first_index + k, templates=templates,
                        recipe=sample_context) for k, ex in enumerate(examples)]
    sampled = sample_groups(model, tokenizer, verifier, examples, key=key, params=params,
                            group_size=num_samples, slots=slots, chunk_steps=chunk_steps,
                            clock=clock, first_index=first_index, prompts=asked)
    return keep_samples(model, sampled, plain if prompt_switch else asked, select=select,
                        params=params, clock=clock, finished_only=finished_only)


def generated_completions(model, tokenizer, verifier: Verifier, examples: Sequence[Example], *,
                          key, params: SamplingParams, num_samples: int, part: str,
                          select: str = "useful", finished_only: bool = True,
                          options: GenerationOptions = GenerationOptions(),
                          templates: Templates = Templates(), slots: int | None = None,
                          chunk_steps: int = 16, clock: PhaseClock | None = None,
                          first_index: int = 0) -> tuple[list[GroupRows], Selection]:
    """One row per example: the generated part ``part`` the policy writes about its own
    ``num_samples`` samples of the question, after the conversation it continued (the
    ``"generated"`` completions).

    Args:
      key, params, slots, chunk_steps, clock, first_index: as
        :func:`hindsight.rollout.group.sample_groups`.
      part: a name of :data:`hindsight.rollout.generated.GENERATORS`.
      select: a :data:`PART_SELECTIONS` name. finished_only: keep only parts that ended on a
        stop token before their cap.
      options: the parts' cap (at most ``params.max_new_tokens``: the row holds the text) and
        the feedback cap.
    Returns:
      ``(groups, selection)``: P one-row groups (a kept part: its tokens after its conversation,
      reward the mean reward of the group's samples; otherwise length 0, loss mask 0; each with
      the group's written parts, kept or not, in ``generated``) and the
      :class:`Selection` (``kept_length`` / ``sampled_length``: tokens of the kept / written
      parts; ``sampled_reward``: the samples' mean reward).
    Raises:
      ValueError if ``options.max_tokens`` exceeds the response width.
    """
    if options.max_tokens > params.max_new_tokens:
        raise ValueError(f"rollout.generated_max_tokens={options.max_tokens} exceeds "
                         f"rollout.max_new_tokens={params.max_new_tokens}: the SFT row holds "
                         f"the generated text")
    clock = clock if clock is not None else PhaseClock()
    writer = PartWriter(tokenizer, (part,), params=params, key=key, options=options,
                        templates=templates, first_index=first_index, clock=clock)
    sampled = sample_groups(model, tokenizer, verifier, examples, key=key, params=params,
                            group_size=num_samples, slots=slots, chunk_steps=chunk_steps,
                            clock=clock, first_index=first_index, writer=writer)
    with clock.host_phase("score"):
        gains = context_gain(model, tokenizer, sampled, part,
                             temperature=params.policy_temperature, templates=templates)
    rule = PART_SELECTIONS[select]
    prompts, completions, checked, written, kept = [], [], [], [], []
    for g, gain in zip(sampled, gains):
        text = g.generated.get(part)
        keep = text is not None and (text.finished or not finished_only) and rule(gain)
        if text is not None:
            written.append(len(text.tokens))
        prompts.append(g.prompt if text is None else text.prompt)
        completions.append(text.tokens if keep else [])
        reward = np.full(1, np.mean(g.rewards), np.float32)
        if keep:
            kept.append(len(text.tokens))
            checked.append(Checked(rewards=reward, feedback=[f"context gain {gain:+.4f}"],
                                   texts=[text.text], errors=0, seconds=0.0))
        else:
            why = "no part written" if text is None else f"not kept (context gain {gain:+.4f})"
            checked.append(Checked(rewards=reward, feedback=[why], texts=[""], errors=0,
                                   seconds=0.0))
    groups = completion_rows(model, examples, prompts, completions, checked, params=params,
                             clock=clock, first_index=first_index,
                             generated_tokens=[g.generated_tokens for g in sampled])
    for row, g in zip(groups, sampled):  # every written part, kept or not, for the run's samples
        row.generated = g.generated
    selection = Selection(
        kept_fraction=len(kept) / max(len(sampled), 1),
        kept_length=float(np.mean(kept)) if kept else math.nan,
        sampled_length=float(np.mean(written)) if written else math.nan,
        sampled_reward=float(np.mean(np.concatenate([g.rewards for g in sampled]))))
    return groups, selection
