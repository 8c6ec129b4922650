"""Synthetic tasks: deterministic, disjoint splits, verifiers tolerant to format and strict on content."""
import pytest

from hindsight.tasks import Example, get_task, task_names


@pytest.mark.parametrize("name", ["reverse", "count_letters", "arithmetic", "sort_numbers", "even_length"])
def test_splits_are_deterministic_and_disjoint(name):
    task = get_task(name)
    train = task.examples(split="train", count=40, seed=1)
    assert train == task.examples(split="train", count=40, seed=1)
    assert train != task.examples(split="train", count=40, seed=2)
    test = task.examples(split="test", count=10, seed=1)
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    for e in train + test:   # the reference answer verifies as correct, written plainly
        assert task.verify(e, e.answer).reward == 1.0


def test_reverse_verifier():
    task = get_task("reverse")
    ex = Example(prompt="", answer="dog, phone, sun", data=("sun", "phone", "dog"))
    assert task.verify(ex, "The list in reverse order is: Dog, PHONE; sun.").reward == 1.0
    assert task.verify(ex, "sun, phone, dog\nReversed:\ndog - phone - sun").reward == 1.0
    bad = task.verify(ex, "dog, sun, sun")
    assert bad.reward == 0.0 and bad.feedback == "expected `dog, phone, sun`, got `dog, sun, sun`"
    assert "no list" in task.verify(ex, "I cannot do that.").feedback
    assert task.verify(ex, "dog, phone, sun\nor maybe sun, phone, dog").reward == 0.0  # last line counts


def test_integer_verifiers():
    arith = get_task("arithmetic")
    ex = Example(prompt="", answer="47", data=(12, "+", 35))
    assert arith.verify(ex, "12 + 35 = 47.").reward == 1.0
    big = Example(prompt="", answer="1234", data=(1234, "+", 0))
    assert arith.verify(big, "The answer is 1,234.").reward == 1.0   # thousands separators are dropped
    v = arith.verify(ex, "12 + 35 = 50")
    assert v.reward == 0.0 and v.feedback == "expected 47, got 50"
    assert arith.verify(ex, "forty seven").feedback == "expected 47, but no number was found"
    neg = Example(prompt="", answer="-3", data=(2, "-", 5))
    assert arith.verify(neg, "2 - 5 = -3").reward == 1.0


def test_sort_verifier():
    task = get_task("sort_numbers")
    ex = Example(prompt="", answer="3, 7, 19", data=(19, 3, 7))
    assert task.verify(ex, "Sorted: 3 < 7 < 19").reward == 1.0
    assert task.verify(ex, "3, 19, 7").feedback == "expected `3, 7, 19`, got `3, 19, 7`"


@pytest.mark.parametrize("name", ["reverse", "count_letters", "arithmetic", "sort_numbers", "even_length"])
@pytest.mark.parametrize("style", ["reasoning", "explain"])
def test_styles_change_prompt_not_answer(name, style):
    d = get_task(name).examples(split="train", count=3, seed=0)
    r = get_task(name, style=style).examples(split="train", count=3, seed=0)
    assert [e.answer for e in d] == [e.answer for e in r]
    assert [e.data for e in d] == [e.data for e in r]
    assert all(e.prompt.startswith(f.prompt) and "step by step" in e.prompt and
               e.prompt.endswith("alone on the last line.") for e, f in zip(r, d))
    assert ("Explain your reasoning" in r[0].prompt) == (style == "explain")


def test_bad_input():
    with pytest.raises(ValueError, match="unknown task 'nope'.*arithmetic"):
        get_task("nope")
    with pytest.raises(ValueError, match="split"):
        get_task("reverse").examples(split="dev", count=1, seed=0)
    with pytest.raises(ValueError, match="style"):
        get_task("reverse", style="verbose")
    assert set(task_names()) >= {"reverse", "count_letters", "arithmetic", "sort_numbers"}


def test_even_length_verifier():
    task = get_task("even_length")
    ex = task.examples(split="train", count=1, seed=0)[0]
    assert task.verify(ex, " tree ").reward == 1.0 and task.verify(ex, "cat").reward == 0.0
    assert task.verify(ex, "cat").feedback == "expected an even number of characters, got 3"


def test_huge_numbers_do_not_raise():
    """Python refuses to convert more than 4,300 digits; a degenerate response may write them."""
    task = get_task("count_letters")
    ex = task.examples(split="train", count=1, seed=0)[0]
    for text in ("9" * 5000, f"{'1' * 5000} then {ex.answer}", "1 2\n" + "3" * 6000 + " 4"):
        v = task.verify(ex, text)
        assert v.reward in (0.0, 1.0)
    assert task.verify(ex, f"{'1' * 5000} so {ex.answer}").reward == 1.0
    assert get_task("sort_numbers").verify(Example("", "1, 2", (2, 1)), "7" * 5000).reward == 0.0
