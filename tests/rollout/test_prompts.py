"""Chat-templated contexts: what goes into the reflection prompt, the hindsight context h and the
privileged contexts, and what must stay out."""
import pytest

from hindsight.rollout import (Templates, hindsight_context, policy_prompt, probe_context,
                               reflection_prompt, teacher_context)
from hindsight.tasks import Example
from tests.rollout.helpers import CharTokenizer

TOK = CharTokenizer()
EX = Example(prompt="What is 2 + 3?", answer="5")
text = lambda ids: TOK.decode(ids, skip_special_tokens=True)


def test_policy_and_reflection_prompt():
    assert text(policy_prompt(TOK, EX)) == "<user>What is 2 + 3?\n<assistant>"
    r = text(reflection_prompt(TOK, EX, "2 + 3 = 6", "expected 5, got 6"))
    assert r.startswith("<system>" + Templates().reflection_system)
    for part in ("What is 2 + 3?", "2 + 3 = 6", "expected 5, got 6"):
        assert part in r
    for duty in ("summarise", "root cause", "reusable fix", "earliest step"):
        assert duty in Templates().reflection_system


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
