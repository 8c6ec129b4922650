"""Generated context parts: passages the policy itself writes about a group during the rollout.

Most teacher-context parts (:mod:`hindsight.rollout.contexts`) are functions of a group's rows
and verdicts. A *generated* part is a text the policy writes about them: once a group is sampled
and verified, the part's generator (:data:`GENERATORS`, registered under the part's name) picks
one of the group's rows and a user turn (a :class:`Request`), or declines; the rollout's engine
continues that row's conversation (question, answer, then the turn) from its cached K/V
(:meth:`hindsight.sampling.engine.Engine.submit_extend`: only the turn is computed, as for HDL's
reflections) and samples at most :attr:`GenerationOptions.max_tokens` tokens with the rollout's
sampling parameters, keyed by the group's number (``first_index + k``), so the text does not
depend on which batch or process samples the group. The group keeps it
(:attr:`hindsight.rollout.assemble.GroupRows.generated`) and the context part of the same name
reads it (``view.generated[name]``): a group its generator declined has no such part, so a
recipe made of it leaves the group's rows without a context (``teacher_row_mask`` 0).

Who runs the generators: the ``group`` rollout, for the parts its method's teacher-context recipe
names (:func:`generated_parts`); SFT's ``completions="generated"`` trains on the texts
themselves (:func:`hindsight.rollout.completions.generated_completions`, SEED's stage 1), kept
by their :func:`context_gain`.

Registered:

* ``skill`` (SEED, other-methods §11; the rule is OUR CHOICE: the spec says only that the
  snapshot policy "writes skills from its own completed trajectories"): one skill per group,
  written from its *finished* rows (ended on a stop token before the cap; a trajectory cut at
  the cap is not a completed one). It continues the conversation of the group's first finished
  success (reward >= 0.5) with its verdict ("verified correct") and, when the group also holds a
  finished failure, the verifier's feedback on the first of them, the contrast the skill should
  bridge (``Templates.skill_contrast``); a group whose finished rows all failed continues the
  first of them with its own feedback (``skill_failed``); a group with nothing finished gets no
  skill. The turn asks for "a reusable skill that would make a failed attempt at a question like
  this one succeed" in one or two sentences (``Templates.skill_request``). One skill per group,
  not per row: a skill is what the group's attempts teach about the question, shared by its
  rows, and a group costs one short decode.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import jax
import numpy as np

from hindsight._registry import Registry
from hindsight.rollout.assemble import GroupRows, finished
from hindsight.rollout.contexts import GroupView, parse_recipe, row_context
from hindsight.rollout.prompts import Templates, clip_tokens, followup_turn
from hindsight.rollout.runtime import PhaseClock, fit_width, request_key
from hindsight.rollout.verification import decode
from hindsight.sampling import SamplingParams, score_logprobs
from hindsight.sampling.buckets import round16
from hindsight.sampling.text import encode_prompt

GENERATORS = Registry("generated context part")
_STREAM = 0x5E3D  # fold_in index of a group's generated parts (apart from its samples' keys)


@dataclasses.dataclass(frozen=True)
class GenerationOptions:
    """How the generated parts are written (rollout settings, OUR CHOICE).

    Attributes:
      max_tokens: cap on each generated text (``rollout.generated_max_tokens``; 48: a sentence
        or two). A text whose conversation would overflow the engine's cache (a turn longer than
        expected) is cut to the room left.
      feedback_max_tokens: the verifier feedback a turn quotes is cut to this many tokens (an
        ellipsis marks the cut; ``rollout.feedback_max_tokens``): the cache is sized for it.
    """
    max_tokens: int = 48
    feedback_max_tokens: int = 16

    def __post_init__(self):
        for name in ("max_tokens", "feedback_max_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"`{name}` must be a positive int, got {v!r}")


@dataclasses.dataclass(frozen=True)
class Request:
    """A generator's request for one group: continue row ``row``'s conversation with the user
    turn ``user``."""
    row: int
    user: str


@dataclasses.dataclass(frozen=True)
class Generator:
    """A registered generated part.

    Attributes:
      request: ``request(view, finished) -> Request | None``, from the group's
        :class:`~hindsight.rollout.contexts.GroupView` (its feedback already cut to
        :attr:`GenerationOptions.feedback_max_tokens`) and ``finished [G]`` bool (the rows that
        ended on a stop token); None: the group gets no such part.
      turns: ``turns(templates) -> tuple[str, ...]``, every user turn ``request`` may write, with
        the quoted feedback empty: the engine's cache is sized for the longest of them plus the
        feedback cap.
    """
    request: Callable[[GroupView, np.ndarray], Request | None]
    turns: Callable[[Templates], tuple[str, ...]]


@dataclasses.dataclass(frozen=True)
class Generated:
    """One group's generated part.

    Attributes:
      text: the decoded text (special tokens dropped, stripped).
      tokens: ``[n]`` int32 the sampled ids (the stop token included when it ended on one).
      prompt: ``[m]`` int32 the conversation it continued: the row's prompt and response, then
        the turn (what SFT on the text trains it after).
      row: the group's row whose conversation it continued.
      finished: it ended on a stop token (not at its cap).
    """
    text: str
    tokens: np.ndarray
    prompt: np.ndarray
    row: int
    finished: bool


def _skill_request(view: GroupView, done: np.ndarray) -> Request | None:
    rows = np.flatnonzero(done)
    wins = [int(r) for r in rows if view.succeeded(int(r))]
    losses = [int(r) for r in rows if not view.succeeded(int(r))]
    t = view.templates
    if wins:
        row = wins[0]
        verdict = (t.skill_contrast.format(feedback=view.feedback[losses[0]].strip()) if losses
                   else t.skill_correct)
    elif losses:
        row = losses[0]
        verdict = t.skill_failed.format(feedback=view.feedback[row].strip())
    else:
        return None
    return Request(row=row, user=t.skill_request.format(verdict=verdict))


def _skill_turns(t: Templates) -> tuple[str, ...]:
    verdicts = (t.skill_correct, t.skill_contrast.format(feedback=""),
                t.skill_failed.format(feedback=""))
    return tuple(t.skill_request.format(verdict=v) for v in verdicts)


GENERATORS.register("skill")(Generator(request=_skill_request, turns=_skill_turns))


def generated_parts(recipe) -> tuple[str, ...]:
    """The generated parts (names in :data:`GENERATORS`) that a teacher-context ``recipe``
    names, in recipe order."""
    names = [n for names in parse_recipe(recipe) for n in names if n in GENERATORS.names()]
    return tuple(dict.fromkeys(names))


class PartWriter:
    """The rollout's side of :data:`GENERATORS` for one call of
    :func:`hindsight.rollout.group.sample_groups`: after a group's verdicts, each named part's
    request is sampled from the group's cache in the same engine (tag ``(k, name)``), and
    :meth:`store` puts the result in the group's ``generated``.

    Args:
      names: the generated parts to write (registered names).
      params: the rollout's sampling parameters (their stop tokens say which rows finished).
      key: the rollout's key; group ``k``'s part ``j`` samples with
        ``request_key(key, first_index + k, STREAM, j)``.
      clock: records the texts' tokens under ``"generated"``.
    """

    def __init__(self, tokenizer, names: Sequence[str], *, params: SamplingParams, key,
                 options: GenerationOptions = GenerationOptions(),
                 templates: Templates = Templates(), first_index: int = 0,
                 clock: PhaseClock | None = None):
        self.generators = {name: GENERATORS.get(name) for name in names}
        self.tokenizer, self.params, self.key = tokenizer, params, key
        self.options, self.templates, self.first_index = options, templates, first_index
        self.clock = clock if clock is not None else PhaseClock()

    def room(self) -> int:
        """Cache room a row needs past its response: the longest turn (with the feedback cap,
        rounded up to a multiple of 16 so that tokenisation at the seams does not change it)
        and the text."""
        turns = [len(followup_turn(self.tokenizer, user)) for g in self.generators.values()
                 for user in g.turns(self.templates)]
        return round16(max(turns) + self.options.feedback_max_tokens) + self.options.max_tokens

    def submit(self, engine, k: int, group: GroupRows, rollouts) -> None:
        """Queue group ``k``'s parts; ``rollouts`` is its sampled result, with its cache."""
        clip = lambda text: clip_tokens(self.tokenizer, text, self.options.feedback_max_tokens)
        base = request_key(self.key, self.first_index + k, _STREAM)
        view = GroupView(example=group.example, texts=group.texts, rewards=group.rewards,
                         feedback=[clip(f) for f in group.feedback], templates=self.templates,
                         rng=np.random.default_rng(np.asarray(jax.random.key_data(base))))
        done = finished(group, self.params.stop_tokens)
        for j, (name, generator) in enumerate(self.generators.items()):
            request = generator.request(view, done)
            if request is None:
                continue
            ids = followup_turn(self.tokenizer, request.user)
            n = int(group.lengths[request.row])
            if n and group.tokens[request.row, n - 1] == ids[0]:
                ids = ids[1:]  # the answer ended its turn itself
            room = engine.max_len - int(rollouts.prompt_lengths[request.row]) - n - len(ids)
            if room < 1:
                raise ValueError(f"row {request.row} of example {group.example_index} and the "
                                 f"{name!r} turn ({len(ids)} tokens) leave no room in the cache "
                                 f"({engine.max_len})")
            engine.submit_extend(rollouts, [request.row], [ids],
                                 max_new_tokens=[min(self.options.max_tokens, room)],
                                 row_keys=jax.random.fold_in(base, j)[None], tag=(k, name))

    def store(self, group: GroupRows, name: str, rollouts) -> None:
        """Keep a finished request's text as ``group.generated[name]``."""
        n = int(rollouts.lengths[0])
        self.clock.tokens["generated"] += n
        group.generated_tokens += n
        group.generated[name] = Generated(
            text=decode(self.tokenizer, rollouts.tokens[0], n).strip(),
            tokens=np.asarray(rollouts.tokens[0, :n], np.int32),
            prompt=np.asarray(rollouts.prompt(0), np.int32), row=int(rollouts.parents[0]),
            finished=bool(rollouts.stopped[0]))


def context_gain(model, tokenizer, groups: Sequence[GroupRows], name: str, *, temperature: float,
                 templates: Templates = Templates()) -> np.ndarray:
    """How much each group's generated part ``name`` helps its successful responses: the token
    mean, over every token of the group's successful rows (reward >= 0.5), of
    ``log pi(y_t | context of recipe (name,)) - log pi(y_t | question)`` at ``temperature``: the
    stage-2 teacher's context against the policy's (SEED's ``Delta``, averaged). Only the context
    side is scored (teacher-forced, one call): the question side is the group's
    ``policy_logprobs``, which the sampler recorded for the same tokens under the same prompt.

    Args:
      temperature: the temperature the groups were sampled at, ``params.policy_temperature``
        (their ``policy_logprobs`` are at it).
    Returns:
      ``[P]`` float64; NaN for a group without the part or without a success to score.
    """
    gains = np.full(len(groups), math.nan)
    contexts, responses, recorded, owners = [], [], [], []
    for i, g in enumerate(groups):
        part = g.generated.get(name)
        if part is None:
            continue
        view = GroupView(example=g.example, texts=g.texts, rewards=g.rewards,
                         feedback=g.feedback, templates=templates,
                         rng=np.random.default_rng(0), generated={name: part.text})
        wins = [r for r in range(g.size) if view.succeeded(r) and g.lengths[r] > 0]
        user = row_context(view, 0, (name,))
        if not wins or user is None:
            continue
        context = encode_prompt(tokenizer, user)
        for r in wins:
            contexts.append(context)
            responses.append(g.tokens[r, :g.lengths[r]])
            recorded.append(g.policy_logprobs[r])
            owners.append(i)
    if not owners:
        return gains
    width = groups[0].tokens.shape[1]  # the response width: one compiled shape per run
    scored = fit_width(np.asarray(score_logprobs(model, contexts, responses, min_response_len=width,
                                                 temperature=temperature), np.float64), width)
    shift = scored - np.asarray(recorded, np.float64)
    lengths = np.array([len(r) for r in responses])
    live = np.arange(width)[None, :] < lengths[:, None]
    owners = np.asarray(owners)
    for i in np.unique(owners):
        rows = owners == i
        gains[i] = np.sum(np.where(live[rows], shift[rows], 0.0)) / live[rows].sum()
    return gains
