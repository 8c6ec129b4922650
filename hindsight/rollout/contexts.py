"""Teacher contexts as registered parts: what a self-teacher is shown about a row.

A method that reads the ``teacher`` context names a **recipe** (``teacher_context`` in its config):
a tuple of parts, each a part name or alternatives joined by ``|`` (the first that a row has is
used). A part is a registered function ``part(view, row) -> str | None`` from the group's rows and
verdicts (:class:`GroupView`) to a passage of text, or None when the row has none. The row's
context is the question, then every available part's passage in recipe order, then
``Templates.instruction``, as one user turn; a row none of whose parts is available **has no
context**: its teacher tokens are the plain question and the batch's ``teacher_row_mask`` is 0 on
it, so the loss leaves it out (SDPO's ``self_distillation_mask``).

    ("reference",)                    OPSD, RLSD: question + reference answer
    ("successful_peer|feedback",)     SDPO: a successful peer, else the verifier's feedback
    ("successful_peer", "reference")  HSD: a peer (if any) and the reference answer
    ("own_success|hint",)             H2SD: the row's own correct answer, else the hint
    ("concise",)                      BIRD: question + the concise instruction
    ("skill",)                        SEED: question + the skill the policy wrote for the group

Parts (wording in :class:`hindsight.rollout.prompts.Templates`): ``reference`` (the example's
reference answer), ``criteria`` (CriPO's criterion, OUR CHOICE: what a correct answer must
satisfy, built from the reference answer), ``hint`` (the same answer as a hint of the key steps), ``successful_peer``
(SDPO's rule: the first other row of the group with reward >= ``success_threshold``, thinking
stripped), ``random_successful_peer`` (HSD's OUR CHOICE: one of them drawn uniformly from the
rollout's seed), ``feedback`` (the verifier's feedback on a row that failed; none on a success),
``own_success`` (the row's own response when it succeeded, with the rephrasing instruction),
``concise`` (BIRD's concise instruction ``c``: every row has it, no reference answer needed),
``few_shot`` (Neuron-OPSD's demonstrations: the questions and zero-shot responses its data
selection attached to the example, :mod:`hindsight.rollout.neuron_selection`; none on an example
without them), ``skill`` (SEED's: the skill the policy itself wrote from the group's finished
trajectories during the rollout, a *generated* part, :mod:`hindsight.rollout.generated`; none on
a group it wrote none for).
A researcher adds a part with ``@CONTEXT_PARTS.register("name")``; a part the policy writes
during the rollout also registers its generator in
:data:`hindsight.rollout.generated.GENERATORS` under the same name.

The parts of :data:`EXAMPLE_PARTS` read only the example, so a context made of them can be built
before anything is sampled (:func:`teacher_context`): the ``completions`` rollout samples the
policy under one (SFT on the policy's own samples, BIRD's stage 1).
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

import numpy as np

from hindsight._registry import Registry
from hindsight.rollout.prompts import Templates
from hindsight.sampling.text import encode_prompt
from hindsight.tasks import SUCCESS_REWARD, Example

CONTEXT_PARTS = Registry("teacher context part")
ANSWER_PARTS = ("reference", "criteria", "hint")
"""The parts built from the example's reference answer (every row has them when it has one)."""
INSTRUCTION_PARTS = ("concise",)
"""The parts every row has whatever its example: fixed instructions."""
EXAMPLE_PARTS = ANSWER_PARTS + INSTRUCTION_PARTS
"""The parts that read only the example, never the group's rows: every row of a group has them
or none does, and a context made of them exists before anything is sampled."""
REFERENCE_RECIPE = ("reference",)
"""The recipe of methods whose config names none: question + reference answer."""
_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class GroupView:
    """What a context part reads about one group.

    Attributes:
      example: the group's example. texts: the decoded responses, in row order. rewards: ``[G]``
        the verifier rewards. feedback: the verifier's feedback per row.
      templates: the wording. rng: a generator seeded by the rollout (random choices).
      success_threshold: reward at or above which a row counts as a success.
      generated: the texts the policy wrote about the group during the rollout, by generated
        part (:mod:`hindsight.rollout.generated`: ``{"skill": ...}``); a part the group has none
        of is absent.
    """
    example: Example
    texts: Sequence[str]
    rewards: np.ndarray
    feedback: Sequence[str]
    templates: Templates
    rng: np.random.Generator
    success_threshold: float = SUCCESS_REWARD
    generated: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def successes(self, row: int) -> list[int]:
        """The other rows of the group that succeeded, in row order."""
        return [j for j, r in enumerate(self.rewards)
                if j != row and float(r) >= self.success_threshold]

    def succeeded(self, row: int) -> bool:
        return float(self.rewards[row]) >= self.success_threshold


def strip_thinking(text: str) -> str:
    """``text`` without ``<think>...</think>`` blocks (an unclosed one runs to the end)."""
    return _THINK.sub("", text).strip()


def _answer(view: GroupView) -> str | None:
    answer = view.example.answer
    return answer if isinstance(answer, str) and answer.strip() else None


@CONTEXT_PARTS.register("reference")
def reference(view: GroupView, row: int) -> str | None:
    answer = _answer(view)
    return None if answer is None else view.templates.reference_part.format(answer=answer)


@CONTEXT_PARTS.register("criteria")
def criteria(view: GroupView, row: int) -> str | None:
    answer = _answer(view)
    return None if answer is None else view.templates.criteria_part.format(answer=answer)


@CONTEXT_PARTS.register("hint")
def hint(view: GroupView, row: int) -> str | None:
    answer = _answer(view)
    return None if answer is None else view.templates.hint_part.format(answer=answer)


def _peer(view: GroupView, peer: int) -> str:
    return view.templates.peer_part.format(solution=strip_thinking(view.texts[peer]))


@CONTEXT_PARTS.register("successful_peer")
def successful_peer(view: GroupView, row: int) -> str | None:
    peers = view.successes(row)
    return _peer(view, peers[0]) if peers else None


@CONTEXT_PARTS.register("random_successful_peer")
def random_successful_peer(view: GroupView, row: int) -> str | None:
    peers = view.successes(row)
    return _peer(view, peers[int(view.rng.integers(len(peers)))]) if peers else None


@CONTEXT_PARTS.register("feedback")
def feedback(view: GroupView, row: int) -> str | None:
    text = view.feedback[row] if row < len(view.feedback) else ""
    if view.succeeded(row) or not text or not text.strip():
        return None
    return view.templates.feedback_part.format(feedback=text.strip())


@CONTEXT_PARTS.register("concise")
def concise(view: GroupView, row: int) -> str | None:
    return view.templates.concise_part


@CONTEXT_PARTS.register("few_shot")
def few_shot(view: GroupView, row: int) -> str | None:
    shots = view.example.extra("few_shot")
    if not shots:
        return None
    examples = "\n\n".join(view.templates.few_shot_example.format(
        question=question, response=strip_thinking(response)) for question, response in shots)
    return view.templates.few_shot_part.format(examples=examples)


@CONTEXT_PARTS.register("skill")
def skill(view: GroupView, row: int) -> str | None:
    text = view.generated.get("skill", "").strip()
    return view.templates.skill_part.format(skill=text) if text else None


@CONTEXT_PARTS.register("own_success")
def own_success(view: GroupView, row: int) -> str | None:
    if not view.succeeded(row):
        return None
    return view.templates.own_success_part.format(solution=strip_thinking(view.texts[row]))


def parse_recipe(recipe, *, where: str = "teacher_context") -> tuple[tuple[str, ...], ...]:
    """``recipe`` (a tuple of part names, alternatives joined by ``|``) as a tuple of alternative
    tuples; raises ValueError naming ``where`` for an empty recipe or an unknown part."""
    if isinstance(recipe, str) or not isinstance(recipe, Sequence) or not recipe:
        raise ValueError(f"`{where}` must be a non-empty tuple of context parts (alternatives "
                         f"joined by '|'), got {recipe!r}; parts: {CONTEXT_PARTS.names()}")
    out = []
    for item in recipe:
        names = tuple(str(item).split("|"))
        for name in names:
            if name not in CONTEXT_PARTS.names():
                raise ValueError(f"`{where}` names unknown context part {name!r}; parts: "
                                 f"{CONTEXT_PARTS.names()}")
        out.append(names)
    return tuple(out)


def always_available(recipe) -> bool:
    """Whether every row has a context under ``recipe`` when the examples have reference answers:
    some item of it offers a part of :data:`ANSWER_PARTS` or :data:`INSTRUCTION_PARTS`."""
    return any(set(ANSWER_PARTS + INSTRUCTION_PARTS) & set(names)
               for names in parse_recipe(recipe))


def needs_answer(recipe) -> bool:
    """Whether ``recipe`` reads the examples' reference answers."""
    return any(set(ANSWER_PARTS) & set(names) for names in parse_recipe(recipe))


def row_context(view: GroupView, row: int, recipe) -> str | None:
    """The user turn of row ``row``'s teacher context under ``recipe``, or None if it has none."""
    passages = []
    for names in parse_recipe(recipe):
        for name in names:
            text = CONTEXT_PARTS.get(name)(view, row)
            if text is not None:
                passages.append(text)
                break
    if not passages:
        return None
    return view.templates.instruction.format(question=view.example.prompt,
                                             passages="\n\n".join(passages))


def check_example_recipe(recipe, *, where: str = "recipe") -> None:
    """Raise ValueError naming ``where`` unless ``recipe`` is a valid recipe of
    :data:`EXAMPLE_PARTS` only (a context that exists before anything is sampled)."""
    rowwise = sorted({n for names in parse_recipe(recipe, where=where) for n in names}
                     - set(EXAMPLE_PARTS))
    if rowwise:
        raise ValueError(f"`{where}` names part(s) {rowwise}, which read the group's sampled rows; "
                         f"a context built before sampling takes only {list(EXAMPLE_PARTS)}")


def teacher_context(tokenizer, example: Example, *, index: int = 0,
                    templates: Templates = Templates(), recipe=REFERENCE_RECIPE) -> list[int]:
    """Token ids of the context of ``recipe`` built from the example alone (parts of
    :data:`EXAMPLE_PARTS`): by default question + reference answer (OPSD's teacher); with
    ``("concise",)`` question + concise instruction (BIRD's sampling prompt). ``index`` names the
    example in the error raised when it has no reference answer the recipe needs."""
    check_example_recipe(recipe)
    view = GroupView(example=example, texts=(), rewards=np.zeros(0), feedback=(),
                     templates=templates, rng=np.random.default_rng(0))
    user = row_context(view, 0, recipe)
    if user is None:
        raise ValueError(f"example {index} has no reference answer (answer={example.answer!r}); "
                         f"the 'teacher' context of recipe {tuple(recipe)} needs one")
    return encode_prompt(tokenizer, user)


def teacher_contexts(tokenizer, views: Sequence[GroupView], recipe) -> tuple[list, np.ndarray]:
    """Every row's teacher context under ``recipe``, groups in order.

    Returns:
      ``(contexts, row_mask)``: ``B`` token-id lists (a row without a context gets the plain
      question, the policy prompt, as a placeholder) and ``[B]`` float32, 1 on rows with a context.
    """
    contexts, row_mask = [], []
    for view in views:
        for row in range(len(view.texts)):
            user = row_context(view, row, recipe)
            row_mask.append(0.0 if user is None else 1.0)
            contexts.append(encode_prompt(tokenizer, view.example.prompt if user is None else user))
    return contexts, np.asarray(row_mask, np.float32)
