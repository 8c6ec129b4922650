"""Math answers by value (math-verify), lettered multiple choice, and the procedural math_word task."""
import re
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import pytest

from hindsight.tasks import MathWord, get_task, verify_choice, verify_math
from hindsight.tasks import math as math_task


@pytest.mark.parametrize("expected, response", [
    ("1/2", "The answer is 0.5."),
    ("1/2", "So the probability is \\boxed{\\frac{1}{2}}."),
    ("1/2", "which gives \\dfrac12"),
    ("0.5", "$\\dfrac12$"),
    ("\\frac{1}{2}", "Final answer: 1/2"),
    ("(1, 2]", "The solution set is \\boxed{(1,2]}"),
    ("\\{1,2\\}", "\\boxed{\\{2, 1\\}}"),
    ("\\{1,2\\}", "Answer: {2, 1}"),
    ("3", "Solving, x = 3"),
    ("3", "\\boxed{x = 3}"),
    ("x = 3", "the answer is 3"),
    ("1000", "In total they have 1,000 apples."),
    ("1,000", "\\boxed{1000}"),
    ("7", "The answer is 7 dollars."),
    ("7", "The answer is: **7**"),
    ("5", "Final answer:\n\n5"),
    ("-4", "x = -4"),
    ("7/6", "\\frac{1}{2}+\\frac{2}{3}=\\frac{7}{6}"),
    ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}"),
    ("Monday", "It is \\boxed{\\text{Monday}}"),
    # A worked solution as the expected answer: its last boxed answer.
    ("so the sum is \\boxed{\\frac{7}{8}}.", "I get 0.875"),
    # A marker followed by prose is no answer: the last number is.
    ("7", "Let's check if the answer is reasonable: 3 + 4 = 7"),
])
def test_equivalent_forms_verify(expected, response):
    v = verify_math(expected, response)
    assert v.reward == 1.0 and v.feedback == "verified correct", v


@pytest.mark.parametrize("expected, response", [
    ("1/2", "\\boxed{3/4}"),
    ("(1, 2]", "\\boxed{[1, 2]}"),
    ("\\{1,2\\}", "\\boxed{\\{1, 3\\}}"),
    ("2", "\\boxed{2.0001}"),
    ("3", "\\boxed{y = 4}"),
    ("1000", "It is 100."),
    ("5", "\\boxed{5} is wrong, the answer is \\boxed{6}"),   # the last box counts
    ("5", "The answer is 5. Actually, the answer is 6."),      # the last marker counts
])
def test_different_answers_do_not_verify(expected, response):
    assert verify_math(expected, response).reward == 0.0


def test_percent_only_with_the_flag():
    # Without it, a percent sign is dropped: 50% is the answer 50, not 0.5.
    assert verify_math("50", "That is \\boxed{50\\%}").reward == 1.0
    assert verify_math("50\\%", "\\boxed{50}").reward == 1.0
    assert verify_math("0.5", "\\boxed{50\\%}").reward == 0.0
    assert verify_math("50\\%", "\\boxed{0.5}").reward == 0.0
    # With it, the expected answer is a percentage, which may be written as a fraction too.
    for response in ("\\boxed{50\\%}", "\\boxed{50}", "\\boxed{0.5}", "\\boxed{\\frac12}",
                     "It is 50 percent."):
        assert verify_math("50", response, percent=True).reward == 1.0, response
        assert verify_math("50\\%", response, percent=True).reward == 1.0, response
    assert verify_math("50", "\\boxed{0.5\\%}", percent=True).reward == 0.0
    assert verify_math("50", "\\boxed{5}", percent=True).reward == 0.0


def test_feedback_names_both_answers():
    v = verify_math("1/2", "So it is \\boxed{3/4}.")
    assert (v.reward, v.feedback, v.extracted) == (0.0, "expected 1/2, got 3/4", "3/4")
    v = verify_math("1/2", "I do not know.")
    assert (v.feedback, v.extracted) == ("expected 1/2, but no answer was found", None)
    assert verify_math("1/2", "\\boxed{\\frac{1}{2}}").extracted == "\\frac{1}{2}"
    assert verify_math("\\boxed{7}", "6").feedback == "expected 7, got 6"


def test_thread_safe():
    """math-verify's signal timeouts raise outside the main thread: verification runs in workers."""
    cases = [("1/2", "\\boxed{0.5}"), ("(1, 2]", "\\boxed{(1,2]}"), ("3", "x = 4"),
             ("\\{1,2\\}", "Answer: {2, 1}"), ("50", "\\boxed{0.5}")] * 4
    math_task._parse.cache_clear()   # parse in the workers, not from the cache
    with ThreadPoolExecutor(4) as pool:
        rewards = list(pool.map(lambda c: verify_math(*c).reward, cases))
    assert rewards == [1.0, 1.0, 0.0, 1.0, 0.0] * 4
    with ThreadPoolExecutor(2) as pool:
        assert pool.submit(verify_math, "50", "\\boxed{0.5}", percent=True).result().reward == 1.0


@pytest.mark.parametrize("response", [
    "10^10^10^10", "\\boxed{10^10^10^10}", "\\boxed{10^{10^{10^{10}}}}", "\\boxed{9^{9^{9^9}}}",
    "\\boxed{2^{1000000000}}", "\\boxed{(2^{9999})^{9999}}", "\\boxed{1000000!}",
    "\\boxed{\\binom{10^{12}}{5}}", "\\boxed{\\sum_{i=1}^{10^{12}} i!}",
    "\\boxed{\\prod_{i=1}^{10^{12}} i}", "\\boxed{(x+1)^{999}}", "\\boxed{(x+y+z)^{99}}",
    "\\boxed{\\frac{(x+1)^{500}}{(x-1)^{500}}}", "x^" * 5000, "9" * 10000, "\\boxed{" * 5000,
    "{" * 10000, "\\(" * 5000, "$" * 10000, "answer: " * 1250, "1/" * 5000,
    "\\frac{" * 3000 + "1" + "}" * 3000, "The answer is " + "(" * 5000,
])
def test_pathological_responses_are_fast(response):
    # This thread's CPU time, not the wall clock: the check runs in the calling thread, and under
    # `make test` the other worker's programs took the cores (a 0.33 s check measured 2.1 s of
    # wall clock in a full run, 2026-12-06).
    start = time.thread_time()
    v = verify_math("5", response)
    assert v.reward == 0.0 and time.thread_time() - start < 2.0


def test_large_but_ordinary_answers_are_checked():
    assert verify_math("1024", "\\boxed{2^{10}}").reward == 1.0
    assert verify_math("(x^2+1)^2", "\\boxed{x^4 + 2x^2 + 1}").reward == 1.0
    assert verify_math("(x+1)^{20}", "\\boxed{(1+x)^{20}}").reward == 1.0
    v = verify_math("5", "\\boxed{10^{10^{10}}}")
    assert v.feedback == "expected 5, got 10^{10^{10}}, which is too long or too large to check"


def test_math_word_splits_are_deterministic_and_disjoint():
    task = get_task("math_word")
    train = task.examples(split="train", count=200, seed=1)
    assert train == task.examples(split="train", count=200, seed=1)
    assert train != task.examples(split="train", count=200, seed=2)
    test = task.examples(split="test", count=50, seed=1)
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert {e.field("kind") for e in train} == {"word", "fraction", "linear"}
    for e in train[:60] + test[:20]:   # the reference answer verifies, boxed or plain
        assert task.verify(e, f"So the answer is \\boxed{{{e.answer}}}.").reward == 1.0, e
        assert task.verify(e, e.answer).reward == 1.0, e
        assert e.prompt.endswith("\\boxed{}.")


def test_math_word_kinds_and_answers():
    fractions = MathWord(kinds="fraction").examples(split="train", count=30, seed=0)
    assert all(e.field("kind") == "fraction" and "lowest terms" in e.prompt for e in fractions)
    for e in fractions:   # the answer is the exact value, reduced
        a, op, b = e.prompt.removeprefix("What is ").split("?")[0].split(" ")
        value = Fraction(a) + Fraction(b) if op == "plus" else Fraction(a) * Fraction(b)
        assert e.answer == str(value)
    for e in MathWord(kinds=("linear",)).examples(split="test", count=30, seed=0):
        left, right = e.prompt.removeprefix("Solve for x: ").split(". ")[0].split(" = ")
        # The solution solves it: "4(x - 2)" evaluates as 4*(x - 2).
        assert eval(re.sub(r"(\d)([x(])", r"\1*\2", left), {"x": int(e.answer)}) == int(right)
    assert MathWord(kinds="word, linear") == MathWord(kinds=("word", "linear"))
    reasoning = MathWord(style="reasoning").examples(split="train", count=3, seed=0)
    direct = MathWord().examples(split="train", count=3, seed=0)
    assert [e.answer for e in reasoning] == [e.answer for e in direct]
    assert all("step by step" in e.prompt and e.prompt.endswith("\\boxed{}.") for e in reasoning)
    wrong = MathWord().verify(direct[0], "\\boxed{12345}")
    assert wrong.feedback == f"expected {direct[0].answer}, got 12345"


def test_math_word_bad_options():
    for kinds in ((), "sums", ("word", "word"), 3):
        with pytest.raises(ValueError, match="`kinds`"):
            MathWord(kinds=kinds)
    with pytest.raises(ValueError, match="`style`"):
        MathWord(style="verbose")
    with pytest.raises(TypeError):
        MathWord("word")   # keyword-only


@pytest.mark.parametrize("response, letter", [
    ("The answer is (B).", "B"),
    ("Answer: B", "B"),
    ("answer: c", "C"),
    ("I would pick **B**", "B"),
    ("The answer is: **C) 42**", "C"),
    ("so \\boxed{B}", "B"),
    ("\\boxed{\\text{C}}", "C"),
    ("B) mitochondria", "B"),
    ("Let me think.\nThe correct option is C", "C"),
    ("We can rule out option A.\nC", "C"),
    ("Option A is wrong. The answer is C, not option A.", "C"),
    ("A) 1\nB) 2\nC) 3\nD) 4\nThe answer is (C)", "C"),
    ("B is correct because it is larger.", "B"),
    ("(D)", "D"),
    ("The answer would be B.", "B"),
    ("I think the answer is a bit unclear, but B", "B"),
    # The article "A" is no answer; an explicit marker is preferred over stray letters.
    ("A good way to see this is to compare the options.\nThe answer is D.", "D"),
    ("A good way to see this is to compare the energies.", None),
    ("I think so.", None),
    # Letters beyond the choices are no answer.
    ("The answer is E", None),
    ("The answer is E.\nSo maybe B is correct", "B"),
])
def test_choice_extraction(response, letter):
    v = verify_choice("B", response, num_choices=4)
    assert v.extracted == letter
    assert v.reward == (1.0 if letter == "B" else 0.0)


def test_choice_feedback_and_arguments():
    assert verify_choice("b", "answer: c", num_choices=4).feedback == "expected B, got C"
    assert (verify_choice("B", "no idea", num_choices=4).feedback
            == "expected B, but no answer letter was found")
    assert verify_choice("E", "The answer is E", num_choices=5).reward == 1.0
    with pytest.raises(ValueError, match="`expected`"):
        verify_choice("E", "E", num_choices=4)
    with pytest.raises(ValueError, match="`num_choices`"):
        verify_choice("A", "A", num_choices=1)


def test_branch_mask_stops_at_the_final_answer():
    from hindsight.tasks import MathWord
    from hindsight.tasks.math import branch_mask_before_answer, final_answer_start
    pieces = ["So ", "3+4", " = 7. ", "The answer is ", "\\boxed{", "7", "}"]
    assert branch_mask_before_answer(pieces) == [True] * 4 + [False] * 3
    assert final_answer_start("x \\boxed{1} then \\boxed{2}") == len("x \\boxed{1} then ")
    assert branch_mask_before_answer(["a", " Final answer:", " 7"]) == [True, True, False]
    assert branch_mask_before_answer(["no", " answer yet"]) == [True, True]
    assert branch_mask_before_answer([]) == []
    task = MathWord()
    ex = task.examples(split="train", count=1, seed=0)[0]
    assert task.branch_mask(ex, pieces) == branch_mask_before_answer(pieces)
