"""Chat-templated contexts for rollouts: the policy prompt, HDL's reflection turn and hindsight
context ``h`` (spec §2), and the privileged contexts of self-distillation (spec §1.3).

Every builder returns token ids (``list[int]``) of a user turn passed through the tokenizer's chat
template with the generation prompt (:func:`hindsight.sampling.text.encode_prompt`), so a response
teacher-forced after it reads exactly as the policy's own answer would; the reflection turn is the
template's continuation of a conversation after the policy's answer. Wording lives in
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
      reflection: the user turn that follows the attempt in the reflection call: ``{feedback}``.
        The question and the attempt are the conversation before it, so the call continues the
        attempt's cached K/V. Terse on purpose: the turn, the reflection (capped at ``T/8`` by
        default) and a root that ran to the cap share the cache room past the response cap. It
        keeps three of spec §2's duties (root cause, fix, earliest step to change) and drops the
        summary of the attempt, which a capped reflection has no room for.
      hindsight: user turn of ``h``: ``{question}``, ``{feedback}``, ``{reflection}``; the attempt
        itself is never pasted (it would make the score trivially small by copying).
      instruction: user turn of a teacher context (:mod:`hindsight.rollout.contexts`):
        ``{question}`` and ``{passages}``, the recipe's available parts joined by blank lines.
      reference_part, hint_part, criteria_part: ``{answer}``; peer_part (a successful peer's
        response, SDPO's "Correct solution"), own_success_part (the row's own verified answer,
        H2SD's rephrasing): ``{solution}``; feedback_part: ``{feedback}``.
      concise_part: BIRD's concise instruction ``c`` (no fields; OUR CHOICE: the seed quotes it
        only as "answer concisely"; this wording names what a concise solution leaves out).
      few_shot_part: Neuron-OPSD's demonstrations, ``{examples}`` (each a ``few_shot_example``:
        ``{question}``, ``{response}``; OUR CHOICE: the spec says only "few-shot demonstrations").
      probe: user turn of the reference-only context: ``{answer}``.
      skill_request: the user turn after a finished answer asking the policy for a skill (SEED's
        analyzer; OUR CHOICE wording, the spec says only "writing skills from its own completed
        trajectories"): ``{verdict}``, one of ``skill_correct`` (a verified answer, no failure
        in its group), ``skill_contrast`` (a verified answer whose group also holds a failed
        attempt: ``{feedback}``, the verifier's on it) or ``skill_failed`` (a failed answer:
        ``{feedback}``). :mod:`hindsight.rollout.generated` picks the answer and the verdict.
      skill_part: the teacher-context passage of a written skill: ``{skill}``.
    """
    reflection: str = "Feedback: {feedback}. Root cause, fix, first step to change?"
    hindsight: str = ("{question}\n\nFeedback on an earlier attempt: {feedback}\n\n"
                      "Reflection: {reflection}\n\n"
                      "Using this, solve the original question correctly.")
    instruction: str = ("{question}\n\n{passages}\n\n"
                        "After understanding the above, solve the original question correctly.")
    reference_part: str = "Here is a reference solution:\n{answer}"
    hint_part: str = "Hint (the key steps and the verified answer):\n{answer}"
    criteria_part: str = ("Criteria for a correct answer: every step follows from the previous one "
                          "and the final answer equals {answer}.")
    peer_part: str = "Correct solution:\n{solution}"
    feedback_part: str = "The following is feedback from your unsuccessful earlier attempt:\n{feedback}"
    own_success_part: str = ("Your earlier answer, verified correct:\n{solution}\n\n"
                             "Rephrase this answer in your own words.")
    concise_part: str = ("Be concise: use as few steps as the problem needs, without restating "
                         "the question, repeating yourself or re-checking finished steps.")
    few_shot_part: str = "Here are similar questions, each with an answer:\n\n{examples}"
    few_shot_example: str = "Question: {question}\nAnswer: {response}"
    probe: str = "Here is a reference solution:\n{answer}"
    skill_request: str = ("{verdict} In one or two sentences, state a reusable skill that would "
                          "make a failed attempt at a question like this one succeed.")
    skill_correct: str = "This answer is verified correct."
    skill_contrast: str = ("This answer is verified correct; another attempt failed "
                           "({feedback}).")
    skill_failed: str = "This answer failed ({feedback})."
    skill_part: str = "A skill for questions like this one:\n{skill}"


def policy_prompt(tokenizer, example: Example) -> list[int]:
    """Token ids of the question as a user turn (what the policy samples after)."""
    return encode_prompt(tokenizer, example.prompt)


def reflection_turn(tokenizer, example: Example, feedback: str, *,
                    templates: Templates = Templates()) -> list[int]:
    """Token ids that follow an attempt (the policy's answer after :func:`policy_prompt`) to ask
    for a reflection on it: the end of the assistant's turn, the user turn
    ``templates.reflection`` with the verifier ``feedback`` (``"verified correct"`` for correct
    attempts), and the generation prompt. ``policy_prompt + attempt + turn`` is the chat template of
    the three-turn conversation (question, attempt, reflection request), so the reflection can be
    sampled from the attempt's cache (:meth:`hindsight.sampling.engine.Engine.submit_extend`).
    An attempt that already ended its turn (sampled the turn-end token the ids start with) takes
    them from the second id on.

    Raises ValueError if the tokenizer's chat template does not render a conversation as the
    prompt of its first turn followed by the answer (then no suffix continues an answer).
    """
    return followup_turn(tokenizer, templates.reflection.format(feedback=feedback),
                         first=example.prompt)


def followup_turn(tokenizer, user: str, *, first: str = "question") -> list[int]:
    """Token ids that end an assistant answer and open the user turn ``user`` with the generation
    prompt: what continues a conversation from an answer's cache (a reflection request, an
    environment's observation). ``first`` is the first user turn the template is rendered with
    (templates do not depend on it past the answer). An answer that already ended its turn
    (sampled the turn-end token the ids start with) takes them from the second id on.

    Raises ValueError if the tokenizer's chat template does not render a conversation as the
    prompt of its first turn followed by the answer (then no suffix continues an answer).
    """
    sentinel = "\x00ATTEMPT\x00"
    messages = [{"role": "user", "content": first}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    whole = tokenizer.apply_chat_template(
        messages + [{"role": "assistant", "content": sentinel}, {"role": "user", "content": user}],
        add_generation_prompt=True, tokenize=False)
    if not whole.startswith(prompt + sentinel) or whole.count(sentinel) != 1:
        raise ValueError("the tokenizer's chat template does not render a conversation as its first "
                         "turn's prompt followed by the answer; continuing an answer from its cache "
                         "(reflections, episode turns) needs one that does")
    return [int(i) for i in tokenizer.encode(whole[len(prompt + sentinel):], add_special_tokens=False)]


def clip_tokens(tokenizer, text: str, max_tokens: int) -> str:
    """``text`` cut to ``max_tokens`` tokens of ``tokenizer``, the last of them an ellipsis when
    cut (verifier feedback before it enters a follow-up turn or a context sized for it)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return text
    keep = max_tokens - len(tokenizer.encode("...", add_special_tokens=False))
    return tokenizer.decode(ids[:max(keep, 0)]) + "..."


def hindsight_context(tokenizer, example: Example, feedback: str, reflection: list[int], *,
                      max_reflection_tokens: int, templates: Templates = Templates(),
                      question: str | None = None) -> list[int]:
    """Token ids of the hindsight context ``h`` (question, feedback, reflection, instruction).

    Args:
      reflection: the reflection's token ids (as sampled; special tokens are dropped on decoding).
      max_reflection_tokens: the reflection is cut from the left to its last this-many tokens, so
        ``h`` stays bounded whatever the reflection call produced (spec §2 numerics).
      question: the policy's first user turn when it is not ``example.prompt`` (an episode's:
        the task's instructions and the environment's first observation).
    """
    if max_reflection_tokens < 0:
        raise ValueError(f"`max_reflection_tokens` must be >= 0, got {max_reflection_tokens}")
    kept = list(reflection)[len(reflection) - max_reflection_tokens:] if max_reflection_tokens \
        else []
    text = tokenizer.decode(kept, skip_special_tokens=True).strip()
    user = templates.hindsight.format(question=example.prompt if question is None else question,
                                      feedback=feedback, reflection=text)
    return encode_prompt(tokenizer, user)


def _reference(example: Example, index: int) -> str:
    answer = example.answer
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError(f"example {index} has no reference answer (answer={answer!r}); the "
                         f"'probe' context needs one")
    return answer


def probe_context(tokenizer, example: Example, *, index: int = 0,
                  templates: Templates = Templates()) -> list[int]:
    """Token ids of the reference-only context (OPSD-PMI's probe: the reference, no question)."""
    return encode_prompt(tokenizer, templates.probe.format(answer=_reference(example, index)))
