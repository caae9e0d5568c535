"""TrainingJob runs the real `ponder train sft` child process on the tiny model: its JSON events arrive,
the adapter lands in the library; a stopped job resumes; a killed job leaves the library unchanged."""
import json
import os
import sys
import threading

import pytest

from app.training_job import TrainingJob, ponder_command
from core.adapters.library import AdapterLibrary

MODEL = ["--model-id", "tiny-qwen2", "--precision", "bf16", "--rank", "4", "--eval-tokens", "6", "--json-progress"]


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "sql.jsonl"
    rows = [{"question": f"What is {i} plus {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(8)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


class Recorder:
    def __init__(self):
        self.events, self.seen = [], threading.Condition()

    def __call__(self, event):
        with self.seen:
            self.events.append(event)
            self.seen.notify_all()

    def wait_for(self, kind, timeout=120):
        with self.seen:
            assert self.seen.wait_for(lambda: any(e["event"] in (kind, "exited") for e in self.events), timeout)
        return next(e for e in self.events if e["event"] in (kind, "exited"))

    def kinds(self):
        return [e["event"] for e in self.events]


def start(args, tmp_path, run="run"):
    rec = Recorder()
    job = TrainingJob(["train", "sft", *args], rec, run_dir=tmp_path / run, env=dict(os.environ))
    job.start()
    return job, rec


def test_ponder_command_runs_the_source_tree():
    assert ponder_command()[1:] == ["-m", "app"]


def test_job_trains_evaluates_and_saves_into_the_library(tiny_store, tmp_path, data):
    job, rec = start(["--data", str(data), "--name", "adder", "--kind", "reasoning", "--preset", "quick",
                      "--steps", "3", "--held-out", "0.25", *MODEL], tmp_path)
    assert job.wait(timeout=300) == 0, rec.events
    kinds = rec.kinds()
    assert kinds[0] == "loaded" and kinds[-1] == "exited" and kinds.count("progress") == 3
    assert kinds.index("eval") < kinds.index("saved") < kinds.index("exited")
    loaded = rec.events[0]
    assert loaded == {"event": "loaded", "examples": 6, "held_out": 2, "total_steps": 3}
    progress = [e for e in rec.events if e["event"] == "progress"]
    assert [p["step"] for p in progress] == [1, 2, 3] and progress[-1]["eta_s"] == 0
    assert all(p["tokens_per_s"] > 0 and p["total"] == 3 for p in progress)
    ev = rec.events[kinds.index("eval")]
    assert ev["before"]["accuracy"] is not None and ev["after"]["mean_tokens"] >= 0 and ev["samples"][0]["gold"]
    card = AdapterLibrary().get("tiny-qwen2", "adder")
    assert card.kind == "reasoning" and len(card.data_hash) == 64 and card.recipe["preset"] == "quick"
    assert card.metrics["after"] == ev["after"] and str(card.folder) == rec.events[kinds.index("saved")]["folder"]


def test_stopped_job_resumes_and_a_killed_one_leaves_the_library_unchanged(tiny_store, tmp_path, data):
    job, rec = start(["--data", str(data), "--name", "paused", "--steps", "40", *MODEL], tmp_path)
    rec.wait_for("progress")
    job.stop()
    assert job.wait(timeout=120) == 0 and not job.running
    stopped = rec.wait_for("stopped")
    assert stopped["resumable"] and 1 <= stopped["step"] < 40
    assert (tmp_path / "run" / "checkpoint" / "state.json").is_file()
    assert AdapterLibrary().list("tiny-qwen2", kind="skill") == []

    again, rec2 = start(["--resume", "--json-progress", "--steps", "1"], tmp_path)  # --resume keeps the saved args
    first = rec2.wait_for("progress")
    assert first["step"] == stopped["step"] + 1 and first["total"] == 40
    again.kill()
    assert again.wait(timeout=60) not in (0, None)
    assert "saved" not in rec2.kinds() and AdapterLibrary().list("tiny-qwen2", kind="skill") == []


def test_check_data_and_name_rule_for_the_wizard(tiny_store, tmp_path, data):
    """The wizard's default data check reads the file with the installed model's tokenizer and lists each problem
    with its line; the name rule is the library's."""
    from app.training_job import check_data, validate_adapter_name

    report, bins = check_data(data, "tiny-qwen2", kind="skill")
    assert report.ok and len(report.records) == 8 and sum(count for _, _, count in bins) == 8
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hi", "response": "hello"}\nnot json\n{"prompt": "", "response": "x"}\n')
    report, _ = check_data(bad, "tiny-qwen2", kind="skill")
    assert not report.ok and sorted(p.line for p in report.problems) == [2, 3]
    assert validate_adapter_name("sql-helper") == "sql-helper"
    with pytest.raises(ValueError):
        validate_adapter_name("../x")


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM is how the stop reaches the child on POSIX")
def test_a_stop_while_the_child_still_starts_is_a_stop_not_a_crash(tmp_path, data):
    """Stop pressed before the child has set up its handlers (still importing): SIGTERM ends it with -15; the exit
    event says the user asked for it, and the unhonoured STOP file is gone, so a later run does not stop at once."""
    job, rec = start(["--data", str(data), "--name", "early", "--steps", "3", *MODEL], tmp_path)
    job.stop()
    rc = job.wait(timeout=60)
    assert rc is not None and rc != 0, rec.events
    exited = rec.events[-1]
    assert exited["event"] == "exited" and exited["stop_requested"] is True and exited["returncode"] == rc
    assert not (tmp_path / "run" / "STOP").exists()


def test_a_stop_file_written_while_the_child_starts_is_not_lost(tiny_store, tmp_path, data):
    """Windows' stop is the STOP file alone: one written while the child still imports must not be cleared by it."""
    job, rec = start(["--data", str(data), "--name", "early", "--steps", "6", *MODEL], tmp_path)
    (tmp_path / "run").mkdir(exist_ok=True)
    (tmp_path / "run" / "STOP").touch()  # what stop() does where there is no SIGTERM
    assert job.wait(timeout=300) == 0, rec.events
    kinds = rec.kinds()
    assert "stopped" in kinds and "saved" not in kinds and kinds.count("progress") == 1
    assert rec.wait_for("stopped")["step"] == 1 and not (tmp_path / "run" / "STOP").exists()
    assert AdapterLibrary().list("tiny-qwen2", kind="skill") == []


def test_resume_of_a_run_whose_data_file_changed_is_refused(tiny_store, tmp_path, data):
    """Paused, then the data file replaced in place by other records: the resumed child says so in one error event
    (not resumable) and trains nothing; the checkpoint stays, and the saved-run check still matches the command."""
    from app.training_job import saved_run_differences

    cmd = ["--data", str(data), "--name", "edited", "--steps", "40", "--checkpoint-every", "1", *MODEL]
    job, rec = start(cmd, tmp_path)
    rec.wait_for("checkpoint")
    job.stop()
    assert job.wait(timeout=120) == 0
    step = rec.wait_for("stopped")["step"]
    assert json.loads((tmp_path / "run" / "checkpoint" / "state.json").read_text())["data_hash"]
    assert saved_run_differences(tmp_path / "run", ["train", "sft", *cmd]) == []

    data.write_text("\n".join(json.dumps({"question": f"What is {i} times 3?", "answer": f"#### {3 * i}"})
                              for i in range(40)))
    again, rec2 = start(["--resume", "--json-progress"], tmp_path)
    assert again.wait(timeout=120) == 2, rec2.events
    assert rec2.kinds() == ["error", "exited"]
    error = rec2.events[0]
    assert error["resumable"] is False and f"the data file {data} changed since the checkpoint" in error["message"]
    assert json.loads((tmp_path / "run" / "checkpoint" / "state.json").read_text())["step"] == step
    assert AdapterLibrary().list("tiny-qwen2") == []
