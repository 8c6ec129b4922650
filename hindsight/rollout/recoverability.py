"""Counterfactual recoverability's rollout (spec ``other-methods.md`` §10; the method and its OUR
CHOICEs: :mod:`hindsight.methods.recoverability`).

Per prompt: ``G`` student samples (:func:`hindsight.rollout.group.sample_groups`), verified ->
the failing rows' responses scored by the teacher under its context (question + reference answer;
:func:`hindsight.sampling.score_logprobs`) -> each failing row's error position
(:func:`error_positions`) -> the states to replay (:func:`choose_states`) -> per state, the two
arms' teacher branches (:func:`arms`) -> verified -> ``p_cont`` / ``p_roll`` and the labels
(:func:`label_states`) -> the group's rows: the ``G`` samples, then ``states_per_group``
supervision rows (:func:`group_rows`).

**The branches are exact teacher samples**: each arm is one engine request
(:meth:`hindsight.sampling.engine.Engine.submit`) whose prompt is the teacher context followed by
the response prefix, prefilled once and fanned out to ``branches`` rows, sampled by the teacher's
weights with the rollout's sampling parameters. The policy's cached prefixes cannot serve
(:meth:`~hindsight.sampling.engine.Engine.submit_branch` continues a row under the context it was
sampled in, the student's, while the teacher reads a privileged one).

Batch layout of a group (``G + S`` rows, ``S = states_per_group``; shapes never depend on the
labels): rows ``0..G-1`` are the student's samples, role 0; row ``G + j`` is the supervision row
of the ``j``-th replayed state (best first), role = the state's label when it asks for one
(1 recoverable: the prefix through ``e`` + the first successful continue branch, trained after
``e``; 2 irreversible: the prefix before ``e`` + the first successful rollback branch, trained
from ``e`` on), else an empty row (role 0, nothing trained). A student row whose state is
recoverable or irreversible is trained before ``e`` only; every other student row on its whole
response (SOD).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from hindsight.methods.recoverability import ROLES, RecoverabilityConfig
from hindsight.rollout.assemble import GroupRows
from hindsight.rollout.branching import branch_eligibility
from hindsight.rollout.contexts import teacher_context
from hindsight.rollout.group import sample_groups
from hindsight.rollout.prompts import Templates
from hindsight.rollout.runtime import PhaseClock, fit_width, make_engine, request_key
from hindsight.rollout.verification import Checked, Verifier
from hindsight.sampling import SamplingParams, score_logprobs
from hindsight.signals import recoverability_labels, select_branch_points
from hindsight.tasks import SUCCESS_REWARD, Example

ARMS = ("continue", "rollback")
"""The two branch sets of a state, in request order (their index is the request key's path)."""
AMBIGUOUS = 0


def error_positions(student_logprobs: np.ndarray, teacher_logprobs: np.ndarray,
                    lengths: np.ndarray, eligible: np.ndarray, *, head_guard: int,
                    tail_guard: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's error position: the largest step-wise divergence ``delta_t = l_S(y_t) -
    l_T(y_t)`` among ``head_guard <= t <= len - 1 - tail_guard`` where ``eligible`` and
    ``delta_t > 0`` (ties: the lowest ``t``).

    Args:
      student_logprobs, teacher_logprobs: ``[N, T]`` log-probs of the sampled tokens (any value
        past a row's length).
      lengths: ``[N]`` response lengths.
      eligible: ``[N, T]`` bool (:func:`hindsight.rollout.branching.branch_eligibility`: no stop
        token).
    Returns:
      ``(positions [N] int32, -1 where none; delta [N, T] float32, 0 past the length)``.
    """
    ls, lt = np.asarray(student_logprobs, np.float32), np.asarray(teacher_logprobs, np.float32)
    if ls.shape != lt.shape or ls.ndim != 2:
        raise ValueError(f"`student_logprobs` {ls.shape} and `teacher_logprobs` {lt.shape} must be "
                         f"the same [N, T]")
    width = ls.shape[1]
    mask = np.arange(width)[None, :] < np.asarray(lengths)[:, None]
    # select before subtracting: padding may hold anything
    delta = np.where(mask, ls, 0.0) - np.where(mask, lt, 0.0)
    allowed = np.asarray(eligible, bool) & (np.arange(width)[None, :] >= head_guard) & (delta > 0)
    picks = select_branch_points(jnp.asarray(delta), jnp.asarray(mask), num_points=1, min_gap=1,
                                 tail_guard=tail_guard, eligible_mask=jnp.asarray(allowed))
    return np.asarray(picks)[:, 0].astype(np.int32), delta.astype(np.float32)


def choose_states(positions: np.ndarray, delta: np.ndarray, limit: int) -> list[int]:
    """The rows to replay: those with an error position (``positions >= 0``, ``[G]``), largest
    ``delta`` at it first (``delta [G, T]``; ties: the lower row), at most ``limit``."""
    rows = [i for i in range(len(positions)) if positions[i] >= 0]
    rows.sort(key=lambda i: (-float(delta[i, positions[i]]), i))
    return rows[:limit]


def arms(response: np.ndarray, position: int, width: int) -> list[tuple[np.ndarray, int]]:
    """The two arms' ``(prefix, max_new_tokens)`` from the error at ``position`` of ``response``,
    in :data:`ARMS` order: continue keeps the erroneous token (``response[:position + 1]``) and
    rollback resamples it (``response[:position]``). Budget-matched: both have ``width -
    position`` tokens from the pre-error state, the continue arm's first being the kept token,
    so every branch is a full response of at most ``width`` tokens."""
    response = np.asarray(response, np.int32)
    return [(response[:position + 1], width - position - 1),
            (response[:position], width - position)]


def label_states(p_cont: np.ndarray, p_roll: np.ndarray,
                 config: RecoverabilityConfig) -> np.ndarray:
    """``[S]`` int32 labels (1 recoverable, 2 irreversible, 0 ambiguous) of the arms' success rates
    ``[S]`` under ``config``'s thresholds (:func:`hindsight.signals.recoverability_labels`)."""
    return np.asarray(recoverability_labels(
        jnp.asarray(p_cont, jnp.float32), jnp.asarray(p_roll, jnp.float32),
        recoverable_min=config.recoverable_min, irreversible_max=config.irreversible_max,
        rollback_min=config.rollback_min), np.int32)


@dataclasses.dataclass
class Arm:
    """One arm's verified branches: full responses (the prefix included).

    Attributes:
      tokens: ``[n, T]`` int32; lengths: ``[n]``; logprobs, policy_logprobs: ``[n, T]`` (the
      student's on the prefix, the teacher sampler's after it); rewards: ``[n]``; texts,
      feedback: per branch; new_tokens: tokens the teacher sampled.
    """
    tokens: np.ndarray
    lengths: np.ndarray
    logprobs: np.ndarray
    policy_logprobs: np.ndarray
    rewards: np.ndarray
    texts: list[str]
    feedback: list[str]
    new_tokens: int

    def first_success(self) -> int | None:
        hits = np.nonzero(self.rewards >= SUCCESS_REWARD)[0]
        return int(hits[0]) if hits.size else None


@dataclasses.dataclass
class StateInfo:
    """A group's replayed states, best first.

    Attributes:
      rows: ``[S]`` the student row of each state; positions: ``[S]`` its error position.
      delta: ``[G, T]`` the step-wise divergence of the failing rows (0 elsewhere).
      p_cont, p_roll: ``[S]`` the arms' success rates; labels: ``[S]`` int32 (0, 1, 2).
      arms: per state, ``{arm name: Arm}``.
    """
    rows: np.ndarray
    positions: np.ndarray
    delta: np.ndarray
    p_cont: np.ndarray
    p_roll: np.ndarray
    labels: np.ndarray
    arms: list[dict]


def group_rows(group: GroupRows, info: StateInfo, slots: int) -> GroupRows:
    """``group``'s ``G`` samples followed by ``slots`` supervision rows (see the module doc),
    with ``row_roles``. A state labelled recoverable (irreversible) whose continue (rollback) arm
    has no success (only with thresholds at 0) gets no row and counts as ambiguous."""
    if len(info.rows) > slots:
        raise ValueError(f"{len(info.rows)} replayed states for {slots} supervision slots")
    g, width = group.size, group.tokens.shape[1]
    n = g + slots
    t = np.arange(width)
    tokens = np.zeros((n, width), np.int32)
    logprobs, policy_lp = np.zeros((n, width), np.float32), np.zeros((n, width), np.float32)
    lengths = np.zeros(n, np.int32)
    rewards = np.zeros(n, np.float32)
    branch_positions = np.zeros(n, np.int32)
    roles = np.zeros(n, np.int32)
    texts, feedback = list(group.texts) + [""] * slots, list(group.feedback) + [""] * slots
    tokens[:g], lengths[:g], rewards[:g] = group.tokens, group.lengths, group.rewards
    logprobs[:g], policy_lp[:g] = group.logprobs, group.policy_logprobs
    mask = np.zeros((n, width), bool)
    mask[:g] = np.asarray(group.loss_mask, bool)
    for j, (row, e, label) in enumerate(zip(info.rows, info.positions, info.labels)):
        if label == AMBIGUOUS:
            continue
        arm = info.arms[j]["continue" if label == ROLES["retain"] else "rollback"]
        pick = arm.first_success()
        if pick is None:
            continue
        i = g + j
        start = e + 1 if label == ROLES["retain"] else e   # the first position the teacher sampled
        tokens[i], lengths[i] = arm.tokens[pick], arm.lengths[pick]
        logprobs[i], policy_lp[i] = arm.logprobs[pick], arm.policy_logprobs[pick]
        rewards[i], texts[i], feedback[i] = arm.rewards[pick], arm.texts[pick], arm.feedback[pick]
        mask[i] = (t >= start) & (t < lengths[i])
        branch_positions[i], roles[i] = start, label
        mask[row] &= t < e   # the student's row: trained before the error only
    new = sum(a.new_tokens for arms_ in info.arms for a in arms_.values())
    return dataclasses.replace(
        group, tokens=tokens, lengths=lengths, logprobs=logprobs, policy_logprobs=policy_lp,
        loss_mask=mask, rewards=rewards, branch_positions=branch_positions, texts=texts,
        feedback=feedback, generated_tokens=group.generated_tokens + new, row_roles=roles)


def sample_recoverability(model, tokenizer, verifier: Verifier, examples: Sequence[Example], *,
                          key, params: SamplingParams, config: RecoverabilityConfig,
                          samples: int, teacher_model=None, templates: Templates = Templates(),
                          slots: int | None = None, chunk_steps: int = 16,
                          clock: PhaseClock | None = None,
                          first_index: int = 0) -> tuple[list[GroupRows], list[StateInfo]]:
    """Sample, replay and lay out one group per example (see the module doc).

    Args:
      model: the policy (it samples the ``samples`` rows; with ``config.teacher="self"`` also the
        branches, under the teacher context).
      verifier: checks the samples and the branches while the engines decode.
      examples: P examples (each with a reference answer when the teacher context needs one).
      key: PRNG key; the samples as :func:`hindsight.rollout.group.sample_groups` (request
        ``fold_in(key, first_index + k)``), the branches of state ``j`` of prompt ``k`` from
        ``request_key(key, first_index + k, 1 + arm, j)``.
      params: sampling parameters of the samples and of every branch (stop tokens included);
        ``T = params.max_new_tokens``.
      config: the method config (teacher, recipe, branches, states, guards, thresholds).
      samples: ``G``, rows sampled per prompt.
      teacher_model: the external teacher (``config.teacher="external"``).
      templates: wording of the teacher context.
      clock: records ``roots`` and ``branches`` tokens, ``scoring`` and ``verify`` host time.
    Returns:
      ``(groups, infos)``: P groups of ``G + config.states_per_group`` rows with ``row_roles``,
      and P :class:`StateInfo`.
    """
    clock = clock if clock is not None else PhaseClock()
    if config.teacher == "external" and teacher_model is None:
        raise ValueError("recoverability with teacher='external' samples its branches with the "
                         "external teacher: pass teacher_model= (an experiment loads it from "
                         "teacher.model.name)")
    teacher = model if config.teacher == "self" else teacher_model
    width = params.max_new_tokens
    groups = sample_groups(model, tokenizer, verifier, examples, key=key, params=params,
                           group_size=samples, slots=slots, chunk_steps=chunk_steps, clock=clock,
                           first_index=first_index)
    contexts = [np.asarray(teacher_context(tokenizer, ex, index=first_index + k,
                                           templates=templates, recipe=config.teacher_context),
                           np.int32) for k, ex in enumerate(examples)]
    with clock.host_phase("scoring"):
        states = _find_states(teacher, groups, contexts, params, config)
    results: dict[tuple, Arm] = {}
    requests = [(k, j, a) for k, (rows, _, _) in enumerate(states) for j in range(len(rows))
                for a in range(len(ARMS))]
    if requests:
        engine = make_engine(teacher, params, longest_prompt=max(len(c) for c in contexts),
                             max_new_tokens=width, rows=len(requests) * config.branches,
                             slots=slots, chunk_steps=chunk_steps, name="branches")
        prefixes = {}
        for k, j, a in requests:
            rows, positions, _ = states[k]
            prefix, budget = arms(groups[k].tokens[rows[j]], int(positions[j]), width)[a]
            prefixes[k, j, a] = prefix
            engine.submit(np.concatenate([contexts[k], prefix]), num_samples=config.branches,
                          max_new_tokens=budget, key=request_key(key, first_index + k, 1 + a, j),
                          tag=(k, j, a))

        def on_result(tag, res):
            k, j, a = tag
            clock.tokens["branches"] += int(res.lengths.sum())
            row = int(states[k][0][j])
            prefix = prefixes[tag]
            p = prefix.size
            tokens = np.zeros((config.branches, width), np.int32)
            tokens[:, :p] = prefix
            tokens[:, p:] = fit_width(res.tokens, width - p)
            lengths = (p + res.lengths).astype(np.int32)
            lps = []
            for student, sampled in ((groups[k].logprobs, res.logprobs),
                                     (groups[k].policy_logprobs, res.policy_logprobs)):
                lp = np.zeros((config.branches, width), np.float32)
                lp[:, :p] = student[row, :p]
                lp[:, p:] = fit_width(sampled, width - p)
                lps.append(lp)

            def verified(checked: Checked):
                results[tag] = Arm(tokens=tokens, lengths=lengths, logprobs=lps[0],
                                   policy_logprobs=lps[1], rewards=checked.rewards,
                                   texts=checked.texts, feedback=checked.feedback,
                                   new_tokens=int(res.lengths.sum()))

            with clock.host_phase("verify"):
                verifier.submit(examples[k], tokens, lengths, verified)

        clock.run([engine], on_result, verifier)
    out, infos = [], []
    for k, (rows, positions, delta) in enumerate(states):
        arm_sets = [{name: results[k, j, a] for a, name in enumerate(ARMS)}
                    for j in range(len(rows))]
        rate = lambda name: np.array([float(np.mean(s[name].rewards >= SUCCESS_REWARD))
                                      for s in arm_sets], np.float32)
        p_cont, p_roll = rate("continue"), rate("rollback")
        info = StateInfo(rows=rows, positions=positions, delta=delta, p_cont=p_cont,
                         p_roll=p_roll, labels=label_states(p_cont, p_roll, config), arms=arm_sets)
        out.append(group_rows(groups[k], info, config.states_per_group))
        infos.append(info)
    return out, infos


def _find_states(teacher, groups: list[GroupRows], contexts, params: SamplingParams,
                 config: RecoverabilityConfig) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per group, ``(rows [S], positions [S], delta [G, T])`` of the states to replay: the failing
    rows' responses scored by ``teacher`` under their group's context (one call for the whole
    batch), their error positions, the best ``states_per_group``."""
    width = params.max_new_tokens
    failing = [(k, i) for k, grp in enumerate(groups) for i in range(grp.size)
               if grp.rewards[i] < SUCCESS_REWARD and grp.lengths[i] > 0]
    deltas = [np.zeros((grp.size, width), np.float32) for grp in groups]
    positions = [np.full(grp.size, -1, np.int32) for grp in groups]
    if failing:
        # the teacher at the temperature of the sampler's (untruncated) policy log-probs
        temperature = params.policy_temperature
        responses = [groups[k].tokens[i, :groups[k].lengths[i]] for k, i in failing]
        lt = fit_width(np.asarray(score_logprobs(
            teacher, contexts, responses, context_index=np.array([k for k, _ in failing]),
            min_response_len=width, min_context_len=max(len(c) for c in contexts),
            temperature=temperature)), width)
        ls = np.stack([groups[k].policy_logprobs[i] for k, i in failing])
        lengths = np.array([groups[k].lengths[i] for k, i in failing], np.int32)
        eligible = np.stack([branch_eligibility(groups[k].tokens[i], int(groups[k].lengths[i]),
                                                params.stop_tokens) for k, i in failing])
        picks, delta = error_positions(ls, lt, lengths, eligible, head_guard=config.head_guard,
                                       tail_guard=config.tail_guard)
        for n, (k, i) in enumerate(failing):
            deltas[k][i], positions[k][i] = delta[n], picks[n]
    out = []
    for k in range(len(groups)):
        rows = np.asarray(choose_states(positions[k], deltas[k], config.states_per_group),
                          np.int32)
        out.append((rows, positions[k][rows], deltas[k]))
    return out


def recoverability_stats(infos: Sequence[StateInfo]) -> dict:
    """The rollout's figures: ``states`` replayed, how many of them each label got
    (``recoverable``, ``irreversible``, ``ambiguous``) and the mean ``p_cont`` / ``p_roll``
    (None without states)."""
    labels = np.concatenate([i.labels for i in infos]) if infos else np.zeros(0, np.int32)
    p_cont = np.concatenate([i.p_cont for i in infos]) if infos else np.zeros(0)
    p_roll = np.concatenate([i.p_roll for i in infos]) if infos else np.zeros(0)
    mean = lambda x: float(x.mean()) if x.size else None
    return dict(states=int(labels.size), recoverable=int(np.sum(labels == ROLES["retain"])),
                irreversible=int(np.sum(labels == ROLES["rollback"])),
                ambiguous=int(np.sum(labels == AMBIGUOUS)), p_cont=mean(p_cont),
                p_roll=mean(p_roll))
