"""Chat-templated contexts: what goes into the reflection prompt, the hindsight context h and the
privileged contexts, and what must stay out."""
import pytest

from hindsight.rollout import (Templates, hindsight_context, policy_prompt, probe_context,
                               reflection_turn, teacher_context)
from hindsight.tasks import Example
from tests.rollout.helpers import CharTokenizer

TOK = CharTokenizer()
EX = Example(prompt="What is 2 + 3?", answer="5")
text = lambda ids: TOK.decode(ids, skip_special_tokens=True)


def test_policy_prompt_and_reflection_turn():
    prompt = policy_prompt(TOK, EX)
    assert text(prompt) == "<user>What is 2 + 3?\n<assistant>"
    turn = reflection_turn(TOK, EX, "expected 5, got 6")
    # prompt + attempt + turn is the chat template of the conversation that asks for a reflection
    asked = Templates().reflection.format(feedback="expected 5, got 6")
    assert prompt + TOK.encode("2 + 3 = 6") + turn == TOK.apply_chat_template(
        [{"role": "user", "content": EX.prompt}, {"role": "assistant", "content": "2 + 3 = 6"},
         {"role": "user", "content": asked}])
    assert text(turn) == f"\n<user>{asked}\n<assistant>"
    for duty in ("Root cause", "fix", "first step"):
        assert duty in Templates().reflection
    short = Templates(reflection="{feedback}!")
    assert text(reflection_turn(TOK, EX, "fb", templates=short)) == "\n<user>fb!\n<assistant>"


def test_reflection_turn_needs_a_template_that_keeps_the_answer():
    class DropsAnswers(type(TOK)):  # like templates that strip earlier assistant turns
        def apply_chat_template(self, messages, **kw):
            return super().apply_chat_template(
                [m for m in messages if m["role"] != "assistant"], **kw)

    with pytest.raises(ValueError, match="chat template"):
        reflection_turn(DropsAnswers(), EX, "fb")


def test_hindsight_context_has_no_attempt_and_cuts_reflection_from_the_left():
    reflection = TOK.encode("ABCDEFGHIJ")
    h = text(hindsight_context(TOK, EX, "expected 5, got 6", reflection, max_reflection_tokens=4))
    assert "What is 2 + 3?" in h and "Feedback on an earlier attempt: expected 5, got 6" in h
    assert "Reflection: GHIJ" in h and "F" not in h.split("Reflection: ")[1]
    assert "2 + 3 = 6" not in h
    assert h.rstrip().endswith("<assistant>")
    full = text(hindsight_context(TOK, EX, "fb", reflection, max_reflection_tokens=100))
    assert "Reflection: ABCDEFGHIJ" in full


def test_privileged_contexts():
    t = text(teacher_context(TOK, EX))
    assert "What is 2 + 3?" in t and "reference solution:\n5" in t
    p = text(probe_context(TOK, EX))
    assert "5" in p and "What is" not in p
    with pytest.raises(ValueError, match="example 3 has no reference answer"):
        teacher_context(TOK, Example(prompt="q", answer=""), index=3)
    with pytest.raises(ValueError, match="no reference answer"):
        probe_context(TOK, Example(prompt="q", answer="  "))
