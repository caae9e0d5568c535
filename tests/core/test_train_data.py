"""Training-file validation: every problem reported with its line, CSV columns, the token histogram, the
held-out split and the data hash, on the tiny model's tokenizer."""
import json

import pytest

from core.data.train import DATA_FORMATS, split_held_out, token_histogram, validate_file
from tests.tiny import make_tokenizer


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def write(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def test_every_problem_is_listed_with_its_line(tmp_path, tok):
    good = {"prompt": "Say hi", "response": "Hello!"}
    rows = [good,                                                             # 1 ok
            '{"prompt": "broken"',                                            # 2 bad JSON
            {"prompt": "no reply"},                                           # 3 missing field
            {"prompt": "  ", "response": "x"},                                # 4 empty text
            good,                                                             # 5 duplicate of 1
            {"messages": [{"role": "user", "content": "hi"}]},                # 6 not ending in an assistant turn
            {"instruction": "x", "output": "y"},                              # 7 unknown format
            {"prompt": "word " * 400, "response": "y"},                       # 8 too long
            {"prompt": "ok", "response": ["a", "list"]},                      # 9 wrong type
            [1, 2],                                                           # 10 not an object
            "",                                                               # 11 blank: skipped
            {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]},  # 12 ok
            {"messages": [{"role": "robot", "content": "Q"}, {"role": "assistant", "content": "A"}]},  # 13 role
            {"question": "2+2?", "answer": "2+2=4\n#### 4"}]                  # 14 ok
    report = validate_file(write(tmp_path / "d.jsonl", rows), tok, max_tokens=200)
    by_line = {p.line: p.message for p in report.problems}
    assert sorted(by_line) == [2, 3, 4, 5, 6, 7, 8, 9, 10, 13]
    assert "JSON" in by_line[2] and "'response'" in by_line[3] and "empty" in by_line[4]
    assert by_line[5] == "duplicate of line 1" and "assistant" in by_line[6] and "unknown format" in by_line[7]
    assert by_line[8].startswith("too long") and "limit is 200" in by_line[8]
    assert "should be text" in by_line[9] and "JSON object" in by_line[10] and "robot" in by_line[13]
    assert [r.line for r in report.records] == [1, 12, 14] and not report.ok
    assert report.records[2].gold == "4" and report.records[1].messages == [{"role": "user", "content": "Q"}]
    assert report.format in DATA_FORMATS and len(report.token_lengths) == 3


def test_arrays_deep_nesting_and_huge_files_get_one_clear_problem(tmp_path, tok, monkeypatch):
    import core.data.train as train

    rows = [{"prompt": "Say hi", "response": "Hello!"}, {"prompt": "Bye", "response": "Bye!"}]
    array = tmp_path / "rows.json"
    array.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    report = validate_file(array, tok)
    assert [(p.line, "one JSON array" in p.message) for p in report.problems] == [(1, True)]
    deep = write(tmp_path / "deep.jsonl", [rows[0], "[" * 100_000 + "]" * 100_000, rows[1]])
    report = validate_file(deep, tok)
    assert [(p.line, p.message) for p in report.problems] == [(2, "not valid JSON (nested too deeply)")]
    assert [r.line for r in report.records] == [1, 3]
    monkeypatch.setattr(train, "MAX_FILE_BYTES", 64)
    report = validate_file(deep, tok)
    assert report.records == [] and "read whole, up to" in report.problems[0].message


def test_reasoning_kind_needs_rows_with_a_known_answer(tmp_path, tok):
    rows = [{"question": "Natalia sold 48 clips and 24 more. Total?", "answer": "48+24 = <<48+24=72>>72\n#### 72"},
            {"problem": "1+1?", "solution": "It is $\\boxed{2}$.", "answer": "2"},
            {"question": "3*3?", "thinking": "3*3 = 9", "answer": "9"},
            {"prompt": "hi", "response": "hello"},
            {"question": "no final answer", "answer": "just text"}]
    report = validate_file(write(tmp_path / "r.jsonl", rows), tok, kind="reasoning")
    assert [p.line for p in report.problems] == [4, 5]
    assert [r.gold for r in report.records] == ["72", "2", "9"]
    assert report.records[0].thinking == "48+24 = 72" and report.records[0].response == "The answer is \\boxed{72}."
    skill = validate_file(write(tmp_path / "s.jsonl", rows), tok, kind="skill")
    assert skill.ok and len(skill.records) == 5 and skill.format == "question_answer"


def test_csv_with_named_columns(tmp_path, tok):
    path = tmp_path / "d.csv"
    path.write_text('id,question,reply\n1,What is SQL?,A query language.\n2,"Multi\nline",Yes\n3,,empty\n'
                    '4,What is SQL?,A query language.\n', encoding="utf-8")
    report = validate_file(path, tok, csv_columns=("question", "reply"))
    assert report.format == "csv"
    assert [(p.line, p.message) for p in report.problems] == [(5, "column 'question' is empty"),
                                                              (6, "duplicate of line 2")]
    assert [r.line for r in report.records] == [2, 4] and report.records[1].messages[0]["content"] == "Multi\nline"
    missing = validate_file(path, tok)  # default columns prompt/response are not in the header
    assert [p.line for p in missing.problems] == [1] and "prompt" in missing.problems[0].message


def test_histogram_split_and_hash(tmp_path, tok):
    assert token_histogram([]) == []
    hist = token_histogram([10, 11, 12, 20, 29], bins=2)
    assert hist == [(10, 19, 3), (20, 29, 2)] and sum(c for _, _, c in hist) == 5
    assert token_histogram([7, 7], bins=4) == [(7, 7, 2)]
    rows = [{"prompt": f"q{i}", "response": f"a{i}"} for i in range(20)]
    report = validate_file(write(tmp_path / "d.jsonl", rows), tok)
    train, held = split_held_out(report.records, 0.2, seed=1)
    assert len(held) == 4 and len(train) == 16 and {r.line for r in train}.isdisjoint(r.line for r in held)
    assert split_held_out(report.records, 0.2, seed=1) == (train, held)
    assert split_held_out(report.records[:1], 0.5) == (report.records[:1], [])
    again = validate_file(write(tmp_path / "e.jsonl", rows), tok)
    changed = validate_file(write(tmp_path / "f.jsonl", rows[:-1] + [{"prompt": "q19", "response": "b"}]), tok)
    assert again.data_hash == report.data_hash != changed.data_hash and len(report.data_hash) == 64


def test_evaluation_loaders_name_the_file_and_row_of_a_malformed_row(tmp_path):
    from core.data.datasets import load_items

    good = {"question": "2+2?", "answer": "#### 4"}
    path = write(tmp_path / "eval.jsonl", [good, {"question": 7, "answer": "#### 3"}, [1, 2]])
    with pytest.raises(ValueError, match=r"eval.jsonl row 2: 'question' should be text, not int"):
        load_items(path)
    assert [i.gold for i in load_items(path, 1)] == ["4"]
    with pytest.raises(ValueError, match=r"row 3: each line should be a JSON object, not list"):
        load_items(path, 1, offset=2)
    with pytest.raises(ValueError, match=r"deep.jsonl:2 is not valid JSON \(nested too deeply\)"):
        load_items(write(tmp_path / "deep.jsonl", [good, "[" * 100_000 + "]" * 100_000]))
