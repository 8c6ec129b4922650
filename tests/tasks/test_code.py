"""Code tasks: extracting the program from a response, one-line feedback from the sandboxed run,
HumanEval's problems, splits and reference solutions."""
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from hindsight.tasks import HumanEval, Limits, get_task, verify_program
from hindsight.tasks.code import extract_code

PROMPT = ('from typing import List\n\n\ndef helper(x: int) -> int:\n    return x * 2\n\n\n'
          'def double_all(xs: List[int]) -> List[int]:\n    """Double every item."""\n')
TEST = ("def check(candidate):\n    assert candidate([]) == []\n"
        "    assert candidate([1, 2]) == [2, 4]\n")
QUICK = Limits(cpu_seconds=1, wall_seconds=10)  # wall room for a busy machine (the CPU limit acts first)


def verify(response, *, test=TEST, limits=QUICK):
    return verify_program(prompt=PROMPT, test=test, entry_point="double_all", response=response,
                          limits=limits)


def test_extract_fenced_function_gets_the_prompts_imports_and_helpers():
    response = ("Here you go:\n```python\ndef double_all(xs):\n    return [helper(x) for x in xs]\n"
                "```\nIt doubles.")
    program = extract_code(response, prompt=PROMPT)   # entry point: the prompt's last def
    assert program.startswith("from typing import List") and "def helper" in program
    assert program.endswith("def double_all(xs):\n    return [helper(x) for x in xs]\n")
    assert verify(response).reward == 1.0


def test_extract_bare_completion():
    body = "    return [2 * x for x in xs]\n"
    assert extract_code(body, prompt=PROMPT, entry_point="double_all") == PROMPT + body
    assert verify(body).reward == 1.0


def test_extract_picks_the_block_defining_the_entry_point():
    response = ("```python\ndef double_all(xs):\n    return xs\n```\nbetter:\n"
                "```python\ndef double_all(xs):\n    return [x + x for x in xs]\n```\n"
                "Usage:\n```python\nprint(double_all([1]))\n```\n```bash\npython x.py\n```")
    program = extract_code(response, prompt=PROMPT, entry_point="double_all")
    assert "x + x" in program and "print(" not in program and "python x.py" not in program
    assert verify(response).reward == 1.0


def test_extract_body_in_a_fence_and_unterminated_fence():
    body_only = "```\n    return [x * 2 for x in xs]\n```"   # an indented body: a completion
    assert verify(body_only).reward == 1.0
    in_a_list = "1. Code:\n   ```python\n   def double_all(xs):\n       return [2 * x for x in xs]\n   ```"
    assert verify(in_a_list).reward == 1.0
    cut = "```python\ndef double_all(xs):\n    return [x * 2 for x in xs]\n"   # cut at the cap
    assert verify(cut).reward == 1.0
    longest = "```python\n# note\n```\n```python\nx = 1\ny = 2\n```"
    assert extract_code(longest, prompt=PROMPT).endswith("x = 1\ny = 2\n")


def test_extract_no_code():
    verdict = verify("I am not sure how to do that.")
    assert verdict.reward == 0.0 and verdict.feedback.startswith("SyntaxError")
    assert verify("").feedback == "assertion failed (tests.py line 2): assert candidate([]) == []; " \
                                  "expected [], got None"
    assert extract_code("x = 1", prompt="Write a function.") == "x = 1"   # a prompt in words


def test_feedback_failing_assert_shows_expected_and_actual():
    verdict = verify("    return [x for x in xs]\n")
    assert verdict.reward == 0.0
    assert verdict.feedback == ("assertion failed (tests.py line 3): assert candidate([1, 2]) == "
                                "[2, 4]; expected [2, 4], got [1, 2]")
    loop_test = "def check(candidate):\n    for n in range(3):\n        assert candidate([n]) == [2 * n]\n"
    assert verify("    return [1]\n", test=loop_test).feedback.endswith("expected [0], got [1]")
    close = "def check(candidate):\n    assert abs(candidate([1])[0] - 2) < 1e-6, 'off'\n"
    assert verify("    return [3]\n", test=close).feedback.endswith("double_all(...) returned [3]")
    top_level = "assert double_all([5]) == [10]\n"   # MBPP style: no check()
    assert verify("    return []\n", test=top_level).feedback.endswith("expected [10], got []")
    message = "def check(candidate):\n    assert candidate([1]) == [2], 'first: ' + str(candidate([1]))\n"
    assert verify("    return [0]\n", test=message).feedback == (
        "assertion failed (tests.py line 2): assert candidate([1]) == [2]; expected [2], got [0]")
    slow_again = ("    import time\n    double_all.calls = getattr(double_all, 'calls', 0) + 1\n"
                  "    if double_all.calls > 1:\n        time.sleep(60)\n"
                  "    return [0] * len(xs)\n")   # the second call, for the values, hangs
    verdict = verify(slow_again, test="def check(candidate):\n    assert candidate([7]) == [14]\n",
                     limits=Limits(wall_seconds=1))
    assert verdict.feedback == "assertion failed (tests.py line 2): assert candidate([7]) == [14]"
    hangs = "def check(c):\n    x = c([7])\n    assert x == [14]\n"
    assert verify("    return [1]\n", test=hangs).feedback == \
        "assertion failed (tests.py line 3): assert x == [14]"


def test_feedback_exceptions_and_limits():
    assert verify("    return xs[10]\n").feedback == ("IndexError: list index out of range "
                                                      "(solution.py line 10)")
    assert verify("    while True:\n        pass\n").feedback == "CPU time limit of 1 s exceeded"
    slow = verify("    import time\n    time.sleep(60)\n", limits=Limits(wall_seconds=1))
    assert slow.feedback == "timed out after 1 s"
    memory = verify("    x = []\n    while True:\n        x.append(bytearray(10 ** 7))\n",
                    limits=Limits(memory_bytes=256 << 20))
    assert memory.feedback.startswith("MemoryError") and "memory limit 256 MiB" in memory.feedback
    assert verify("    import os\n    os._exit(0)\n").feedback == \
        "the program exited before the tests finished"
    assert verify("    exit(0)\n").feedback == "the program called exit(0) before the tests finished"
    assert verify("    print('x' * 10 ** 6)\n    return [2 * x for x in xs]\n").reward == 1.0
    long = verify(f"    raise ValueError('{'v' * 1000}')\n").feedback
    assert len(long) <= 300 and long.startswith("ValueError: vvv")


def test_undefined_entry_point():
    verdict = verify("```python\ndef something_else(xs):\n    return xs\n```")
    assert verdict.reward == 0.0
    # The prompt's signature is completed by the block (a completion): the docstring-only
    # function returns None.
    assert "got None" in verdict.feedback
    bare = verify_program(prompt="Write double_all.", test=TEST, entry_point="double_all",
                          response="def other(xs):\n    return xs\n", limits=QUICK)
    assert bare.feedback == "the code does not define `double_all`"


def test_feedback_never_shows_the_parent_environment(monkeypatch):
    canary = f"canary-{uuid.uuid4().hex}"
    monkeypatch.setenv("HINDSIGHT_CODE_CANARY", canary)
    leak = ("    import os\n    print(dict(os.environ))\n    seen = [str(dict(os.environ))]\n"
            "    for pid in os.listdir('/proc'):\n        try:\n"
            "            seen.append(open(f'/proc/{pid}/environ').read())\n"
            "        except OSError as e:\n            seen.append(str(e))\n"
            "    raise RuntimeError(' '.join(seen))\n")
    verdict = verify(leak)
    assert verdict.reward == 0.0 and verdict.feedback.startswith("RuntimeError")
    assert canary not in verdict.feedback and canary not in (verdict.extracted or "")
    assert "HINDSIGHT_CODE_CANARY" not in verdict.feedback


def test_printed_pass_line_does_not_pass():
    forged = "    print('pass')\n    print('\\n' + 'pass')\n    import os\n    os._exit(0)\n"
    assert verify(forged).reward == 0.0


def test_humaneval_problems_and_splits():
    task = get_task("humaneval")
    test = task.split_examples("test")
    assert len(test) == 164 and test[0].field("task_id") == "HumanEval/0"
    assert [e.field("task_id") for e in test] == [f"HumanEval/{i}" for i in range(164)]
    first = test[0]
    assert "```python\nfrom typing import List" in first.prompt
    assert first.answer.startswith(first.field("prompt")) and first.field("entry_point") == \
        "has_close_elements"
    assert task.examples(split="test", count=5, seed=1) == task.examples(split="test", count=5,
                                                                         seed=1)
    assert task.examples(split="test", count=5, seed=1) != task.examples(split="test", count=5,
                                                                         seed=2)
    with pytest.raises(ValueError, match="train_fraction"):
        task.split_examples("train")
    split = HumanEval(train_fraction=0.8)
    train_ids = [e.field("task_id") for e in split.split_examples("train")]
    test_ids = [e.field("task_id") for e in split.split_examples("test")]
    assert not set(train_ids) & set(test_ids) and len(train_ids) + len(test_ids) == 164
    assert 110 < len(train_ids) < 150
    assert train_ids == [e.field("task_id") for e in HumanEval(train_fraction=0.8)
                         .split_examples("train")]
    smaller = {e.field("task_id") for e in HumanEval(train_fraction=0.5).split_examples("train")}
    assert smaller <= set(train_ids)   # the hash threshold nests the splits
    custom = HumanEval(template="Solve:\n{prompt}")
    assert custom.split_examples("test")[0].prompt == "Solve:\n" + first.field("prompt")


def test_humaneval_bad_options():
    for kwargs, field in [({"train_fraction": 1.0}, "train_fraction"),
                          ({"train_fraction": True}, "train_fraction"),
                          ({"template": "no placeholder"}, "template"),
                          ({"cpu_seconds": 0}, "cpu_seconds"),
                          ({"wall_seconds": 0}, "wall_seconds")]:
        with pytest.raises(ValueError, match=field):
            HumanEval(**kwargs)
    with pytest.raises(TypeError):
        HumanEval(0.5)   # options are keyword-only


RESPONSES = {   # the response to a problem, and the reward it must get
    "reference completion": (lambda e: e.answer[len(e.field("prompt")):], 1.0),
    "reference function in a fence": (lambda e: f"Here it is:\n```python\n{e.answer}```\n", 1.0),
    "empty completion": (lambda e: "", 0.0),
}


@pytest.mark.parametrize("form", RESPONSES)
def test_humaneval_every_problem(form):
    """All 164 canonical solutions pass, as bare completions and as full functions in a fenced
    block; the empty completion fails every problem. 164 sandboxed runs, 4 at a time."""
    task = get_task("humaneval")
    examples = task.split_examples("test")
    respond, reward = RESPONSES[form]
    start = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        verdicts = list(pool.map(lambda e: task.verify(e, respond(e)), examples))
    seconds = time.monotonic() - start
    wrong = [(e.field("task_id"), v.feedback) for e, v in zip(examples, verdicts)
             if v.reward != reward]
    assert not wrong, wrong[:5]
    if reward == 0.0:
        assert all("assertion failed" in v.feedback or "Error" in v.feedback for v in verdicts)
    print(f"{form}: {len(examples)} runs in {seconds:.1f} s on {os.cpu_count()} CPUs")


def test_the_models_own_trials_are_not_run():
    """A correct function followed by the model's own (wrong) self-check, prints and a test line
    cut at the token limit still passes: only definitions are kept (sanitize)."""
    response = ("```python\nimport math\n\nSCALE = 2\n\n@staticmethod\ndef unused():\n    pass\n\n"
                "def double_all(xs):\n    return [SCALE * x for x in xs]\n\n"
                "assert double_all([1]) == [3]  # the model's own wrong check\n"
                "result = double_all([5])\nprint(result)\nif __name__ == '__main__':\n"
                "    print(double_all([2]))\n# Test cases\nprint(double_all([1, 2, 3")
    program = extract_code(response, prompt=PROMPT, entry_point="double_all")
    assert "assert" not in program and "print" not in program and "result" not in program
    assert "SCALE = 2" in program and "@staticmethod" in program and "import math" in program
    assert verify(response).reward == 1.0
    # a completion is sanitized too; a program that never parses is left for its syntax error
    assert verify("    return [2 * x for x in xs]\n\nprint(double_all([1]))\nassert False\n"
                  ).reward == 1.0
    broken = "```python\ndef double_all(xs)\n    return xs\n```"
    assert verify(broken).feedback.startswith("SyntaxError")
