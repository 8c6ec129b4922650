"""Math answers checked by value with math-verify, lettered multiple choice, and :class:`MathWord`
(procedural word problems, fractions and linear equations sized for 135M-0.5B models).

:func:`verify_math` takes the response's answer (the last ``\\boxed{}``, else the text after the
last final-answer marker, else the last expression or number) and compares it with the expected
answer by value: ``1/2``, ``0.5``, ``\\frac{1}{2}`` and ``\\dfrac12`` are one answer, as are
``x = 3`` and ``3``, ``1,000`` and ``1000``, ``\\{1,2\\}`` and ``{2, 1}``; intervals keep their
brackets. math-verify's own timeouts use ``signal.alarm``, which fails outside the main thread,
and verification runs in worker threads (:mod:`hindsight.rollout.verification`), so they are off
and the inputs are bounded instead: the answer handed to the parser is at most
:data:`MAX_ANSWER_CHARS` long, and answers whose value is astronomically large (power towers,
huge exponents or factorials), which sympy would try to evaluate, are not compared.

:func:`verify_choice` reads the chosen letter of a multiple-choice response.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import random
import re
from collections.abc import Sequence
from fractions import Fraction

import sympy
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from hindsight._validation import check_choice
from hindsight.tasks.base import Example, Verdict, draw_examples, register
from hindsight.tasks.synthetic import STYLES

class _DropTimeoutNotice(logging.Filter):
    """math-verify warns once per process that its timeouts are off; they are off on purpose (they
    are signal-based and fail in the verifier's threads) and inputs are bounded here instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutNotice())

MAX_ANSWER_CHARS = 200
"""Longer extracted answers are not compared: comparing grows with the length (a 200-character sum
of fractions and roots with ``1/(x+1)``: up to 0.5 s; 800 characters: 1.4 s)."""
TAIL_CHARS = 4000
"""Without a boxed answer or a marker, the last expression is looked for in this many final
characters of the response."""
MAX_MAGNITUDE = 10_000
"""Answers that may compute numbers of more digits are too large to check: comparing ``2^{10^4}``
takes milliseconds, ``2^{10^7}`` (3 million digits) a quarter second, ``10^{10^{10}}`` forever."""
MAX_RANGE = 10_000
"""Sums and products over more terms are too large to check."""
MAX_EXPANSION = 300
"""Answers whose polynomials expand to more terms are too large to check: sympy expands them to
compare (``(x+1)^{200}``, 201 terms, takes 0.3 s; ``(x+1)^{999}`` 7 s, ``(x+y+z)^{99}``, 5,050
terms, 16 s)."""

_LATEX = (LatexExtractionConfig(),)
_EXPR = (ExprExtractionConfig(),)

# One pass over the braces finds every complete \boxed{...}; escaped braces (\{1, 2\}) are text.
_BRACE_TOKEN = re.compile(r"\\[{}]|\\(?:boxed|fbox)\s*\{|[{}]")
_MARKER = re.compile(r"\bfinal answer\s*(?:is\s*)?:?|\bthe answer is\s*:?|\banswer\s*:", re.I)
_DELIMITED = re.compile(r"\$\$(.+?)\$\$|\$([^$]+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.S)
_NUMBER = re.compile(r"(?<![\w)])-?(?:\\[dt]?frac\s*(?:\{[^{}]*\}|\d)\s*(?:\{[^{}]*\}|\d)"
                     r"|\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:\s*/\s*\d+)?)(?:\s*\\?%)?")
# A word of prose ends an answer written after a marker ("12 apples", "3, because ..."); LaTeX
# commands and these function names do not.
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_MATH_WORDS = frozenset({"sqrt", "pi", "sin", "cos", "tan", "log", "ln", "exp", "inf", "infty",
                         "oo", "percent"})
_PERCENT = re.compile(r"\s*(?:\\%|%|\bpercent(?:age)?\b)")
_TEXT_COMMAND = re.compile(r"\\(?:text|textbf|textrm|mathrm)\s*\{([^{}]*)\}")
_LOG10_2 = math.log10(2)
_LOG10_MAX = math.log10(MAX_MAGNITUDE)
_LOG10_RANGE = math.log10(MAX_RANGE)


def _last_boxed_span(text: str) -> tuple[int, int, int] | None:
    """``(command start, content start, content end)`` of the last complete ``\\boxed{...}``
    (or ``\\fbox``) in ``text``."""
    stack, found = [], None   # stack: (content start, is boxed, token start) per open brace
    for m in _BRACE_TOKEN.finditer(text):
        token = m.group()
        if token in ("\\{", "\\}"):
            continue
        if token == "}":
            if stack:
                start, boxed, command = stack.pop()
                if boxed and (found is None or start > found[1]):
                    found = (command, start, m.start())
        else:
            stack.append((m.end(), token != "{", m.start()))
    return found


def _last_boxed(text: str) -> str | None:
    """The content of the last complete ``\\boxed{...}`` (or ``\\fbox``) in ``text``."""
    found = _last_boxed_span(text)
    return text[found[1]:found[2]].strip() if found else None


def final_answer_start(response: str) -> int | None:
    """Where the final answer of ``response`` begins (the last ``\\boxed`` command, else the last
    final-answer marker), or None: what :func:`extract_math_answer` reads from there on."""
    found = _last_boxed_span(response)
    if found is not None:
        return found[0]
    markers = list(_MARKER.finditer(response))
    return markers[-1].start() if markers else None


def branch_mask_before_answer(pieces: Sequence[str]) -> list[bool]:
    """Per token (its decoded text in ``pieces``), whether it starts before the final answer
    (:func:`final_answer_start`): HDL never branches inside the answer itself, where resampling
    a digit is a guess, not a change of mind (spec §2's ``eligible_mask`` example). Every token
    is eligible when the response has no recognisable final answer."""
    text = "".join(pieces)
    start = final_answer_start(text)
    if start is None:
        return [True] * len(pieces)
    offsets = itertools.accumulate((len(p) for p in pieces[:-1]), initial=0)
    return [o < start for o in offsets] if pieces else []


def _depth_at(text: str, end: int) -> int:
    return text.count("{", 0, end) - text.count("}", 0, end)


def _after_marker(text: str) -> str:
    """The answer written after a final-answer marker: a delimited span, else the text up to a
    word of prose or the end of the line, without trailing punctuation and markdown."""
    text = text.lstrip(" \t*:")
    if not text.strip():
        return ""
    if text.startswith("\n"):   # "Final answer:\n\n42": the next non-empty line
        text = text.strip()
    text = text.split("\n", 1)[0]
    span = _DELIMITED.match(text)
    if span:
        return next(g for g in span.groups() if g is not None).strip()
    for m in _WORD.finditer(text):
        if m.group().lower() not in _MATH_WORDS and not _depth_at(text, m.start()):
            if not text[:m.start()].strip(" \t*:"):   # "the answer is reasonable: ..."
                return ""
            text = text[:m.start()]
            break
    return text.strip().rstrip(".,;:!*").strip().strip("$").strip()


def extract_math_answer(response: str) -> str | None:
    """The answer of a math ``response``: the last ``\\boxed{}``, else what follows the last
    final-answer marker ("final answer:", "the answer is", "answer:", any case), else the last
    LaTeX span or number (fractions, decimals, thousands separators, percentages), or None."""
    boxed = _last_boxed(response)
    if boxed is not None:
        return boxed
    markers = list(_MARKER.finditer(response))
    if markers:
        answer = _after_marker(response[markers[-1].end():])
        if answer:
            return answer
    # The last expression is near the end: scanning the tail (from a line start, so that no $...$
    # span is cut) bounds the regexes' work on long degenerate responses.
    tail = response[-TAIL_CHARS:]
    if len(response) > TAIL_CHARS and "\n" in tail:
        tail = tail[tail.index("\n"):]
    candidates = [*_DELIMITED.finditer(tail), *_NUMBER.finditer(tail)]
    if not candidates:
        return None
    last = max(candidates, key=lambda m: m.end())
    if last.re is _DELIMITED:
        return next(g for g in last.groups() if g is not None).strip()
    return last.group().strip()


def _magnitude(expr) -> float:
    """An upper bound of the number of digits of the numbers that evaluating ``expr`` computes (a
    symbol counts as one digit): ``2^{10}`` about 16, ``10^{10^{10}}`` infinite."""
    if isinstance(expr, sympy.Rational):   # Integer included
        return max(abs(expr.p).bit_length(), expr.q.bit_length()) * _LOG10_2
    if isinstance(expr, sympy.Float):
        _, mantissa, exponent, bits = expr._mpf_
        return abs(exponent + bits) * _LOG10_2 if mantissa else 0.0
    if not isinstance(expr, sympy.Basic):   # an unparsed string, a mutable matrix
        return 0.0
    if not expr.args:
        return 1.0
    if isinstance(expr, sympy.Pow):
        exponent = _magnitude(expr.exp)   # |exponent| < 10 ** its digits
        if exponent > _LOG10_MAX:
            return math.inf
        return max(_magnitude(expr.base), 1.0) * 10 ** exponent
    if isinstance(expr, (sympy.factorial, sympy.factorial2, sympy.binomial)):
        n = _magnitude(expr.args[0])
        return math.inf if n > _LOG10_MAX else 10 ** n * max(n, 1.0)
    if isinstance(expr, (sympy.Sum, sympy.Product)) and any(
            _magnitude(bound) > _LOG10_RANGE for limit in expr.limits for bound in limit[1:]):
        return math.inf
    parts = [_magnitude(arg) for arg in expr.args]
    return sum(parts) if isinstance(expr, sympy.Mul) else max(parts) + 1.0


def _expansion(expr) -> int:
    """How many terms ``expr`` has once its polynomials are expanded (numbers are one term):
    ``(x+1)^{3}`` 4, ``(x+y)(x-y)`` 4, ``(x+1)^{2} / (x-1)`` 3 + 2."""
    if not isinstance(expr, sympy.Basic) or not expr.free_symbols or not expr.args:
        return 1
    if isinstance(expr, sympy.Pow):
        base = _expansion(expr.base)
        if base == 1 or not (expr.exp.is_Integer and expr.exp):
            return base
        return math.comb(abs(int(expr.exp)) + base - 1, base - 1)   # multinomial terms
    if isinstance(expr, sympy.Mul):   # a numerator and a denominator, each expanded
        over = [arg.is_Pow and arg.exp.is_negative for arg in expr.args]
        return (math.prod(_expansion(a) for a, o in zip(expr.args, over) if not o)
                + math.prod(_expansion(a) for a, o in zip(expr.args, over) if o))
    return sum(_expansion(arg) for arg in expr.args)


def too_large(parsed) -> bool:
    """Whether comparing any of the ``parsed`` answers (math-verify's parse, which does not
    evaluate) may compute a number of more than :data:`MAX_MAGNITUDE` digits (power towers such
    as ``10^10^10^10``, huge exponents such as ``2^{10^9}``, factorials and binomials of large
    numbers), sum or multiply more than :data:`MAX_RANGE` terms, or expand a polynomial to more
    than :data:`MAX_EXPANSION` terms (``(x+1)^{999}``)."""
    return any(_magnitude(p) > MAX_MAGNITUDE or _expansion(p) > MAX_EXPANSION for p in parsed)


def _strip_percent(answer: str) -> tuple[str, bool]:
    """``answer`` without its percent signs (``\\%``, ``%``, "percent") and whether it had one."""
    body, n = _PERCENT.subn("", answer)
    return body.strip(), n > 0


@functools.lru_cache(maxsize=4096)
def _parse(answer: str) -> tuple:
    """math-verify's parse of one answer (no percent sign): as LaTeX, else as a plain expression;
    cached (a group's responses repeat answers, and the expected one is parsed every call)."""
    found = parse(f"${answer}$", extraction_config=_LATEX, parsing_timeout=None)
    return tuple(found or parse(answer, extraction_config=_EXPR, parsing_timeout=None))


def _equal(gold: tuple, pred: tuple) -> bool:
    return bool(gold and pred) and verify(list(gold), list(pred), timeout_seconds=None)


def _plain(text: str) -> str:
    return " ".join(_TEXT_COMMAND.sub(r"\1", text).split()).lower()


def _shown(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def verify_math(expected: str, response: str, *, percent: bool = False) -> Verdict:
    """Reward 1 iff the answer of ``response`` (:func:`extract_math_answer`) equals ``expected``
    by value (math-verify). An ``expected`` holding ``\\boxed{}`` (a worked solution) is its last
    boxed answer.

    Percent signs are dropped from both answers unless ``percent``: ``50\\%`` is the answer ``50``
    (how most datasets write a percentage that the question asks for) and not ``0.5``. With
    ``percent`` (the dataset says the expected answer is a percentage: ``50`` or ``50\\%``), the
    response may also write it as a fraction or decimal: ``50\\%``, ``50``, ``0.5`` and
    ``\\frac12`` verify, ``0.5\\%`` does not.

    Feedback: ``verified correct``, ``expected 1/2, got 3/4`` or ``expected 1/2, but no answer
    was found``; ``extracted`` is the response's answer as written."""
    shown_expected = _shown(_last_boxed(expected) or expected.strip())
    gold_text, _ = _strip_percent(shown_expected)
    got = extract_math_answer(response)
    if got is None:
        return Verdict(0.0, f"expected {shown_expected}, but no answer was found")
    body, pred_percent = _strip_percent(got)
    if len(body) > MAX_ANSWER_CHARS and "=" in body:   # a long derivation: its last value
        body = body.rsplit("=", 1)[1].strip()
    gold = _parse(gold_text)
    pred = () if len(body) > MAX_ANSWER_CHARS else _parse(body)
    if len(body) > MAX_ANSWER_CHARS or too_large(pred) or too_large(gold):
        return Verdict(0.0, f"expected {shown_expected}, got {_shown(got)}, which is too long or "
                       f"too large to check", got)
    correct = _equal(gold, pred)
    if not correct and percent and not pred_percent:   # 0.5 for 50%
        scaled = tuple(g * sympy.Rational(1, 100) for g in gold if isinstance(g, sympy.Expr))
        correct = _equal(scaled, pred)
    if not correct:   # text answers: \text{Monday} is Monday, which sympy reads as M*o*n*d*a*y
        correct = _plain(gold_text) == _plain(body)
    if correct:
        return Verdict(1.0, "verified correct", got)
    return Verdict(0.0, f"expected {shown_expected}, got {_shown(got)}", got)


_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
# "the answer is (B)", "Answer: c", "the correct option is **C**"; the letter may be lowercase here,
# and the lowercase word after it (if any) is kept to tell "answer is a bit" from "is B because".
_ANSWER_MARKER = re.compile(
    r"(?:\banswer\b|\b(?:correct|right|best)\s+(?:option|choice)\b)(?:\s+(?:is|would\s+be|will\s+be))?"
    r"\s*[:=]?\s*\**\s*[(\[]?([A-Za-z])(?![A-Za-z'-])[)\]]?(?-i:[ \t]+([a-z]+))?", re.I)
_BOLD_LETTER = re.compile(r"\*\*\s*\(?([A-Z])(?:[).:][^*\n]*)?\s*\*\*")
_OPTION_MENTION = re.compile(r"\b(?:[Oo]ption|[Cc]hoice)\s*[(\[]?([A-Z])(?![\w'-])")
_LINE_LETTER = re.compile(r"\W{0,3}\(?([A-Z])(?:[).:]|\s*$)")
_STRAY_LETTER = re.compile(r"(?<![\w'-])([A-Z])(?![\w'-])(?:[ \t]+([a-z]+))?")
# A letter followed by a lowercase word is prose ("A good way", "I think"), unless the word says
# something about an option ("B is correct").
_ABOUT_OPTION = frozenset({"is", "was", "seems", "looks", "appears", "would", "should", "must",
                           "matches", "fits", "because", "since"})


def extract_choice(response: str, *, num_choices: int) -> str | None:
    """The letter chosen in ``response`` among the first ``num_choices``, from the first of these
    that holds one: the last ``\\boxed{}``; the last answer marker ("the answer is (B)", "Answer:
    c", "the correct option is C"); the last bold letter (``**B**``, ``**B) text**``); a last line
    that is a letter or starts with one and a delimiter ("C", "(C)", "C) text"); the last "option
    C" / "choice C"; the last capital letter standing alone. A letter followed by a lowercase
    word is prose ("A good way", "answer is a bit"), unless the word is about an option ("B is
    correct"); letters beyond ``num_choices`` are no answer."""
    valid = _LETTERS[:num_choices]

    def answer(letter: str | None, next_word: str | None = None) -> str | None:
        if letter is None or letter.upper() not in valid:
            return None
        return letter.upper() if next_word is None or next_word in _ABOUT_OPTION else None

    boxed = _last_boxed(response)
    if boxed is not None:
        m = re.fullmatch(r"\W*(?:\\text(?:bf)?\s*\{\s*)?\(?([A-Za-z])\)?\W*", boxed)
        if m and answer(m.group(1)):
            return answer(m.group(1))
    for m in reversed(list(_ANSWER_MARKER.finditer(response))):
        if answer(*m.groups()):
            return answer(*m.groups())
    bold = [m.group(1) for m in _BOLD_LETTER.finditer(response) if answer(m.group(1))]
    if bold:
        return bold[-1]
    lines = [line.strip() for line in response.splitlines() if line.strip()]
    m = _LINE_LETTER.match(lines[-1]) if lines else None
    if m and answer(m.group(1)):
        return m.group(1)
    mentioned = [m.group(1) for m in _OPTION_MENTION.finditer(response) if answer(m.group(1))]
    if mentioned:
        return mentioned[-1]
    for m in reversed(list(_STRAY_LETTER.finditer(response))):
        if answer(*m.groups()):
            return m.group(1)
    return None


def verify_choice(expected: str, response: str, *, num_choices: int) -> Verdict:
    """Reward 1 iff the letter of ``response`` (:func:`extract_choice`) is ``expected`` (a letter,
    any case, among the first ``num_choices``). Feedback: ``verified correct``, ``expected B, got
    C`` or ``expected B, but no answer letter was found``."""
    if isinstance(num_choices, bool) or not isinstance(num_choices, int) or not 2 <= num_choices <= 26:
        raise ValueError(f"`num_choices` must be an int in [2, 26], got {num_choices!r}")
    want = expected.strip().upper()
    if len(want) != 1 or want not in _LETTERS[:num_choices]:
        raise ValueError(f"`expected` must be one of the letters {_LETTERS[:num_choices]}, got "
                         f"{expected!r}")
    got = extract_choice(response, num_choices=num_choices)
    if got is None:
        return Verdict(0.0, f"expected {want}, but no answer letter was found")
    if got == want:
        return Verdict(1.0, "verified correct", got)
    return Verdict(0.0, f"expected {want}, got {got}", got)


KINDS = ("word", "fraction", "linear")
_MATH_STYLE_SUFFIX = {
    "direct": " Write the final answer in \\boxed{}.",
    "reasoning": " Think step by step, then write the final answer in \\boxed{}.",
    "explain": " Explain your reasoning step by step, then write the final answer in \\boxed{}.",
}
NAMES = ("Ana", "Ben", "Carla", "Dev", "Emma", "Farid", "Grace", "Hugo", "Ivy", "Jon", "Kemal", "Lena")
THINGS = ("apples", "pencils", "stickers", "cookies", "marbles", "books", "cards", "shells")


def _word_problem(rng: random.Random) -> tuple[str, str, int]:
    """A two-to-three step word problem with small integers: ``(numbers key, question, answer)``.
    The key leaves out the names and objects, so problems differing only in them share a split."""
    name, other = rng.sample(NAMES, 2)
    thing = rng.choice(THINGS)
    template = rng.randrange(6)
    if template == 0:   # shopping: cost, then change
        n, price = rng.randint(2, 6), rng.randint(2, 9)
        bill = next(b for b in (10, 20, 50, 100) if b > n * price)
        return (f"0:{n}:{price}",
                f"{name} buys {n} {thing} at {price} dollars each and pays with a {bill}-dollar "
                f"bill. How many dollars of change does {name} get?", bill - n * price)
    if template == 1:   # rate over two periods
        rate, h1, h2 = rng.randint(2, 12), rng.randint(1, 6), rng.randint(1, 6)
        return (f"1:{rate}:{h1}:{h2}",
                f"A machine makes {rate} {thing} per hour. It works {h1} hours in the morning and "
                f"{h2} hours in the afternoon. How many {thing} does it make in all?",
                rate * (h1 + h2))
    if template == 2:   # ages, future
        age, older, years = rng.randint(3, 15), rng.randint(1, 9), rng.randint(1, 9)
        return (f"2:{age}:{older}:{years}",
                f"{name} is {age} years old. {other} is {older} years older than {name}. How old "
                f"will {other} be in {years} years?", age + older + years)
    if template == 3:   # ages, sum
        age, older = rng.randint(3, 15), rng.randint(1, 9)
        return (f"3:{age}:{older}",
                f"{name} is {age} years old. {other} is {older} years older than {name}. What is "
                f"the sum of their ages?", 2 * age + older)
    if template == 4:   # give away, then share equally
        boxes, each, given = rng.randint(2, 6), rng.randint(2, 9), rng.randint(1, 9)
        return (f"4:{boxes}:{each}:{given}",
                f"{name} has {boxes * each + given} {thing}. {name} gives {given} to {other} and "
                f"shares the rest equally among {boxes} boxes. How many {thing} go in each box?",
                each)
    # template 5: saving, then spending
    weekly, weeks = rng.randint(2, 12), rng.randint(2, 8)
    spent = rng.randint(1, weekly * weeks - 1)
    return (f"5:{weekly}:{weeks}:{spent}",
            f"{name} saves {weekly} dollars a week for {weeks} weeks, then spends {spent} dollars. "
            f"How many dollars does {name} have left?", weekly * weeks - spent)


def _fraction_problem(rng: random.Random) -> tuple[str, str, Fraction]:
    """The sum or product of two proper fractions with denominators 2-9."""
    b, d = rng.randint(2, 9), rng.randint(2, 9)
    a, c = rng.randint(1, b - 1), rng.randint(1, d - 1)
    op = rng.choice(("plus", "times"))
    value = Fraction(a, b) + Fraction(c, d) if op == "plus" else Fraction(a, b) * Fraction(c, d)
    return (f"{a}/{b}{op}{c}/{d}",
            f"What is {a}/{b} {op} {c}/{d}? Give the answer as a fraction in lowest terms.", value)


_NONZERO_20 = (*range(-20, 0), *range(1, 21))
_NONZERO_9 = (*range(-9, 0), *range(1, 10))


def _signed(n: int) -> str:
    return f"+ {n}" if n >= 0 else f"- {-n}"


def _linear_problem(rng: random.Random) -> tuple[str, str, int]:
    """``ax + b = c`` or ``a(x + b) = c`` with an integer solution in [-10, 10]."""
    x = rng.randint(-10, 10)
    if rng.random() < 0.5:
        a, b = rng.randint(2, 9), rng.choice(_NONZERO_20)
        equation = f"{a}x {_signed(b)} = {a * x + b}"
    else:
        a, b = rng.randint(2, 6), rng.choice(_NONZERO_9)
        equation = f"{a}(x {_signed(b)}) = {a * (x + b)}"
    return equation, f"Solve for x: {equation}.", x


_PROBLEMS = {"word": _word_problem, "fraction": _fraction_problem, "linear": _linear_problem}


@register("math_word")
@dataclasses.dataclass(frozen=True, kw_only=True)
class MathWord:
    """Procedural math for small models: ``word`` problems (two or three steps of shopping, rates,
    ages, sharing and saving with small integers), ``fraction`` (the sum or product of two proper
    fractions, answered as a reduced fraction) and ``linear`` (solve ``3x + 5 = 20`` or
    ``4(x - 2) = 12`` for an integer x in [-10, 10]). Answers are exact (:class:`fractions.Fraction`)
    and checked by value with :func:`verify_math` (so ``2/4`` passes for ``1/2``: the verifier does
    not grade the form).

    ``kinds``: a subset of :data:`KINDS`, as a tuple or a comma-separated string; each example's
    kind is drawn uniformly among them. ``style``: as the synthetic tasks', every style asking for
    the final answer in ``\\boxed{}``. An item is in ``test`` when a stable hash of its kind and
    numbers is 0 mod 5 (as the synthetic tasks), so the splits are disjoint whatever the seeds."""
    kinds: tuple[str, ...] | str = KINDS
    style: str = "direct"
    name: str = "math_word"

    def __post_init__(self):
        kinds = self.kinds.split(",") if isinstance(self.kinds, str) else self.kinds
        if isinstance(kinds, (tuple, list)) and all(isinstance(k, str) for k in kinds):
            kinds = tuple(k.strip() for k in kinds)
        if (not isinstance(kinds, tuple) or not kinds or len(set(kinds)) != len(kinds)
                or set(kinds) - set(KINDS)):
            raise ValueError(f"`kinds` must be distinct names among {KINDS} (a tuple or a "
                             f"comma-separated string), got {self.kinds!r}")
        object.__setattr__(self, "kinds", kinds)   # canonical form: equal tasks compare equal
        check_choice("style", self.style, STYLES)

    def _make(self, rng: random.Random):
        kind = rng.choice(self.kinds)
        key, question, answer = _PROBLEMS[kind](rng)
        example = Example(prompt=question + _MATH_STYLE_SUFFIX[self.style], answer=str(answer),
                          data=(("kind", kind),))
        return f"{kind}:{key}", example

    def examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        return draw_examples(self._make, split=split, count=count, seed=seed)

    def verify(self, example: Example, response: str) -> Verdict:
        return verify_math(example.answer, response)

    def branch_mask(self, example: Example, pieces: Sequence[str]) -> list[bool]:
        """HDL's eligible branch positions: the tokens before the final answer."""
        return branch_mask_before_answer(pieces)
