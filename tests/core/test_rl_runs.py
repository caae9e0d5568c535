"""Budget RL runs end to end on the tiny model: logs, checkpoints, resume, the CLI, the int4 base, question files."""
import io
import json
import math
from dataclasses import asdict

import pytest
import torch

from core.adapters import lora as adapters
from core.training.checkpoint import RunDir
from core.training.rewards import policy_update
from core.training.rl import RlArgs, rollout, run
from tests.conftest import TINY_ID
from tests.core.test_rl import GSM


@pytest.fixture
def start_adapter(tmp_path, tiny_hf_dir):
    from core.loading import load_plain

    model = adapters.attach_new(load_plain(tiny_hf_dir, torch.bfloat16), rank=4)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                torch.nn.init.normal_(p, std=0.05)
    folder = tmp_path / "start"
    adapters.save_adapter(model, folder, {"kind": "reasoning", "base_fingerprint": adapters.base_fingerprint(tiny_hf_dir)})
    return folder


def _events(rd: RunDir) -> list[dict]:
    return [json.loads(line) for line in (rd.path / "log.jsonl").read_text().splitlines()]


def test_tiny_run_logs_checkpoints_draws_resumes_and_stops(tmp_path, tiny_store, start_adapter):
    data = tmp_path / "gsm.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in GSM))
    args = RlArgs(data=(str(data),), adapter=str(start_adapter), budgets=(6, 10), group=2, steps=2, answer_tokens=4,
                  model_id=TINY_ID, precision="bf16", checkpoint_every=1, threads=1, run_dir=str(tmp_path / "run"))
    rd = RunDir(tmp_path / "run", json_progress=True, out=io.StringIO())
    out = run(args, rd, store=tiny_store)
    events = _events(rd)
    steps = [e for e in events if e["event"] == "rl_progress"]
    assert [e["step"] for e in steps] == [1, 2] and all(e["budget"] in (6, 10) for e in steps)
    for key in ("reward", "length", "accuracy", "cut_share", "kl", "loss", "seconds", "rollout_s", "elapsed_s", "eta_s"):
        assert key in steps[0]
    assert json.loads((rd.checkpoint / "state.json").read_text())["step"] == 2
    assert all((rd.path / f"{k}.png").stat().st_size > 1000 for k in ("reward", "length", "accuracy"))
    assert (out / "adapter_model.safetensors").is_file() and events[-1]["event"] == "saved"
    printed = [json.loads(line) for line in rd.out.getvalue().splitlines()]
    assert [e["event"] for e in printed] == [e["event"] for e in events]

    resumed = RunDir(tmp_path / "run", json_progress=True, out=io.StringIO())
    run(RlArgs(**{**args.__dict__, "steps": 3}), resumed, store=tiny_store, resume=True)
    again = [e for e in _events(resumed) if e["event"] == "rl_progress"]
    assert [e["step"] for e in again] == [1, 2, 3]  # continued after the checkpoint's step 2
    assert json.loads((rd.checkpoint / "state.json").read_text())["step"] == 3

    stop_dir = StopAfterFirstStep(tmp_path / "stopped", json_progress=True, out=io.StringIO())
    stopped_args = RlArgs(**{**args.__dict__, "steps": 5, "run_dir": str(stop_dir.path)})
    assert run(stopped_args, stop_dir, store=tiny_store) is None
    kinds = [(e["event"], e.get("step")) for e in _events(stop_dir)]
    assert kinds[-3:] == [("rl_progress", 1), ("checkpoint", 1), ("stopped", 1)]
    assert json.loads((stop_dir.checkpoint / "state.json").read_text())["step"] == 1


class StopAfterFirstStep(RunDir):
    """A run folder whose user drops a STOP file as soon as the first step is reported (as the wizard's Pause does)."""

    def emit(self, event: dict, text: str | None = None) -> None:
        super().emit(event, text)
        if event["event"] == "rl_progress" and event["step"] == 1:
            (self.path / "STOP").touch()


def test_ponder_train_rl_cli_saves_into_the_adapter_library(tmp_path, tiny_store, start_adapter, capsys):
    from app.cli import run_cli
    from core.adapters.library import AdapterLibrary

    data = tmp_path / "gsm.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in GSM))
    common = ["train", "rl", "--data", str(data), "--adapter", str(start_adapter), "--group", "2", "--steps", "1",
              "--answer-tokens", "4", "--model-id", TINY_ID, "--precision", "bf16", "--threads", "1", "--json-progress"]
    assert run_cli(common + ["--budgets", "6", "--questions", "2", "--name", "tiny-rl"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["event"] for e in events] == ["loaded", "rl_progress", "checkpoint", "saved"]
    card = AdapterLibrary().get(TINY_ID, "tiny-rl")
    assert card.kind == "reasoning" and card.recipe["method"] == "budget-rl" and card.recipe["budgets"] == [6]
    assert card.recipe["questions"] == 2
    assert events[-1]["folder"] == str(card.folder) and "reward" in card.metrics
    assert run_cli(common + ["--budgets", "six"]) == 2
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["event"] == "error"


def test_resume_with_fewer_steps_saves_the_stopped_runs_adapter_without_training_on(tmp_path, tiny_store,
                                                                                   start_adapter, capsys):
    """A long run stopped early keeps what it learned: `--resume --steps N` at or below the saved step saves the
    adapter (and into the library under the run's name) without another step; a larger N trains on to N."""
    from app.cli import run_cli
    from core.adapters.library import AdapterLibrary

    data = tmp_path / "gsm.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in GSM))
    run_dir = tmp_path / "run"
    stop = StopAfterFirstStep(run_dir, json_progress=True, out=io.StringIO())
    args = RlArgs(data=(str(data),), adapter=str(start_adapter), budgets=(6,), group=2, steps=5, answer_tokens=4,
                  model_id=TINY_ID, precision="bf16", checkpoint_every=1, threads=1, run_dir=str(run_dir),
                  name="tiny-stopped")
    stop.write_args(asdict(args))
    assert run(args, stop, store=tiny_store) is None
    capsys.readouterr()
    assert run_cli(["train", "rl", "--resume", "--run-dir", str(run_dir), "--steps", "1", "--json-progress"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["event"] for e in events] == ["loaded", "saved"]  # no rl_progress: nothing trained after step 1
    card = AdapterLibrary().get(TINY_ID, "tiny-stopped")
    assert card.metrics and json.loads((run_dir / "args.json").read_text())["steps"] == 1
    assert run_cli(["train", "rl", "--resume", "--run-dir", str(run_dir), "--steps", "2", "--json-progress"]) == 0
    steps = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["step"] for e in steps if e["event"] == "rl_progress"] == [2]


def test_quantized_base_rolls_out_on_the_served_int4_model_with_the_trained_adapter(tmp_path, tiny_store,
                                                                                    start_adapter):
    """On a w4 base the update trains a dense dequantized copy while rollouts decode on the int4 model the app
    serves; before each rollout the served adapter is given the trained one's current tensors."""
    from core.training.rl import rollout_engine, setup

    data = tmp_path / "gsm.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in GSM))
    args = RlArgs(data=(str(data),), adapter=str(start_adapter), budgets=(6,), group=2, answer_tokens=4,
                  model_id=TINY_ID, precision="w4", threads=1)
    _, engine, ref, optim, _, _ = setup(args, tiny_store)
    served = engine.rollouts
    assert any(type(m).__name__ == "QLinear" for m in served.model.modules())
    assert not any(type(m).__name__ == "QLinear" for m in engine.model.modules())
    trained = {n: p for n, p in engine.model.named_parameters() if p.requires_grad}
    with torch.no_grad():
        for p in trained.values():
            p.add_(0.01)
    assert rollout_engine(engine) is served
    current = dict(served.model.named_parameters())
    assert all(torch.equal(current[n].float(), p.float()) for n, p in trained.items())
    assert served.kv == "int8"  # rollouts decode over the KV8 cache the app serves with
    prefix, samples = rollout(served, GSM[0]["question"], 6, args, seed=2)
    assert len(samples) == 2 and all(s.thinking_tokens <= 6 for s in samples)
    stats = policy_update(engine.model, optim, prefix, samples, [1.0, -1.0], ref, clip=args.clip, kl=args.kl,
                          temperature=args.temperature)
    assert math.isfinite(stats["loss"])
    # the int4 engine's sampling log-probs are not the dense copy's: the update sees and corrects the gap
    assert all(len(s.logprobs) == len(s.ids) for s in samples)
    assert stats["mismatch"] > 1e-3 and 0 <= stats["tis_capped"] <= 1


def test_rl_question_file_keeps_short_solutions_in_a_row_range_and_rejects_bad_rows(tmp_path):
    from scripts import make_rl_questions

    rows = [{"question": f"q{i}", "answer": "<<1+1=2>>" * (i % 5) + f"\n#### {i}"} for i in range(12)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "rl.jsonl"
    assert make_rl_questions.main(["--data", str(data), "--offset", "2", "--limit", "8", "--max-steps", "2",
                                   "--out", str(out)]) == 0
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["question"] for r in kept] == ["q2", "q5", "q6", "q7"]  # rows 2..9 with at most two steps
    assert kept[0] == rows[2]
    data.write_text(json.dumps({"question": "no answer"}) + "\n")
    with pytest.raises(SystemExit, match="train.jsonl: row 1 is not a GSM8K row"):
        make_rl_questions.main(["--data", str(data), "--out", str(out)])
    data.write_text("{not json\n")
    with pytest.raises(SystemExit, match="train.jsonl:1 is not valid JSON"):
        make_rl_questions.main(["--data", str(data), "--out", str(out)])


def test_resume_refuses_questions_changed_or_gone_since_the_checkpoint(tmp_path, tiny_store, start_adapter, capsys):
    """The checkpoint keeps the questions' hash; `--resume` on an edited or removed file is one error event (not
    resumable) before any model loads, and the checkpoint stays. Put back as it was, the run resumes."""
    from app.cli import run_cli
    from core.training.rl import data_hash

    data = tmp_path / "gsm.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in GSM))
    run_dir = tmp_path / "run"
    stop = StopAfterFirstStep(run_dir, json_progress=True, out=io.StringIO())
    args = RlArgs(data=(str(data),), adapter=str(start_adapter), budgets=(6,), group=2, steps=3, answer_tokens=4,
                  model_id=TINY_ID, precision="bf16", checkpoint_every=1, threads=1, run_dir=str(run_dir))
    stop.write_args(asdict(args))
    assert run(args, stop, store=tiny_store) is None
    state = json.loads((stop.checkpoint / "state.json").read_text())
    assert state["step"] == 1 and state["data_hash"] == data_hash([data]) and state["model_id"] == TINY_ID
    original = data.read_text()
    capsys.readouterr()

    data.write_text(original + json.dumps({"question": "What is 2 + 2?", "answer": "#### 4"}) + "\n")
    assert run_cli(["train", "rl", "--resume", "--run-dir", str(run_dir), "--json-progress"]) == 2
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["event"] for e in events] == ["error"] and events[0]["resumable"] is False
    assert f"the data file {data} changed since the checkpoint" in events[0]["message"]
    data.unlink()
    assert run_cli(["train", "rl", "--resume", "--run-dir", str(run_dir), "--json-progress"]) == 2
    assert "is gone since the checkpoint" in json.loads(capsys.readouterr().out.splitlines()[-1])["message"]
    assert json.loads((stop.checkpoint / "state.json").read_text())["step"] == 1

    data.write_text(original)
    assert run_cli(["train", "rl", "--resume", "--run-dir", str(run_dir), "--steps", "2", "--json-progress"]) == 0
    steps = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["step"] for e in steps if e["event"] == "rl_progress"] == [2]
