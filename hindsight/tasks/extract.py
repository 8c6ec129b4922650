"""Answer extraction: tolerant to format (case, punctuation, separators, surrounding prose),
strict on content (the extracted items must equal the expected ones exactly)."""
from __future__ import annotations

import re

_INT = re.compile(r"-?\d+")
_WORD = re.compile(r"[A-Za-z]+")
MAX_DIGITS = 1000
"""Longer digit runs are not read as numbers: no answer has them, and Python refuses to convert
strings of more than 4,300 digits (``sys.get_int_max_str_digits``)."""


def _integers(text: str) -> list[int]:
    return [int(x) for x in _INT.findall(text) if len(x.lstrip("-")) <= MAX_DIGITS]


def last_integer(text: str) -> int | None:
    """The last integer written in ``text`` (``"12 + 35 = 47."`` -> 47), or None."""
    found = _integers(text.replace(",", ""))
    return found[-1] if found else None


def integer_lists(text: str) -> list[list[int]]:
    """Every line's integers, for lines holding at least two of them (candidate answer lists)."""
    out = []
    for line in text.splitlines():
        nums = _integers(line)
        if len(nums) >= 2:
            out.append(nums)
    return out


def word_lists(text: str, vocabulary: set[str]) -> list[list[str]]:
    """Per line, the lowercase words of ``text`` that belong to ``vocabulary``, in order."""
    out = []
    for line in text.splitlines():
        words = [w.lower() for w in _WORD.findall(line) if w.lower() in vocabulary]
        if words:
            out.append(words)
    return out
