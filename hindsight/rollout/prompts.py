"""Chat-templated contexts for rollouts: the policy prompt, HDL's reflection prompt and hindsight
context ``h`` (spec §2), and the privileged contexts of self-distillation (spec §1.3).

Every builder returns token ids (``list[int]``) of a user turn passed through the tokenizer's chat
template with the generation prompt (:func:`hindsight.sampling.text.encode_prompt`), so a response
teacher-forced after it reads exactly as the policy's own answer would. Wording lives in
:class:`Templates` (OUR CHOICE, modelled on SDPO's teacher prompt and R3L's reflection prompt) so a
researcher can change it without touching the code.
"""
from __future__ import annotations

import dataclasses

from hindsight.sampling.text import encode_prompt
from hindsight.tasks import Example

CORRECT_FEEDBACK = "verified correct"


@dataclasses.dataclass(frozen=True)
class Templates:
    """Wording of the rollout contexts (``str.format`` fields in braces).

    Attributes:
      reflection_system: system turn of the reflection call (spec §2: summarise the attempt, trace
        the root cause, state a reusable fix, name the earliest step to change).
      reflection_user: user turn: ``{question}``, ``{attempt}``, ``{feedback}``.
      hindsight: user turn of ``h``: ``{question}``, ``{feedback}``, ``{reflection}``; the attempt
        itself is never pasted (it would make the score trivially small by copying).
      teacher: user turn of the privileged context: ``{question}``, ``{answer}``.
      probe: user turn of the reference-only context: ``{answer}``.
    """
    reflection_system: str = (
        "You review an attempt at a problem. Briefly: summarise what the attempt did, trace the "
        "root cause of its failure (or of its success), state a reusable fix, and name the "
        "earliest step where a different decision would change the outcome.")
    reflection_user: str = ("Problem:\n{question}\n\nAttempt:\n{attempt}\n\n"
                            "Verifier feedback: {feedback}")
    hindsight: str = ("{question}\n\nFeedback on an earlier attempt: {feedback}\n\n"
                      "Reflection: {reflection}\n\n"
                      "Using this, solve the original question correctly.")
    teacher: str = ("{question}\n\nHere is a reference solution:\n{answer}\n\n"
                    "After understanding the reference solution, solve the original question "
                    "correctly.")
    probe: str = "Here is a reference solution:\n{answer}"


def policy_prompt(tokenizer, example: Example) -> list[int]:
    """Token ids of the question as a user turn (what the policy samples after)."""
    return encode_prompt(tokenizer, example.prompt)


def reflection_prompt(tokenizer, example: Example, attempt: str, feedback: str, *,
                      templates: Templates = Templates()) -> list[int]:
    """Token ids of the reflection call's prompt: system instructions, then question + attempt +
    verifier feedback (``"verified correct"`` for correct roots)."""
    user = templates.reflection_user.format(question=example.prompt, attempt=attempt,
                                            feedback=feedback)
    return encode_prompt(tokenizer, user, system=templates.reflection_system)


def hindsight_context(tokenizer, example: Example, feedback: str, reflection: list[int], *,
                      max_reflection_tokens: int, templates: Templates = Templates()) -> list[int]:
    """Token ids of the hindsight context ``h`` (question, feedback, reflection, instruction).

    Args:
      reflection: the reflection's token ids (as sampled; special tokens are dropped on decoding).
      max_reflection_tokens: the reflection is cut from the left to its last this-many tokens, so
        ``h`` stays bounded whatever the reflection call produced (spec §2 numerics).
    """
    if max_reflection_tokens < 0:
        raise ValueError(f"`max_reflection_tokens` must be >= 0, got {max_reflection_tokens}")
    kept = list(reflection)[len(reflection) - max_reflection_tokens:] if max_reflection_tokens \
        else []
    text = tokenizer.decode(kept, skip_special_tokens=True).strip()
    user = templates.hindsight.format(question=example.prompt, feedback=feedback, reflection=text)
    return encode_prompt(tokenizer, user)


def _reference(example: Example, index: int) -> str:
    answer = example.answer
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError(f"example {index} has no reference answer (answer={answer!r}); the "
                         f"'teacher' and 'probe' contexts need one")
    return answer


def teacher_context(tokenizer, example: Example, *, index: int = 0,
                    templates: Templates = Templates()) -> list[int]:
    """Token ids of the privileged context: question + reference answer (OPSD's teacher).
    ``index`` names the example in the error raised when it has no reference answer."""
    return encode_prompt(tokenizer, templates.teacher.format(
        question=example.prompt, answer=_reference(example, index)))


def probe_context(tokenizer, example: Example, *, index: int = 0,
                  templates: Templates = Templates()) -> list[int]:
    """Token ids of the reference-only context (OPSD-PMI's probe: the reference, no question)."""
    return encode_prompt(tokenizer, templates.probe.format(answer=_reference(example, index)))
