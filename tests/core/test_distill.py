"""`ponder train distill`: which sample becomes a trace, the rows SFT reads, resuming, and the CLI on the tiny model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.data.datasets import Item
from core.data.sft import encode_example, example_from_row
from core.training.distill import Sample, pick_trace, right_path, trace_row, usable_right
from tests.conftest import TINY_ID

GSM = [{"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}
       for a, b in ((1, 2), (3, 4), (5, 6))]


def test_the_shortest_right_finished_boxed_sample_within_the_cap_is_kept():
    samples = [Sample("So 3 + 4 = 8, \\boxed{8}", 9, True),                 # wrong
               Sample("3 + 4 = 7. \\boxed{7}", 40, True),                   # right, longest kept candidate
               Sample("3 plus 4 is 7, so \\boxed{7}", 12, True),            # right, shortest: kept
               Sample("3 + 4 = 7 and so on", 5, True),                      # right number but no boxed answer
               Sample("3 + 4 = \\boxed{7}", 3, False),                      # cut at the token cap
               Sample("a long way round ... \\boxed{7}", 300, True)]         # over the length cap
    best, right = pick_trace(samples, "7", max_trace_tokens=240)
    assert best is samples[2] and right == 5
    assert pick_trace(samples[:1], "7", 240) == (None, 0)


def test_every_usable_right_sample_is_kept_once_shortest_first_whatever_its_length():
    samples = [Sample("a long way round ... \\boxed{7}", 300, True),
               Sample("3 + 4 = 7. \\boxed{7}", 40, True),
               Sample("3 + 4 = 7. \\boxed{7}", 40, True),                  # the same text twice: kept once
               Sample("3 + 4 = \\boxed{7}", 3, False),                     # cut at the token cap
               Sample("So 3 + 4 = 8, \\boxed{8}", 9, True)]                # wrong
    usable, right = usable_right(samples, "7")
    assert [s.tokens for s in usable] == [40, 300] and right == 4
    assert right_path(Path("d/x.jsonl")) == Path("d/x.right.jsonl")


def test_a_trace_row_is_read_by_sft_as_thinking_then_the_boxed_gold():
    item = Item("What is 3 + 4?", "7", "gsm8k")
    row = trace_row(item, Sample("3 plus 4 is 7, so \\boxed{7}.", 12, True), {"teacher": "t", "index": 5})
    assert row["thinking"] == "3 plus 4 is 7, so 7." and row["answer"] == "7"
    assert row["provenance"] == {"teacher": "t", "index": 5, "trace_tokens": 12}
    ex = example_from_row(json.loads(json.dumps(row)))
    assert ex.thinking == "3 plus 4 is 7, so 7." and ex.answer == "The answer is \\boxed{7}."


def test_cli_samples_every_question_writes_provenance_and_resumes(tmp_path, tiny_store, capsys):
    from app.cli import run_cli

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in GSM))
    out = tmp_path / "traces.jsonl"
    argv = ["train", "distill", "--data", str(data), "--out", str(out), "--teacher", TINY_ID, "--precision", "bf16",
            "--samples", "2", "--chunk", "2", "--max-tokens", "6", "--limit", "2"]
    assert run_cli(argv) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["questions"] == 2 and summary["samples"] == 4 and summary["tokens"] > 0
    state = json.loads((tmp_path / "traces.jsonl.state.json").read_text())
    assert sorted(map(tuple, state["done"])) == [("train.jsonl", 0), ("train.jsonl", 1)]
    assert out.is_file() and all("provenance" in json.loads(r) for r in out.read_text().splitlines())
    every = [json.loads(r) for r in right_path(out).read_text().splitlines()]  # written even when empty
    assert summary["right_in_file"] == len(every) and all(r["provenance"]["index"] in (0, 1) for r in every)
    assert run_cli(argv[:-2] + ["--limit", "3"]) == 0  # the same run again: only the new question is sampled
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["questions"] == 1
    alpaca = tmp_path / "alpaca.jsonl"
    alpaca.write_text(json.dumps({"instruction": "Write a poem", "output": "..."}) + "\n")
    assert run_cli(["train", "distill", "--data", str(alpaca), "--out", str(out), "--teacher", TINY_ID]) == 2


def test_sft_encodes_a_distilled_trace_like_any_trace(tiny_engine):
    row = trace_row(Item("What is 3 + 4?", "7", "gsm8k"), Sample("3 + 4 = \\boxed{7}", 5, True), {})
    prompt, response = encode_example(tiny_engine.tokenizer, example_from_row(row))
    text = tiny_engine.tokenizer.decode(response)
    assert "3 + 4 = 7" in text and text.endswith("\\boxed{7}.<|im_end|>")
    assert tiny_engine.tokenizer.decode(prompt).endswith("<think>\n")


def test_ponder_eval_runs_the_library_adapter_it_is_given_and_refuses_a_missing_one(tmp_path, tiny_store, tiny_hf_dir,
                                                                                     capsys):
    """Dev-split comparisons of a freshly trained adapter (`ponder train sft --name`) against the shipped one."""
    import torch

    from app.cli import run_cli
    from core.adapters import lora as adapters
    from core.adapters.library import AdapterLibrary
    from core.loading import load_plain

    folder = tmp_path / "fresh"
    model = adapters.attach_new(load_plain(tiny_hf_dir, torch.bfloat16), rank=4)
    adapters.save_adapter(model, folder, {"kind": "reasoning", "base_fingerprint": adapters.base_fingerprint(tiny_hf_dir)})
    AdapterLibrary(store=tiny_store).add_from_folder(folder, TINY_ID, "fresh", kind="reasoning")
    data = tmp_path / "dev.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in GSM))
    argv = ["eval", "--data", str(data), "--model", TINY_ID, "--precision", "bf16", "--kv", "bf16", "--budget", "4",
            "--answer-max-tokens", "4", "--limit", "2", "--json"]
    assert run_cli(argv + ["--adapter", "fresh"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["adapter"] == "fresh" and summary["n"] == 2 and summary["mode"] == "reason"
    assert run_cli(argv + ["--adapter", "no-such-adapter"]) == 2
    assert "did not load" in capsys.readouterr().err


def test_rft_rows_keep_the_shortest_distinct_right_traces_of_each_question_within_the_cap(tmp_path):
    from core.training.distill import rft_rows

    def row(q, thinking, tokens):
        return json.dumps({"question": q, "thinking": thinking, "answer": "1",
                           "provenance": {"trace_tokens": tokens}}) + "\n"

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(row("q1", "long", 300) + row("q1", "short", 100) + row("q2", "too long", 600))
    b.write_text(row("q1", "short ", 100) + row("q1", "mid", 200) + row("q2", "fits", 50))
    rows = rft_rows([a, b], per_question=2, max_trace_tokens=448)
    assert [(r["question"], r["thinking"]) for r in rows] == [("q1", "short"), ("q1", "mid"), ("q2", "fits")]
    with pytest.raises(ValueError, match="no such file"):
        rft_rows([a, tmp_path / "typo.jsonl"], per_question=2, max_trace_tokens=448)
    b.write_text(row("q3", "ok", 10) + '{"question": "q4", "thinking": "t", "answer": "1", "provenance": {}}\n')
    with pytest.raises(ValueError, match="b.jsonl:2: not a `ponder train distill` row"):
        rft_rows([b], per_question=2, max_trace_tokens=448)


def test_rft_rows_read_verifier_candidates_keeping_right_finished_traces_only(tmp_path):
    from core.training.distill import rft_rows

    def cand(i, sample, thinking, tokens, correct=True, forced=False):
        return json.dumps({"question_index": i, "question": f"q{i}", "gold": "7", "sample": sample, "text": "x",
                           "thinking": thinking, "final_answer": "7.0", "correct": correct,
                           "thinking_tokens": tokens, "answer_tokens": 9, "budget_forced": forced}) + "\n"

    f = tmp_path / "f.safetensors.candidates.jsonl"
    f.write_text(cand(0, 0, "long right", 250) + cand(0, 1, "short wrong", 90, correct=False)
                 + cand(0, 2, "short cut", 80, forced=True) + cand(0, 3, "mid right", 180)
                 + cand(1, 0, "   ", 5) + cand(1, 1, None, 5) + cand(1, 2, "all wrong", 100, correct=False)
                 + cand(2, 0, "so it is \\boxed{7}", 120) + cand(3, 0, "right but too long", 500))
    rows = rft_rows([f], per_question=1, max_trace_tokens=448)
    assert [(r["question"], r["thinking"], r["answer"]) for r in rows] == [("q0", "mid right", "7"),
                                                                          ("q2", "so it is 7", "7")]
    assert rows[0]["provenance"]["trace_tokens"] == 180 and rows[0]["provenance"]["sample"] == 3
