"""Training files for adapters: read JSONL or CSV, check every row, and turn good rows into TrainRecords.

Every problem is reported with its 1-based line (for CSV, the line the row ends on) so that a person can fix
the file: bad JSON, missing or wrongly typed fields, empty text, a row too long for the token limit, a
duplicate of an earlier line, chat messages that do not end in an assistant turn, a row of no known format.
Reasoning adapters need rows whose final answer is known (GSM8K `#### n`, MATH problem/solution/answer, trace
rows question/thinking/answer); skill adapters accept every format.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from core.data.sft import CALC

DATA_FORMATS = ("messages", "prompt_response", "question_answer", "trace", "csv")
KINDS = ("skill", "reasoning")
MAX_FILE_BYTES = 256 << 20
"""Largest training file read (a chat fine-tune has thousands of rows, a few MB; the check holds the text in memory,
so a multi-GB file picked by mistake is refused instead of filling the app's memory)."""
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class DataProblem:
    line: int
    message: str


@dataclass(frozen=True)
class TrainRecord:
    line: int
    messages: list[dict]
    """Chat turns before the response."""
    response: str
    """The assistant text to learn (for reasoning rows: the final answer sentence)."""
    thinking: str | None
    gold: str | None
    """The checkable final answer, when the row has one."""

    def question(self) -> str:
        return next((m["content"] for m in reversed(self.messages) if m["role"] == "user"), "")


@dataclass
class DataReport:
    path: Path
    format: str
    records: list[TrainRecord]
    problems: list[DataProblem]
    token_lengths: list[int] = field(default_factory=list)
    data_hash: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems and bool(self.records)

    def summary(self, limit: int = 5) -> str:
        """One paragraph for a terminal: how many problems, and the first few with their lines."""
        if self.ok:
            return f"{self.path}: {len(self.records)} records, no problems"
        if not self.problems:
            return f"{self.path}: no training records found"
        shown = "; ".join(f"line {p.line}: {p.message}" for p in self.problems[:limit])
        more = f" (and {len(self.problems) - limit} more)" if len(self.problems) > limit else ""
        return f"{self.path}: {len(self.problems)} problem(s): {shown}{more}"


class RowError(ValueError):
    """A row that cannot become a record; the message says why in plain words."""


def _text(row: dict, key: str) -> str:
    if key not in row:
        raise RowError(f"missing field '{key}'")
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise RowError(f"field '{key}' should be text, not {type(value).__name__}")
    value = str(value).strip()
    if not value:
        raise RowError(f"field '{key}' is empty")
    return value


def boxed(answer: str) -> str:
    return f"The answer is \\boxed{{{answer}}}."


def _messages_record(line: int, row: dict) -> TrainRecord:
    msgs = row["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise RowError("field 'messages' should be a non-empty list of {role, content} turns")
    clean = []
    for i, m in enumerate(msgs, 1):
        if not isinstance(m, dict):
            raise RowError(f"message {i} should be an object with 'role' and 'content'")
        role = m.get("role")
        if role not in ROLES:
            raise RowError(f"message {i} has role {role!r}; use system, user or assistant")
        content = m.get("content")
        if not isinstance(content, str):
            raise RowError(f"message {i} content should be text")
        if not content.strip():
            raise RowError(f"message {i} ({role}) is empty")
        clean.append({"role": role, "content": content})
    if clean[-1]["role"] != "assistant":
        raise RowError("the messages do not end in an assistant turn (the reply to learn)")
    if not any(m["role"] == "user" for m in clean[:-1]):
        raise RowError("the messages have no user turn before the assistant reply")
    return TrainRecord(line, clean[:-1], clean[-1]["content"], None, None)


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def parse_row(line: int, row, kind: str) -> tuple[str, TrainRecord]:
    """(format, record) of one JSON row, or RowError."""
    if not isinstance(row, dict):
        raise RowError(f"each line should be a JSON object, not {type(row).__name__}")
    if "messages" in row:
        if kind == "reasoning":
            raise RowError("reasoning adapters need rows with a known answer (question/answer with '#### n', "
                           "problem/solution/answer, or question/thinking/answer), not chat messages")
        return "messages", _messages_record(line, row)
    if "prompt" in row or "response" in row:
        prompt, response = _text(row, "prompt"), _text(row, "response")
        if kind == "reasoning":
            raise RowError("reasoning adapters need rows with a known answer, not prompt/response")
        return "prompt_response", TrainRecord(line, _user(prompt), response, None, None)
    if "thinking" in row:
        question, thinking, answer = _text(row, "question"), _text(row, "thinking"), _text(row, "answer")
        response = boxed(answer) if kind == "reasoning" else f"{thinking}\n\n{boxed(answer)}"
        return "trace", TrainRecord(line, _user(question), response, thinking, answer)
    if "problem" in row or "solution" in row:
        problem, solution = _text(row, "problem"), _text(row, "solution")
        answer = _text(row, "answer") if kind == "reasoning" or "answer" in row else None
        response = boxed(answer) if kind == "reasoning" else solution
        return "question_answer", TrainRecord(line, _user(problem), response, solution, answer)
    if "question" in row or "answer" in row:
        question, answer = _text(row, "question"), _text(row, "answer")
        body, sep, final = answer.rpartition("####")
        final = final.strip().replace(",", "")
        if kind == "reasoning":
            if not sep or not final or not body.strip():
                raise RowError("the answer needs its reasoning then '#### <final answer>' (GSM8K style)")
            return "question_answer", TrainRecord(line, _user(question), boxed(final), CALC.sub("", body).strip(), final)
        return "question_answer", TrainRecord(line, _user(question), answer, None, final if sep and final else None)
    raise RowError(f"unknown format (fields: {', '.join(sorted(map(str, row))) or 'none'}); use messages, "
                   "prompt/response, question/answer or question/thinking/answer")


def _jsonl_rows(text: str, kind: str, problems: list[DataProblem]):
    if text.lstrip().startswith("["):
        try:
            whole = json.loads(text)
        except (ValueError, RecursionError):
            whole = None
        if isinstance(whole, list):
            problems.append(DataProblem(1, "this is one JSON array; training files are JSONL: one JSON object per "
                                           "line (write each element of the array on its own line)"))
            return
    for lineno, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except ValueError as err:
            problems.append(DataProblem(lineno, f"not valid JSON ({err.args[0].split(':')[0]})"))
            continue
        except RecursionError:
            problems.append(DataProblem(lineno, "not valid JSON (nested too deeply)"))
            continue
        try:
            yield parse_row(lineno, row, kind)
        except RowError as err:
            problems.append(DataProblem(lineno, str(err)))


def _csv_rows(text: str, kind: str, columns: tuple[str, str], problems: list[DataProblem]):
    reader = csv.reader(io.StringIO(text))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        problems.append(DataProblem(1, "the file is empty"))
        return
    except csv.Error as err:
        problems.append(DataProblem(1, f"not valid CSV ({err})"))
        return
    missing = [c for c in columns if c not in header]
    if missing:
        problems.append(DataProblem(1, f"the header has no column '{missing[0]}' (it has: {', '.join(header)})"))
        return
    if kind == "reasoning":
        problems.append(DataProblem(1, "reasoning adapters need JSONL rows with a known answer; CSV is for skills"))
        return
    pi, ri = header.index(columns[0]), header.index(columns[1])
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            problems.append(DataProblem(reader.line_num, f"not valid CSV ({err})"))
            continue
        lineno = reader.line_num
        if not any(c.strip() for c in cells):
            continue
        row = {columns[0]: cells[pi] if pi < len(cells) else "", columns[1]: cells[ri] if ri < len(cells) else ""}
        try:
            yield "csv", TrainRecord(lineno, _user(_text(row, columns[0])), _text(row, columns[1]), None, None)
        except RowError as err:
            problems.append(DataProblem(lineno, str(err).replace("field", "column")))


def record_key(rec: TrainRecord) -> str:
    return json.dumps([rec.messages, rec.response, rec.thinking, rec.gold], sort_keys=True, ensure_ascii=False)


def validate_file(path: Path, tokenizer, *, kind: str = "skill", max_tokens: int = 1024,
                  csv_columns: tuple[str, str] | None = None) -> DataReport:
    """Read and check a whole training file; `records` holds only the rows without problems."""
    from core.data.sft import encode_record

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    path = Path(path)
    problems: list[DataProblem] = []
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        return DataReport(path, "unknown", [], [DataProblem(1, f"the file is {size / 2**20:.0f} MB; training files "
                                                               f"are read whole, up to {MAX_FILE_BYTES >> 20} MB")],
                          [], "")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        return DataReport(path, "unknown", [], [DataProblem(line, "the file is not UTF-8 text")], [], "")
    is_csv = path.suffix.lower() == ".csv" or csv_columns is not None
    rows = (_csv_rows(text, kind, csv_columns or ("prompt", "response"), problems) if is_csv
            else _jsonl_rows(text, kind, problems))
    records, lengths, seen, formats = [], [], {}, {}
    for fmt, rec in rows:
        key = record_key(rec)
        if key in seen:
            problems.append(DataProblem(rec.line, f"duplicate of line {seen[key]}"))
            continue
        seen[key] = rec.line
        prompt, response = encode_record(tokenizer, rec, kind)
        n = len(prompt) + len(response)
        if n > max_tokens:
            problems.append(DataProblem(rec.line, f"too long: {n} tokens (the limit is {max_tokens})"))
            continue
        formats[fmt] = formats.get(fmt, 0) + 1
        records.append(rec)
        lengths.append(n)
    if not records and not problems:
        problems.append(DataProblem(1, "the file holds no rows"))
    problems.sort(key=lambda p: p.line)
    fmt = "csv" if is_csv else (max(formats, key=formats.get) if formats else "unknown")
    return DataReport(path, fmt, records, problems, lengths, data_hash(records))


def data_hash(records: list[TrainRecord]) -> str:
    digest = hashlib.sha256()
    for rec in records:
        digest.update(record_key(rec).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def token_histogram(lengths: list[int], bins: int = 10) -> list[tuple[int, int, int]]:
    """(lo, hi, count) for `bins` equal-width ranges from the shortest to the longest (hi inclusive)."""
    if not lengths:
        return []
    lo, hi = min(lengths), max(lengths)
    width = max(1, -(-(hi - lo + 1) // max(1, bins)))
    edges = list(range(lo, hi + 1, width))
    counts = [0] * len(edges)
    for n in lengths:
        counts[(n - lo) // width] += 1
    return [(start, min(start + width - 1, hi), c) for start, c in zip(edges, counts, strict=True)]


def split_held_out(records: list[TrainRecord], fraction: float, seed: int = 0
                   ) -> tuple[list[TrainRecord], list[TrainRecord]]:
    """(train, held out), each in file order; at least one of each when fraction > 0 and there are two records."""
    if not 0 <= fraction < 1:
        raise ValueError("the held-out fraction must be in [0, 1)")
    n = len(records)
    held_n = 0 if fraction == 0 or n < 2 else min(n - 1, max(1, round(n * fraction)))
    held_idx = set(random.Random(seed).sample(range(n), held_n))
    return ([r for i, r in enumerate(records) if i not in held_idx], [r for i, r in enumerate(records) if i in held_idx])
