"""File-backed tasks: JSONL and Parquet records as math, multiple-choice and code problems."""
import json
import os
from pathlib import Path

import pytest

from hindsight.tasks import DatasetTask, get_task

FIXTURES = Path(__file__).parent / "fixtures"
MATH, MCQ, CODE = (str(FIXTURES / f"{name}.jsonl") for name in ("math", "mcq", "code"))


def _records(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def _write_parquet(path, records):
    """A Parquet file of ``records``: one column per field of any record (None where absent)."""
    import pyarrow
    import pyarrow.parquet

    names = list(dict.fromkeys(name for r in records for name in r))
    pyarrow.parquet.write_table(pyarrow.table({n: [r.get(n) for r in records] for n in names}),
                                str(path))
    return str(path)


def test_jsonl_and_parquet_give_the_same_examples(tmp_path):
    parquet = _write_parquet(tmp_path / "math.parquet", _records(MATH))
    for options in ({}, {"split_field": "split"}, {"test_fraction": 0.5}):
        jsonl_task = DatasetTask(path=MATH, **options)
        parquet_task = DatasetTask(path=parquet, **options)
        for split in ("train", "test"):
            assert jsonl_task.split_examples(split) == parquet_task.split_examples(split)
        assert (jsonl_task.examples(split="train", count=5, seed=3)
                == parquet_task.examples(split="train", count=5, seed=3))


def test_math_records_fields_and_fallbacks():
    task = get_task("dataset", path=MATH, split_field="split")
    train = task.split_examples("train")
    assert [e.field("split") for e in train] == ["train"] * 9   # file order, blank line skipped
    first = train[0]
    assert first.prompt == "What is 2 + 3?\n\nPut the final answer in \\boxed{}."
    assert (first.answer, first.data) == ("5", (("answer", "5"), ("question", "What is 2 + 3?"),
                                                ("split", "train")))
    by_question = {e.prompt.split("\n")[0]: e for e in train}
    solution = by_question["What is 3/4 + 1/8?"]             # "problem" and "solution" fields
    assert solution.field("solution") == solution.answer
    assert task.verify(solution, "3/4 + 1/8 = \\boxed{\\frac{7}{8}}").reward == 1.0
    assert task.verify(solution, "\\boxed{0.875}").reward == 1.0
    assert task.verify(by_question["What is 7 - 10?"], "-3").reward == 1.0   # "prompt" field
    for e in train + task.split_examples("test"):
        assert task.verify(e, f"So we get \\boxed{{{e.answer}}}.").reward == 1.0, e
    assert task.verify(first, "\\boxed{6}").feedback == "expected 5, got 6"


def test_named_fields_numbers_and_template(tmp_path):
    path = _write_jsonl(tmp_path / "named.jsonl", [
        {"q": "What is 6 times 7?", "question": "ignored", "gold": 42},
        {"q": "What is half of 3?", "question": "ignored too", "gold": 1.5}])
    task = DatasetTask(path=path, question_field="q", answer_field="gold", test_fraction=0,
                       template="Q: {question} A (in \\boxed{}):")
    ex = task.split_examples("train")
    assert [e.prompt for e in ex] == ["Q: What is 6 times 7? A (in \\boxed{}):",
                                      "Q: What is half of 3? A (in \\boxed{}):"]
    assert [e.answer for e in ex] == ["42", "1.5"]
    assert task.verify(ex[1], "\\boxed{\\frac{3}{2}}").reward == 1.0
    with pytest.raises(ValueError, match=r"named.jsonl, line 1: no question field \(tried 'text'\)"):
        DatasetTask(path=path, question_field="text").split_examples("train")


def test_percent_field():
    record = next(e for e in DatasetTask(path=MATH, split_field="split").split_examples("train")
                  if e.field("question") == "What percent of 8 is 4?")
    flagged = DatasetTask(path=MATH, split_field="split", percent_field="percent")
    plain = DatasetTask(path=MATH, split_field="split")
    assert flagged.verify(record, "\\boxed{0.5}").reward == 1.0
    assert plain.verify(record, "\\boxed{0.5}").reward == 0.0
    for task in (flagged, plain):
        assert task.verify(record, "\\boxed{50\\%}").reward == 1.0
    other = next(e for e in flagged.split_examples("train") if e.answer == "5")
    assert flagged.verify(other, "\\boxed{0.05}").reward == 0.0   # no percent flag: 5 is 5


def test_split_field_and_test_fraction():
    by_field = DatasetTask(path=MATH, split_field="split")
    assert [e.answer for e in by_field.split_examples("test")] == ["(1, 2]", "1,000", "75\\%"]
    questions = {e.field(next(f for f in ("question", "problem", "prompt") if f in dict(e.data)))
                 for e in by_field.split_examples("train") + by_field.split_examples("test")}
    assert len(questions) == 12
    sizes = []
    for fraction in (0.1, 0.5, 0.9):
        task = DatasetTask(path=MATH, test_fraction=fraction)
        train, test = task.split_examples("train"), task.split_examples("test")
        assert len(train) + len(test) == 12
        assert not {e.prompt for e in train} & {e.prompt for e in test}
        sizes.append(len(test))
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]   # a larger fraction holds out more
    with pytest.raises(ValueError, match=r"math.jsonl: the test split is empty \(test_fraction=0"):
        DatasetTask(path=MATH, test_fraction=0).split_examples("test")
    with pytest.raises(ValueError, match="split"):
        by_field.split_examples("dev")


def test_examples_are_a_seeded_subset():
    task = DatasetTask(path=MATH, split_field="split")
    ex = task.examples(split="train", count=4, seed=0)
    assert ex == task.examples(split="train", count=4, seed=0) and len(set(ex)) == 4
    assert set(ex) <= set(task.split_examples("train"))
    with pytest.raises(ValueError, match="asked for 10 test examples but the split holds 3"):
        task.examples(split="test", count=10, seed=0)


@pytest.mark.parametrize("name, kind, message", [
    ("not_json", "math", r"not_json.jsonl, line 3: not valid JSON"),
    ("not_object", "math", r"not_object.jsonl, line 2: expected a JSON object, got list"),
    ("no_question", "math",
     r"no_question.jsonl, line 1: no question field \(tried 'question', 'problem', 'prompt'\)"),
    ("no_answer", "math", r"no_answer.jsonl, line 2: no answer field \(tried 'answer', 'solution'\)"),
    ("wrong_type", "math",
     r"wrong_type.jsonl, line 2: field 'question' must be a non-empty string, got int"),
    ("mcq_bad_answer", "mcq", r"mcq_bad_answer.jsonl, line 2: field 'answer' = 'E' matches no choice"),
    ("code_no_test", "code", r"code_no_test.jsonl, line 1: no test field 'test'"),
])
def test_bad_records_name_file_line_and_field(name, kind, message):
    task = DatasetTask(path=str(FIXTURES / "bad" / f"{name}.jsonl"), kind=kind)
    with pytest.raises(ValueError, match=message):
        task.split_examples("train")


def test_bad_parquet_record_names_its_number(tmp_path):
    path = _write_parquet(tmp_path / "bad.parquet", [{"question": "What is 1 + 1?", "answer": "2"},
                                                     {"question": "What is 2 + 2?"}])
    with pytest.raises(ValueError, match=r"bad.parquet, record 2: no answer field"):
        DatasetTask(path=path).split_examples("train")


@pytest.mark.parametrize("record, message", [
    ({"question": "Q", "answer": ["1"]}, "field 'answer' must be a string or a number, got list"),
    ({"question": "Q", "answer": "1", "percent": "yes"}, "field 'percent' must be true or false"),
    ({"question": "Q", "answer": "1", "split": "dev"}, "field 'split' must be 'train' or 'test'"),
])
def test_bad_field_values(tmp_path, record, message):
    path = _write_jsonl(tmp_path / "one.jsonl", [record])
    with pytest.raises(ValueError, match=rf"one.jsonl, line 1: {message}"):
        DatasetTask(path=path, percent_field="percent", split_field="split").split_examples("train")


@pytest.mark.parametrize("record, message", [
    ({"question": "Q", "choices": "A or B", "answer": "A"}, "field 'choices' must be a list of 2-26"),
    ({"question": "Q", "choices": ["x"], "answer": "A"}, "field 'choices' must be a list of 2-26"),
    ({"question": "Q", "answer": "A"}, "no choices field 'choices'"),
    ({"question": "Q", "choices": ["x", "y"], "answer": 2}, r"field 'answer' = 2 matches no choice"),
])
def test_bad_mcq_records(tmp_path, record, message):
    path = _write_jsonl(tmp_path / "one.jsonl", [record])
    with pytest.raises(ValueError, match=rf"one.jsonl, line 1: {message}"):
        DatasetTask(path=path, kind="mcq").split_examples("train")


def test_mcq_answers_become_letters():
    task = DatasetTask(path=MCQ, kind="mcq", test_fraction=0)
    ex = task.split_examples("train")
    assert [e.answer for e in ex] == ["B", "B", "C", "C", "B", "B", "C", "A"]
    assert ex[0].prompt == ("Which planet is known as the Red Planet?\n\nA) Venus\nB) Mars\nC) Jupiter\n"
                            "D) Saturn\n\nEnd your reply with \"Answer: X\", where X is the letter of "
                            "the correct option.")
    assert ex[0].field("choices") == ("Venus", "Mars", "Jupiter", "Saturn")
    assert task.verify(ex[0], "Mars is red.\nAnswer: B").reward == 1.0
    assert task.verify(ex[0], "Answer: C").feedback == "expected B, got C"
    assert task.verify(ex[5], "The answer is D").extracted is None   # 3 choices: D is no answer
    assert task.verify(ex[6], "The answer is (E)").feedback == "expected C, got E"


def test_code_records_run_in_the_sandbox():
    task = DatasetTask(path=CODE, kind="code", test_fraction=0, wall_seconds=20.0)
    add, _, _, square = task.split_examples("train")
    assert add.prompt.startswith("def add(a, b):") and add.answer == "    return a + b\n"
    assert add.field("entry_point") == "add"
    v = task.verify(add, "```python\ndef add(a, b):\n    return a + b\n```")
    assert (v.reward, v.feedback) == (1.0, "all tests passed")
    v = task.verify(add, "```python\ndef add(a, b):\n    return a - b\n```")
    assert v.reward == 0.0 and "expected 3, got -1" in v.feedback
    assert task.verify(square, f"```python\n{square.answer}```").reward == 1.0   # top-level asserts
    assert task.verify(square, "```python\ndef square(x):\n    return 2 * x\n```").reward == 0.0


def test_rereads_a_changed_file(tmp_path):
    path = tmp_path / "grow.jsonl"
    _write_jsonl(path, [{"question": "What is 1 + 1?", "answer": "2"}])
    task = DatasetTask(path=str(path), test_fraction=0)
    assert len(task.split_examples("train")) == 1
    _write_jsonl(path, [{"question": "What is 1 + 1?", "answer": "2"},
                        {"question": "What is 2 + 2?", "answer": "4"}])
    os.utime(path, ns=(0, 10 ** 9))   # a new modification time whatever the clock's resolution
    assert len(task.split_examples("train")) == 2


def test_bad_options(tmp_path):
    with pytest.raises(ValueError, match=r"`task.options.path` must name a .jsonl or .parquet file"):
        DatasetTask()
    with pytest.raises(ValueError, match=r"`task.options.path` must name"):
        DatasetTask(path=str(tmp_path / "data.csv"))
    with pytest.raises(ValueError, match=r"`task.options.path`: no such file"):
        DatasetTask(path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="`task.options.kind`"):
        DatasetTask(path=MATH, kind="essay")
    for fraction in (1.0, -0.1, True, "0.1"):
        with pytest.raises(ValueError, match="`task.options.test_fraction`"):
            DatasetTask(path=MATH, test_fraction=fraction)
    with pytest.raises(ValueError,
                       match=r"`task.options.template` must be a str holding \{question\} and \{choices\}"):
        DatasetTask(path=MCQ, kind="mcq", template="{question}")
    with pytest.raises(ValueError, match="`task.options.question_field`"):
        DatasetTask(path=MATH, question_field="")
    with pytest.raises(ValueError, match="wall_seconds"):
        DatasetTask(path=CODE, kind="code", wall_seconds=0)
    with pytest.raises(TypeError):
        DatasetTask(MATH)   # keyword-only
