"""Synthetic verifiable tasks sized for a 135M-parameter model (SmolLM2 solves 2-20% of them).

Each task draws items from a seeded generator; an item belongs to the ``test`` split when a stable hash
of its canonical form is 0 mod 5, so the splits are disjoint whatever the seeds. The ``style`` appends
an instruction to the question (the answer and verifier do not change):

* ``"direct"``: nothing (short answers).
* ``"reasoning"``: step-by-step work before the answer. SmolLM2-135M-Instruct often answers in a
  sentence anyway (arithmetic: 63 tokens on average at temperature 1, cap 128).
* ``"explain"``: asks for the reasoning to be explained step by step: SmolLM2's responses are
  longer and less bimodal (count_letters at temperature 0.7, min-p 0.1, cap 128: 92 tokens on
  average, 11% correct; HDL's token economics are measured on responses of 64+ tokens).
"""
from __future__ import annotations

import dataclasses
import random

from hindsight._validation import check_choice
from hindsight.tasks.base import Example, Verdict, draw_examples, register
from hindsight.tasks.extract import integer_lists, last_integer, word_lists

NOUNS = ("apple", "bird", "book", "car", "cat", "chair", "cloud", "cup", "dog", "door", "fish", "flower",
         "hat", "house", "key", "lamp", "moon", "phone", "river", "shoe", "star", "sun", "table", "tree")
LONG_WORDS = ("banana", "strawberry", "mississippi", "committee", "balloon", "bookkeeper", "letter",
              "parallel", "pepper", "coffee", "assessment", "butterfly", "tomorrow", "success", "address")
STYLES = ("direct", "reasoning", "explain")
TASKS = ("reverse", "count_letters", "arithmetic", "sort_numbers", "even_length")
"""The registry names this module defines (the ``smollm2-<task>`` config variants)."""
_STYLE_SUFFIX = {
    "direct": "",
    "reasoning": " Think step by step, then write the final answer alone on the last line.",
    "explain": " Explain your reasoning step by step, then write the final answer alone on the last line.",
}


def _fmt(items) -> str:
    return ", ".join(str(x) for x in items)


def _last_list_verdict(expected: list, lists: list[list], *, what: str) -> Verdict:
    """Reward 1 iff the response's last candidate list (one per line) equals ``expected``."""
    if not lists:
        return Verdict(0.0, f"expected `{_fmt(expected)}`, but no list of {what} was found")
    got = lists[-1]
    if got == expected:
        return Verdict(1.0, "verified correct", _fmt(got))
    return Verdict(0.0, f"expected `{_fmt(expected)}`, got `{_fmt(got)}`", _fmt(got))


@register("reverse")
@dataclasses.dataclass(frozen=True)
class ReverseWords:
    """Reverse a list of 3-5 nouns. Reward 1 iff the last line naming nouns lists exactly the reversal."""
    min_words: int = 3
    max_words: int = 5
    style: str = "direct"
    name: str = "reverse"

    def __post_init__(self):
        check_choice("style", self.style, STYLES)
        if not 2 <= self.min_words <= self.max_words <= len(NOUNS):
            raise ValueError(f"need 2 <= min_words <= max_words <= {len(NOUNS)}, got "
                             f"{self.min_words}, {self.max_words}")

    def _make(self, rng: random.Random):
        words = rng.sample(NOUNS, rng.randint(self.min_words, self.max_words))
        answer = _fmt(reversed(words))
        prompt = (f"Reverse the order of this list of words: {_fmt(words)}. "
                  f"Answer with the reversed list, separated by commas.{_STYLE_SUFFIX[self.style]}")
        return _fmt(words), Example(prompt=prompt, answer=answer, data=tuple(words))

    def examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        return draw_examples(self._make, split=split, count=count, seed=seed)

    def verify(self, example: Example, response: str) -> Verdict:
        return _last_list_verdict(list(reversed(example.data)), word_lists(response, set(NOUNS)),
                                  what="words")


@dataclasses.dataclass(frozen=True)
class _IntegerAnswer:
    """Shared verifier for tasks whose answer is one integer: the last integer of the response."""

    def verify(self, example: Example, response: str) -> Verdict:
        got = last_integer(response)
        if got is None:
            return Verdict(0.0, f"expected {example.answer}, but no number was found")
        if str(got) == example.answer:
            return Verdict(1.0, "verified correct", str(got))
        return Verdict(0.0, f"expected {example.answer}, got {got}", str(got))


@register("count_letters")
@dataclasses.dataclass(frozen=True)
class CountLetters(_IntegerAnswer):
    """How many times a letter occurs in a word (letters that occur at least once)."""
    style: str = "direct"
    name: str = "count_letters"

    def __post_init__(self):
        check_choice("style", self.style, STYLES)

    def _make(self, rng: random.Random):
        word = rng.choice(LONG_WORDS)
        letter = rng.choice(sorted(set(word)))
        prompt = (f"How many times does the letter '{letter}' appear in the word '{word}'? "
                  f"Answer with a number.{_STYLE_SUFFIX[self.style]}")
        return f"{word}:{letter}", Example(prompt=prompt, answer=str(word.count(letter)), data=(word, letter))

    def examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        return draw_examples(self._make, split=split, count=count, seed=seed)


@register("arithmetic")
@dataclasses.dataclass(frozen=True)
class Arithmetic(_IntegerAnswer):
    """``a op b`` with 1-2 digit operands and op in + - *."""
    max_operand: int = 99
    ops: str = "+-*"
    style: str = "direct"
    name: str = "arithmetic"

    def __post_init__(self):
        check_choice("style", self.style, STYLES)
        if not self.ops or set(self.ops) - set("+-*"):
            raise ValueError(f"`ops` must be a non-empty string over '+-*', got {self.ops!r}")
        if self.max_operand < 1:
            raise ValueError(f"`max_operand` must be >= 1, got {self.max_operand}")

    def _make(self, rng: random.Random):
        a, b, op = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand), rng.choice(self.ops)
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        prompt = f"What is {a} {op} {b}? Answer with a number.{_STYLE_SUFFIX[self.style]}"
        return f"{a}{op}{b}", Example(prompt=prompt, answer=str(value), data=(a, op, b))

    def examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        return draw_examples(self._make, split=split, count=count, seed=seed)


@register("sort_numbers")
@dataclasses.dataclass(frozen=True)
class SortNumbers:
    """Sort 3-5 distinct integers in [0, 99] ascending. Reward 1 iff the last list line is sorted input."""
    min_items: int = 3
    max_items: int = 5
    style: str = "direct"
    name: str = "sort_numbers"

    def __post_init__(self):
        check_choice("style", self.style, STYLES)
        if not 2 <= self.min_items <= self.max_items <= 100:
            raise ValueError(f"need 2 <= min_items <= max_items <= 100, got {self.min_items}, {self.max_items}")

    def _make(self, rng: random.Random):
        nums = rng.sample(range(100), rng.randint(self.min_items, self.max_items))
        prompt = (f"Sort these numbers in ascending order: {_fmt(nums)}. "
                  f"Answer with the sorted list, separated by commas.{_STYLE_SUFFIX[self.style]}")
        return _fmt(nums), Example(prompt=prompt, answer=_fmt(sorted(nums)), data=tuple(nums))

    def examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        return draw_examples(self._make, split=split, count=count, seed=seed)

    def verify(self, example: Example, response: str) -> Verdict:
        return _last_list_verdict(sorted(example.data), integer_lists(response), what="numbers")


@register("even_length")
@dataclasses.dataclass(frozen=True)
class EvenLength:
    """Reply with a word of even length. Reward 1 iff the stripped response has an even number of
    characters.

    Not a test of language: the task a *random* model solves about half the time, so the ``tiny``
    configs' groups have mixed rewards, non-zero advantages and a non-zero gradient (their
    end-to-end and resume tests would prove nothing on a task every row fails). Items differ by a
    topic noun and a number, so the train and test splits are large and disjoint.
    """
    style: str = "direct"
    name: str = "even_length"

    def __post_init__(self):
        check_choice("style", self.style, STYLES)

    def _make(self, rng: random.Random):
        noun, number = rng.choice(NOUNS), rng.randint(0, 10 ** 6)
        prompt = (f"Reply with one word that has an even number of letters (topic: {noun}, "
                  f"item {number}).{_STYLE_SUFFIX[self.style]}")
        return f"{noun}:{number}", Example(prompt=prompt, answer="even", data=(noun, number))

    def examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        return draw_examples(self._make, split=split, count=count, seed=seed)

    def verify(self, example: Example, response: str) -> Verdict:
        n = len(response.strip())
        if n % 2 == 0:
            return Verdict(1.0, "verified correct", str(n))
        return Verdict(0.0, f"expected an even number of characters, got {n}", str(n))
