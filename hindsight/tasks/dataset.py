"""File-backed tasks: problems read from a JSONL or Parquet file and checked as math answers,
multiple-choice letters or programs.

One record is one problem. Its fields are found by name, with fallbacks (a question is the first
of ``question``, ``problem``, ``prompt`` that the record has, unless ``question_field`` names it),
and every field is kept in the example's ``data`` as ``(field, value)`` pairs sorted by name
(lists become tuples), read back with :meth:`hindsight.tasks.base.Example.field`. A null field
counts as absent (a Parquet row holds every column of the file, None where it has no value).

The file is read and checked once per task and file version (its modification time and size): a
bad record is an error naming the file, the line (JSONL) or record number (Parquet, from 1) and
the field.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re

from hindsight._records import read_records
from hindsight._validation import check_choice
from hindsight.tasks.base import SPLITS, Example, Verdict, register, seeded_subset
from hindsight.tasks.code import verify_program
from hindsight.tasks.math import branch_mask_before_answer, verify_choice, verify_math
from hindsight.tasks.sandbox import Limits

KINDS = ("math", "mcq", "code")
SUFFIXES = (".jsonl", ".parquet")
QUESTION_FIELDS = ("question", "problem", "prompt")
ANSWER_FIELDS = {"math": ("answer", "solution"), "mcq": ("answer", "solution"),
                 "code": ("answer", "solution", "canonical_solution")}
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
TEMPLATES = {
    "math": "{question}\n\nPut the final answer in \\boxed{}.",
    "mcq": "{question}\n\n{choices}\n\nEnd your reply with \"Answer: X\", where X is the letter of "
           "the correct option.",
    "code": "{question}\n\nReply with the complete Python code in a single ```python code block.",
}
"""The default user message per kind; ``{question}`` and (mcq) ``{choices}``, one ``A) text`` line
per choice, stand for the record's."""
_PLACEHOLDER = re.compile(r"\{(question|choices)\}")

_SPLITS_CACHE: dict[tuple, dict[str, list[Example]]] = {}
"""Examples per (task, file modification time, file size): tasks are frozen, and equal tasks
share an entry."""


def _pick(record: dict, names: tuple[str, ...], where: str, what: str) -> tuple[str, object]:
    """The first of ``names`` that ``record`` has, and its value."""
    for name in names:
        if name in record:
            return name, record[name]
    tried = ", ".join(repr(n) for n in names)
    raise ValueError(f"{where}: no {what} field (tried {tried})")


def _type_error(where: str, field: str, wanted: str, value) -> ValueError:
    return ValueError(f"{where}: field {field!r} must be {wanted}, got {type(value).__name__} "
                      f"{value!r:.60}")


def _frozen(value):
    """``value`` with lists as tuples and objects as ``(key, value)`` tuples (hashable data)."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _frozen(v)) for k, v in value.items())
    return value


def _letter(answer, choices: list[str], where: str, field: str) -> str:
    """A multiple-choice answer as a letter: given as a letter (any case, ``(B)`` too), a 0-based
    int index, or the text of a choice; a letter is read as a letter first."""
    n = len(choices)
    if isinstance(answer, int) and not isinstance(answer, bool):
        if 0 <= answer < n:
            return LETTERS[answer]
    elif isinstance(answer, str):
        letter = answer.strip().strip("()").upper()
        if len(letter) == 1 and letter in LETTERS[:n]:
            return letter
        texts = [c.strip() for c in choices]
        if answer.strip() in texts:
            return LETTERS[texts.index(answer.strip())]
    raise ValueError(f"{where}: field {field!r} = {answer!r:.60} matches no choice: give a letter "
                     f"A-{LETTERS[n - 1]}, an index in [0, {n}) or the text of a choice")


def _in_test(question: str, fraction: float) -> bool:
    """A sha256 of the question read as a number in [0, 1) is below ``fraction``: stable whatever
    the file order, and duplicate questions share a split."""
    return int(hashlib.sha256(question.encode("utf-8")).hexdigest(), 16) / 2 ** 256 < fraction


@register("dataset")
@dataclasses.dataclass(frozen=True, kw_only=True)
class DatasetTask:
    """Problems of a ``.jsonl`` or ``.parquet`` file at ``path``, checked per ``kind``:

    * ``"math"``: :func:`~hindsight.tasks.math.verify_math` against the answer (a string or a
      number; a worked solution holding ``\\boxed{}`` is its last boxed answer). With
      ``percent_field``, that boolean field of a record (absent: false) says that its answer is a
      percentage.
    * ``"mcq"``: :func:`~hindsight.tasks.math.verify_choice`; ``choices_field`` holds the list of
      choices (2-26 strings, shown lettered A, B, C...) and the answer is a letter, a 0-based
      index or the text of a choice (normalised to the letter: the example's ``answer``).
    * ``"code"``: :func:`~hindsight.tasks.code.verify_program` runs the response's program and
      then the record's ``test_field`` (required) in the sandbox, calling ``check`` on the
      ``entry_point_field`` function when the record has one; ``cpu_seconds``, ``wall_seconds``
      and ``memory_bytes`` are the sandbox's limits for one response. The question (a function
      signature and docstring, or a statement) is the ``prompt`` given to it.

    Fields: the question is ``question_field``, else the first of :data:`QUESTION_FIELDS` that a
    record has; the answer ``answer_field``, else the first of :data:`ANSWER_FIELDS` for the kind.
    Splits: with ``split_field``, each record's value of it ("train" or "test"); otherwise a
    record is in ``test`` when a sha256 of its question, read as a number in [0, 1), is below
    ``test_fraction``. ``template``: the user message, ``{question}`` (and, mcq, ``{choices}``)
    standing for the record's (default: :data:`TEMPLATES`)."""
    path: str = ""
    kind: str = "math"
    question_field: str | None = None
    answer_field: str | None = None
    choices_field: str = "choices"
    test_field: str = "test"
    entry_point_field: str = "entry_point"
    percent_field: str | None = None
    split_field: str | None = None
    test_fraction: float = 0.1
    template: str | None = None
    cpu_seconds: int = 5
    wall_seconds: float = 10.0
    memory_bytes: int = 1 << 30
    name: str = "dataset"

    def __post_init__(self):
        if not isinstance(self.path, str) or not self.path.endswith(SUFFIXES):
            raise ValueError(f"`task.options.path` must name a {' or '.join(SUFFIXES)} file, got "
                             f"{self.path!r}")
        if not os.path.isfile(self.path):
            raise ValueError(f"`task.options.path`: no such file {self.path!r}")
        check_choice("task.options.kind", self.kind, KINDS)
        for option in ("question_field", "answer_field", "choices_field", "test_field",
                       "entry_point_field", "percent_field", "split_field"):
            value = getattr(self, option)
            optional = option in ("question_field", "answer_field", "percent_field", "split_field")
            if not (isinstance(value, str) and value) and not (optional and value is None):
                raise ValueError(f"`task.options.{option}` must be a field name"
                                 f"{' or None' if optional else ''}, got {value!r}")
        if (isinstance(self.test_fraction, bool) or not isinstance(self.test_fraction, (int, float))
                or not 0 <= self.test_fraction < 1):
            raise ValueError(f"`task.options.test_fraction` must be a number in [0, 1), got "
                             f"{self.test_fraction!r}")
        needed = ("{question}", "{choices}") if self.kind == "mcq" else ("{question}",)
        if self.template is not None and not (isinstance(self.template, str)
                                              and all(p in self.template for p in needed)):
            raise ValueError(f"`task.options.template` must be a str holding "
                             f"{' and '.join(needed)}, got {self.template!r}")
        if self.kind == "code":
            self._limits()   # validates cpu_seconds, wall_seconds, memory_bytes

    def _limits(self) -> Limits:
        return Limits(cpu_seconds=self.cpu_seconds, wall_seconds=self.wall_seconds,
                      memory_bytes=self.memory_bytes)

    def _question_fields(self) -> tuple[str, ...]:
        return (self.question_field,) if self.question_field else QUESTION_FIELDS

    def _example(self, where: str, record) -> tuple[str, Example]:
        """A record's split and example; ValueError naming ``where`` and the field if it is bad."""
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
        # A null field is an absent one: Parquet gives every row every column, None where the
        # row has no value.
        record = {field: value for field, value in record.items() if value is not None}
        qname, question = _pick(record, self._question_fields(), where, "question")
        if not isinstance(question, str) or not question.strip():
            raise _type_error(where, qname, "a non-empty string", question)
        aname, answer = _pick(record, (self.answer_field,) if self.answer_field
                              else ANSWER_FIELDS[self.kind], where, "answer")
        fill = {"question": question}
        if self.kind == "math":
            if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
                raise _type_error(where, aname, "a string or a number", answer)
            answer = str(answer)
            if self.percent_field and not isinstance(record.get(self.percent_field, False), bool):
                raise _type_error(where, self.percent_field, "true or false",
                                  record[self.percent_field])
        elif self.kind == "mcq":
            if self.choices_field not in record:
                raise ValueError(f"{where}: no choices field {self.choices_field!r}")
            choices = record[self.choices_field]
            if (not isinstance(choices, list) or not 2 <= len(choices) <= len(LETTERS)
                    or not all(isinstance(c, str) for c in choices)):
                raise _type_error(where, self.choices_field, "a list of 2-26 strings", choices)
            answer = _letter(answer, choices, where, aname)
            fill["choices"] = "\n".join(f"{letter}) {c}" for letter, c in zip(LETTERS, choices))
        else:
            if not isinstance(answer, str):
                raise _type_error(where, aname, "a string", answer)
            if self.test_field not in record:
                raise ValueError(f"{where}: no test field {self.test_field!r} (a code record "
                                 f"needs its tests)")
            test = record[self.test_field]
            if not isinstance(test, str) or not test.strip():
                raise _type_error(where, self.test_field, "a non-empty string", test)
            entry_point = record.get(self.entry_point_field)
            if entry_point is not None and not isinstance(entry_point, str):
                raise _type_error(where, self.entry_point_field, "a string", entry_point)
        if self.split_field:
            split = record.get(self.split_field)
            if split not in SPLITS:
                raise ValueError(f"{where}: field {self.split_field!r} must be 'train' or 'test', "
                                 f"got {split!r:.60}")
        else:
            split = "test" if _in_test(question, self.test_fraction) else "train"
        template = self.template or TEMPLATES[self.kind]
        prompt = _PLACEHOLDER.sub(lambda m: fill[m.group(1)], template)
        data = tuple((field, _frozen(record[field])) for field in sorted(record))
        return split, Example(prompt=prompt, answer=answer, data=data)

    def _splits(self) -> dict[str, list[Example]]:
        stat = os.stat(self.path)
        key = (self, stat.st_mtime_ns, stat.st_size)
        if key not in _SPLITS_CACHE:
            splits = {split: [] for split in SPLITS}
            for where, record in read_records(self.path):
                split, example = self._example(where, record)
                splits[split].append(example)
            _SPLITS_CACHE[key] = splits
        return _SPLITS_CACHE[key]

    def split_examples(self, split: str) -> list[Example]:
        """Every problem of ``split`` in file order; an empty split is an error."""
        check_choice("split", split, SPLITS)
        examples = self._splits()[split]
        if not examples:
            why = (f"no record has {self.split_field!r} = {split!r}" if self.split_field else
                   f"test_fraction={self.test_fraction} puts no record in it")
            raise ValueError(f"{self.path}: the {split} split is empty ({why})")
        return list(examples)

    def examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        return seeded_subset(self.split_examples(split), split=split, count=count, seed=seed,
                             where=f"dataset {self.path}")

    def branch_mask(self, example: Example, pieces) -> list[bool]:
        """HDL's eligible branch positions: before the final answer for math records, every
        token otherwise."""
        return branch_mask_before_answer(pieces) if self.kind == "math" else [True] * len(pieces)

    def verify(self, example: Example, response: str) -> Verdict:
        fields = dict(example.data)
        if self.kind == "math":
            percent = bool(self.percent_field) and fields.get(self.percent_field, False)
            return verify_math(example.answer, response, percent=percent)
        if self.kind == "mcq":
            return verify_choice(example.answer, response,
                                 num_choices=len(fields[self.choices_field]))
        _, question = _pick(fields, self._question_fields(), self.path, "question")
        return verify_program(prompt=question, test=fields[self.test_field],
                              entry_point=fields.get(self.entry_point_field), response=response,
                              limits=self._limits())
