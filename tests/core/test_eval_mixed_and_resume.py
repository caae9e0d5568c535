"""`ponder eval` on files that mix scored questions with chat rows, resuming a stopped run, and `bench.routing`'s
comparison of Fast, Reason and Auto over such a file (tiny model, real code paths)."""
import json
from types import SimpleNamespace

import pytest

from bench import routing
from core.adapters import lora as adapters
from core.data.datasets import load_items
from core.engine import Engine
from core.evaluation.evaluate import evaluate
from scripts import make_mixed_dev
from tests.tiny import make_model, make_tokenizer


@pytest.fixture(scope="module")
def engine():
    model = adapters.attach_new(make_model(448), rank=4)
    model.eval()
    return Engine(model, make_tokenizer(), model_id="tiny", context=512, adapter_name="reason")


def mixed_file(tmp_path):
    data = tmp_path / "mixed.jsonl"
    rows = [{"question": f"What is {a}+1?", "answer": f"so\n#### {a + 1}"} for a in range(3)]
    rows += [{"instruction": f"Write a line about the {w}.", "input": ""} for w in ("sea", "sky")]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


def eval_args(data, out, **kw):
    base = dict(mode="base", budget=4, answer_max_tokens=3, max_tokens=4, parallel=1, vote="weighted",
                temperature=0.0, seed=0, progress=False, data=data, system=None, batch=2, out=out, offset=0)
    return SimpleNamespace(**{**base, **kw})


def test_chat_rows_are_timed_not_scored(engine, tmp_path):
    data = mixed_file(tmp_path)
    out = evaluate(engine, load_items(data), eval_args(data, tmp_path / "r.json"))
    assert [q["correct"] is None for q in out["questions"]] == [False, False, False, True, True]
    assert out["n"] == 5 and out["n_graded"] == 3
    assert out["accuracy"] == sum(q["correct"] for q in out["questions"][:3]) / 3
    assert all(q["answer_tokens"] > 0 for q in out["questions"])  # chat answers still count their tokens


def test_a_stopped_run_resumes_where_it_stopped(engine, tmp_path):
    data = mixed_file(tmp_path)
    whole = evaluate(engine, load_items(data), eval_args(data, tmp_path / "whole.json"))
    out = tmp_path / "part.json"
    evaluate(engine, load_items(data, 2), eval_args(data, out))  # stopped after two rows
    saved = json.loads(out.read_text())
    saved["questions"][0]["text"] = "kept, not answered again"  # a marker: the resumed run must keep this row
    out.write_text(json.dumps(saved))
    resumed = evaluate(engine, load_items(data), eval_args(data, out, resume=True))
    assert [q["index"] for q in resumed["questions"]] == [0, 1, 2, 3, 4]
    assert resumed["questions"][0]["text"] == "kept, not answered again"
    assert [q["text"] for q in resumed["questions"][1:]] == [q["text"] for q in whole["questions"][1:]]
    assert json.loads(out.read_text())["partial"] is False
    with pytest.raises(ValueError, match="other settings.*max_tokens"):  # not comparable: refused, file untouched
        evaluate(engine, load_items(data), eval_args(data, out, resume=True, max_tokens=5))
    assert json.loads(out.read_text())["n"] == 5


def test_auto_in_batches_records_each_rows_route(engine, tmp_path):
    """`--batch` with `--mode auto`: the rows keep the routes and answers of a one-at-a-time run."""
    import torch

    from core.reasoning.router import Router
    from models.heads import SwitcherHead

    data = mixed_file(tmp_path)
    torch.manual_seed(5)
    engine.router = Router(SwitcherHead(engine.model.config.hidden_size), {"threshold": 0.5})
    try:
        probs = sorted(engine.route_prompt(i.prompt, budget=4).probability for i in load_items(data))
        engine.router.threshold = probs[2]  # three of the five rows think
        batched = evaluate(engine, load_items(data), eval_args(data, tmp_path / "b.json", mode="auto"))
        alone = evaluate(engine, load_items(data), eval_args(data, tmp_path / "a.json", mode="auto", batch=1))
    finally:
        engine.router = None
    assert sum(q["reasoned"] for q in batched["questions"]) == 3 and batched["reasoned_share"] == 0.6
    assert [(q["reasoned"], q["text"]) for q in batched["questions"]] == [
        (q["reasoned"], q["text"]) for q in alone["questions"]]


def run_file(path, mode, correct, tokens, reasoned):
    questions = [{"index": i, "correct": c, "thinking_tokens": 0, "answer_tokens": t, "reasoned": r}
                 for i, (c, t, r) in enumerate(zip(correct, tokens, reasoned, strict=True))]
    path.write_text(json.dumps({"mode": mode, "data": str(path.parent / "mixed.jsonl"), "model": "m",
                                "precision": "w4", "kv": "int8", "budget": 8, "n": len(questions),
                                "questions": questions}))
    return path


def test_routing_scores_questions_and_times_chat(tmp_path, monkeypatch):
    (tmp_path / "mixed.subsets.json").write_text(json.dumps({"math": [0, 2], "chat": [2, 4]}))
    fast = run_file(tmp_path / "f.json", "base", [True, False, None, None], [10, 10, 10, 10], [0, 0, 0, 0])
    reason = run_file(tmp_path / "r.json", "reason", [False, True, None, None], [5, 5, 50, 50], [1, 1, 1, 1])
    auto = run_file(tmp_path / "a.json", "auto", [False, True, None, None], [5, 5, 10, 10], [1, 1, 0, 0])
    written = {}
    monkeypatch.setattr(routing, "write_results", lambda name, result, md, **kw: written.update(result=result))
    routing.main(["--fast", str(fast), "--reason", str(reason), "--auto", str(auto)])
    result = written["result"]
    assert result["parts"]["chat"]["auto"]["accuracy"] is None and result["parts"]["chat"]["graded"] == 0
    assert result["all"]["auto"]["accuracy"] == 0.5 and result["all"]["graded"] == 2
    assert result["auto_at_least_best"] and result["auto_fewer_tokens_than_reason"]  # 7.5 tokens against 27.5
    bound = result["all"]["oracle"]  # Fast where only Fast is right, Reason where only Reason is: both questions
    assert bound["accuracy"] == 1.0 and bound["tokens"] == 7.5 and bound["reason_share"] == 0.5
    assert result["parts"]["chat"]["oracle"] is None


def test_mixed_dev_set_is_deterministic_and_appends_chat(tmp_path):
    shared = tmp_path / "shared"
    for folder, rows, n in (("gsm8k", lambda i: {"question": f"q{i}", "answer": f"#### {i}"}, 7300),
                            ("math", lambda i: {"problem": f"p{i}", "answer": str(i)}, 7500),
                            ("chat", lambda i: {"instruction": f"write {i}", "input": ""}, 5000)):
        (shared / folder).mkdir(parents=True)
        name = "alpaca_5k.jsonl" if folder == "chat" else "train.jsonl"
        (shared / folder / name).write_text("".join(json.dumps(rows(i)) + "\n" for i in range(n)))
    for out in (tmp_path / "a", tmp_path / "b"):
        make_mixed_dev.main(["--out", str(out), "--data", str(shared)])
    assert (tmp_path / "a" / "mixed_dev.jsonl").read_bytes() == (tmp_path / "b" / "mixed_dev.jsonl").read_bytes()
    parts = json.loads((tmp_path / "a" / "mixed_dev.subsets.json").read_text())
    items = load_items(tmp_path / "a" / "mixed_dev.jsonl")
    assert list(parts) == ["gsm8k", "math", "arithmetic", "chat"] and parts["chat"][1] == len(items)
    assert items[0].prompt == "q7100" and items[parts["math"][0]].prompt == "p7436"
    lo, hi = parts["chat"]
    assert all(i.gold is None for i in items[lo:hi]) and all(i.gold is not None for i in items[:lo])
    assert items[lo].prompt == f"write {make_mixed_dev.CHAT_DEV[0]}"
