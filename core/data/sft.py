"""Reasoning SFT examples from GSM8K / MATH train files: `<think>` step-by-step `</think>` then a boxed answer.

GSM8K's `<<48/2=24>>` calculator notes are stripped and its `#### N` becomes `\\boxed{N}`; MATH solutions keep
their own `\\boxed{}`. Each prompt states a thinking budget (a bucket at least as long as the trace), as the
paper's budget prompts do, so RL-trained adapters can learn to respect it later.
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from core.prompting.prompts import reasoning_prompts, reasoning_system

CALC = re.compile(r"<<[^>]*>>")


@dataclass(frozen=True)
class SftExample:
    question: str
    thinking: str
    answer: str
    """Final answer text shown after </think>, e.g. 'The answer is \\boxed{72}.'"""
    gold: str


def read_jsonl(path: Path, limit: int | None = None) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as err:
                raise ValueError(f"{path}:{lineno} is not valid JSON ({err})") from err
            except RecursionError:
                raise ValueError(f"{path}:{lineno} is not valid JSON (nested too deeply)") from None
            if limit and len(rows) >= limit:
                break
    return rows


def gsm8k_example(row: dict) -> SftExample:
    body, _, final = row["answer"].rpartition("####")
    final = final.strip().replace(",", "")
    thinking = CALC.sub("", body).strip()
    return SftExample(row["question"].strip(), thinking, f"The answer is \\boxed{{{final}}}.", final)


def math_example(row: dict) -> SftExample:
    return SftExample(row["problem"].strip(), row["solution"].strip(), f"The answer is \\boxed{{{row['answer']}}}.",
                      row["answer"])


def trace_example(row: dict) -> SftExample:
    final = str(row["answer"]).strip()
    return SftExample(str(row["question"]).strip(), str(row["thinking"]).strip(), f"The answer is \\boxed{{{final}}}.",
                      final)


def example_from_row(row: dict) -> SftExample:
    """GSM8K rows have `question`/`answer` with '####'; MATH rows have `problem`/`solution`/`answer`; trace rows
    (your own reasoning, e.g. distilled from a stronger model) have `question`, `thinking` and a final `answer`."""
    if "question" in row and "thinking" in row and "answer" in row:
        return trace_example(row)
    if "question" in row and "####" in str(row.get("answer", "")):
        return gsm8k_example(row)
    if "problem" in row and "solution" in row:
        return math_example(row)
    raise ValueError("rows need GSM8K (question, answer with '#### n'), MATH (problem, solution, answer) or trace "
                     "(question, thinking, answer) fields")


def load_examples(paths: list[Path], limit: int, seed: int = 0, max_chars: int = 900) -> list[SftExample]:
    """Up to `limit` examples, shuffled, keeping short traces (conciseness is the point on a 0.5B model)."""
    rows = []
    for p in paths:
        rows += [example_from_row(r) for r in read_jsonl(Path(p))]
    rows = [r for r in rows if len(r.thinking) <= max_chars]
    random.Random(seed).shuffle(rows)
    return rows[:limit]


def budget_for(n_thinking_tokens: int) -> int:
    buckets = reasoning_prompts()["budget_buckets"]
    return next((b for b in buckets if b >= n_thinking_tokens), buckets[-1])


def encode_example(tokenizer, ex: SftExample) -> tuple[list[int], list[int]]:
    """(prompt ids encoded by the base model, ending in '<think>\\n' as at inference; response ids run with
    the adapter: the trace, '</think>' and the answer)."""
    from core.prompting.chat_format import build_prompt_ids

    p = reasoning_prompts()
    enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    think_ids = enc(ex.thinking)
    system = reasoning_system(budget_for(len(think_ids)))
    prompt = build_prompt_ids(tokenizer, ex.question, system=system) + enc(p["think_open"])
    response_text = ex.thinking + p["think_close"] + ex.answer
    response = tokenizer(response_text, add_special_tokens=False)["input_ids"]
    response.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    return prompt, response


def unbox(text: str) -> str:
    """A reply's reasoning with its last `\\boxed{x}` written as plain `x` (a trace's boxed answer comes after
    `</think>`, added by `encode_example`)."""
    from core.reasoning.voting import last_boxed

    boxed = last_boxed(text)
    return (text if boxed is None else text.replace(f"\\boxed{{{boxed}}}", boxed)).strip()


def traces_from_eval(rows: list[dict], questions: dict[int, tuple[str, str]]) -> list[dict]:
    """Trace rows (question, thinking, answer) from the *correct* rows of a `ponder eval --out` file, so a model's
    own right answers become training data (self-distillation / rejection sampling). `questions` maps a row's
    index to (question, gold answer). A base-mode answer's text is its reasoning; its `\\boxed{x}` becomes `x`,
    and one without a boxed answer is left out (cut at the token cap, or stopping before its result: the scorer
    may have found the gold number in it, but the trace would teach stopping mid-way)."""
    from core.reasoning.voting import last_boxed

    traces = []
    for row in rows:
        if not row.get("correct") or row.get("index") not in questions or "text" not in row:
            continue
        question, gold = questions[row["index"]]
        thinking = row.get("thinking") or row["text"]
        boxed = last_boxed(thinking)
        if boxed is None and not row.get("thinking"):
            continue
        traces.append({"question": question, "thinking": unbox(thinking), "answer": gold})
    return traces


def encode_record(tokenizer, rec, kind: str) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) of a `core.data.train.TrainRecord`. Skill: the chat template of the turns
    before the reply (the app's default system prompt when the row has none), then the reply and `<|im_end|>`.
    Reasoning: the reasoning format above (`encode_example`), the record's trace and its boxed answer."""
    from core.prompting.chat_format import build_prompt_ids

    if kind == "reasoning":
        return encode_example(tokenizer, SftExample(rec.question(), rec.thinking or "", rec.response, rec.gold or ""))
    prompt = build_prompt_ids(tokenizer, rec.messages)
    response = tokenizer(rec.response, add_special_tokens=False)["input_ids"]
    response.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    return prompt, response
