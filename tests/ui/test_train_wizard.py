"""The training wizard end to end on the tiny model, with real `ponder train sft` subprocesses: data problems
listed with their lines (Next disabled), a clean file passes, the time estimate, training with a live loss plot,
cancel then resume, the adapter in the library and handed to on_use; a killed process leaves the library as it
was and its checkpoint is offered for resuming, also when the wizard is opened again."""
import json
import sys

import pytest
from PySide6.QtWidgets import QWizard

from core.adapters.cards import validate_adapter_name
from core.adapters.library import AdapterLibrary
from core.data.train import token_histogram, validate_file
from core.loading import load_tokenizer
from core.storage.model_store import ModelStore
from tests.conftest import TINY_ID
from ui.dialogs import ConfirmDialog
from ui.train_wizard import TrainWizard
from ui.wizard_train_pages import FolderOpener

TIMEOUT = 120_000  # ms; 2 shared cores, each subprocess imports torch and loads the tiny model


def check_data(path, model_id, kind, max_tokens, csv_columns):
    """What the app's data check does: the installed model's tokenizer, every line validated, the histogram."""
    report = validate_file(path, load_tokenizer(ModelStore().get(model_id).hf_dir), kind=kind, max_tokens=max_tokens,
                           csv_columns=csv_columns)
    return report, token_histogram(report.token_lengths)


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def good_rows(n=12):
    return [{"prompt": f"Greet visitor number {i}", "response": f"Hello, visitor {i}! Welcome."} for i in range(n)]


@pytest.fixture
def confirm(monkeypatch):
    answers = {"value": True, "asked": []}

    def ask(cls, parent, title, text):
        answers["asked"].append(title)
        return answers["value"]

    monkeypatch.setattr(ConfirmDialog, "ask", classmethod(ask))
    return answers


@pytest.fixture
def make_wizard(qtbot, tiny_store, tmp_path, confirm):
    used = []

    def make(**kwargs):
        w = TrainWizard(None, model_ids=[TINY_ID], current_model=TINY_ID, library=AdapterLibrary(),
                        on_use=used.append, runs_dir=tmp_path / "runs", check_data=check_data,
                        validate_name=validate_adapter_name, **kwargs)
        w.used = used
        qtbot.addWidget(w)
        w.show()
        return w

    yield make
    from ui.wizard_run import LIVE_RUNNERS
    for runner in list(LIVE_RUNNERS):  # nothing outlives a test
        runner.kill()


def next_enabled(w) -> bool:
    button = QWizard.WizardButton.CommitButton if w.currentPage().isCommitPage() else QWizard.WizardButton.NextButton
    return w.button(button).isEnabled() and w.button(button).isVisible()


def check_file(qtbot, w, path, kind="skill"):
    page = w.data_page
    page.path_edit.setText(str(path))
    page.kind.setCurrentIndex(page.kind.findData(kind))
    before = page._check_id
    page.check_button.click()
    qtbot.waitUntil(lambda: page._check_id > before and page.check_button.isEnabled(), timeout=TIMEOUT)
    return page


def to_train(qtbot, w, path, name, steps, estimate=False, kind="skill"):
    check_file(qtbot, w, path, kind)
    assert next_enabled(w)
    w.next()
    recipe = w.recipe_page
    assert w.currentPage() is recipe
    recipe.name.setText(name)
    recipe.steps.setValue(steps)
    if estimate:
        recipe.estimate_button.click()
        assert not next_enabled(w)  # no training while the estimate runs
        qtbot.waitUntil(lambda: recipe.estimate_button.isEnabled(), timeout=TIMEOUT)
        assert "s per step" in recipe.estimate_label.text(), recipe.estimate_label.text()
        assert f"× {steps} steps" in recipe.estimate_label.text()
    assert next_enabled(w), recipe.name_error.text()
    w.next()
    assert w.currentPage() is w.train_page
    return w.train_page.panel


def test_data_problems_are_listed_with_their_lines_and_block_next(qtbot, make_wizard, tmp_path):
    w = make_wizard()
    bad = write_jsonl(tmp_path / "bad.jsonl", [good_rows()[0], "{not json", {"prompt": "only a prompt"},
                                               good_rows()[0], {"prompt": "  ", "response": "x"}, good_rows()[1]])
    page = check_file(qtbot, w, bad)
    problems = [page.problems.item(i).text() for i in range(page.problems.count())]
    assert [p.split(":")[0] for p in problems] == ["line 2", "line 3", "line 4", "line 5"], problems
    assert "problem" in page.status.text()
    assert not next_enabled(w)

    good = write_jsonl(tmp_path / "good.jsonl", good_rows())
    check_file(qtbot, w, good)
    assert page.problems.count() == 0 and page.status.text().startswith("OK: 12 records")
    assert page.preview.rowCount() == 5 and page.preview.item(0, 2).text() == "Hello, visitor 0! Welcome."
    assert sum(n for *_, n in page.histogram.bins()) == 12
    assert next_enabled(w)
    page.kind.setCurrentIndex(page.kind.findData("reasoning"))  # a different check is needed for another kind
    assert not next_enabled(w)

    csv_file = tmp_path / "pairs.csv"
    csv_file.write_text("id,question,reply\n1,What is up?,Not much.\n2,Hi?,Hello.\n")
    page.path_edit.setText(str(csv_file))
    assert page.csv_box.isVisibleTo(w) and page.response_col.currentText() == "reply"
    page.prompt_col.setCurrentText("question")
    check_file(qtbot, w, csv_file)
    assert page.status.text().startswith("OK: 2 records"), page.status.text()
    assert w.state.sft_args()[-2:] == ["--columns", "question,reply"]


def test_recipe_names_and_presets(qtbot, make_wizard, tmp_path):
    w = make_wizard()
    check_file(qtbot, w, write_jsonl(tmp_path / "good.jsonl", good_rows()))
    w.next()
    recipe = w.recipe_page
    assert not next_enabled(w) and "name" in recipe.name_error.text()
    recipe.name.setText("Not A Name!")
    assert not next_enabled(w) and "adapter name" in recipe.name_error.text()
    recipe.name.setText("greeter")
    assert next_enabled(w) and recipe.name_error.text() == ""
    thorough = next(b for b in recipe.presets.buttons() if b.property("preset") == "thorough")
    thorough.click()
    assert recipe.steps.value() == 150 and recipe.max_tokens.value() == 1024
    recipe.rank.setValue(4)
    longest = max(w.state.report.token_lengths)
    recipe.max_tokens.setValue(longest - 1)  # the trainer would refuse the longest record
    assert not next_enabled(w) and f"at least {longest}" in recipe.length_note.text()
    recipe.max_tokens.setValue(longest)
    assert next_enabled(w) and recipe.length_note.text() == ""
    args = w.state.sft_args()
    assert args[args.index("--preset") + 1] == "thorough" and args[args.index("--rank") + 1] == "4"
    assert args[args.index("--run-dir") + 1] == str(tmp_path / "runs" / "greeter")
    assert w.train_page.nextId() == w.EVALUATE  # a skill adapter skips the concise-reasoning stage


def reasoning_rows(n=12):
    return [{"question": f"What is {i} plus {i + 1}?", "answer": f"{i} plus {i + 1} is {2 * i + 1}.\n#### {2 * i + 1}"}
            for i in range(n)]


def test_train_cancel_resume_concise_save_and_use(qtbot, make_wizard, tmp_path, confirm, monkeypatch):
    w = make_wizard(extra_args=["--precision", "bf16"], rl_args=["--group", "2", "--answer-tokens", "8"])
    data = write_jsonl(tmp_path / "sums.jsonl", reasoning_rows())
    w.data_page.held_out.setValue(20)
    panel = to_train(qtbot, w, data, "adder", steps=10, estimate=True, kind="reasoning")
    assert not w.button(QWizard.WizardButton.BackButton).isEnabled()  # Recipe was the commit page
    qtbot.waitUntil(lambda: panel.bar.value() >= 1, timeout=TIMEOUT)
    assert panel.state == "running" and panel.step_label.text().startswith("Step ")
    assert panel.cancel_button.isEnabled() and not next_enabled(w)

    panel.cancel_button.click()
    assert confirm["asked"] == ["Cancel training"]
    qtbot.waitUntil(lambda: not panel.running and panel.state != "running", timeout=TIMEOUT)
    assert panel.state == "cancelled", panel.status.text()
    assert (tmp_path / "runs" / "adder" / "checkpoint" / "state.json").is_file()
    assert panel.pause_button.text() == "Resume" and panel.pause_button.isEnabled()
    assert w.train_page.start_over.isVisible()
    assert AdapterLibrary().list(TINY_ID) == [] and not next_enabled(w)
    stopped_at = panel.checkpoint_step
    assert 1 <= stopped_at < 10

    panel.pause_button.click()  # Resume
    assert panel.state == "running" and panel.pause_button.text() == "Pause"
    qtbot.waitUntil(lambda: panel.state != "running", timeout=TIMEOUT)
    assert panel.state == "done", panel.status.text() + panel.stderr.toPlainText()
    steps = [e["step"] for e in panel.events if e["event"] == "progress"]
    assert steps[-1] == 10 and steps[steps.index(stopped_at) + 1] == stopped_at + 1  # resumed, not restarted
    assert len(panel.plots["loss"].points("loss")) >= 10
    cards = AdapterLibrary().list(TINY_ID)
    assert [(c.name, c.kind) for c in cards] == [("adder", "reasoning")]
    assert next_enabled(w)

    w.next()  # a reasoning adapter goes on to the optional concise-reasoning stage
    concise = w.concise_page
    assert w.currentPage() is concise and not next_enabled(w)
    concise.steps.setValue(1)
    concise.start_button.click()
    qtbot.waitUntil(lambda: concise.panel.state != "running", timeout=TIMEOUT)
    assert concise.panel.state == "done", concise.panel.status.text() + concise.panel.stderr.toPlainText()
    assert concise.panel.plots["reward"].points("reward") and concise.panel.plots["length"].points("length")
    assert {c.name for c in AdapterLibrary().list(TINY_ID)} == {"adder", "adder-concise"}
    assert next_enabled(w)

    w.next()
    page = w.evaluate_page
    assert w.currentPage() is page
    assert page.metrics.item(0, 0).text().endswith("%") and page.metrics.item(1, 1).text().endswith("tokens")
    assert page.samples.rowCount() >= 1 and "'adder', 'adder-concise'" in page.saved_label.text()
    opened = []
    monkeypatch.setattr(FolderOpener, "open", classmethod(lambda cls, folder: opened.append(folder)))
    page.open_button.click()
    page.use_button.click()
    assert [c.name for c in w.used] == ["adder-concise"] and opened == [w.used[0].folder]

    w2 = make_wizard()  # the name is taken now
    check_file(qtbot, w2, data)
    w2.next()
    w2.recipe_page.name.setText("adder")
    assert not next_enabled(w2) and "already exists" in w2.recipe_page.name_error.text()


def test_killed_training_leaves_the_library_unchanged_and_resumes(qtbot, make_wizard, tmp_path, confirm):
    w = make_wizard(extra_args=["--precision", "bf16", "--checkpoint-every", "1"])
    data = write_jsonl(tmp_path / "good.jsonl", good_rows())
    panel = to_train(qtbot, w, data, "crashy", steps=40)
    qtbot.waitUntil(lambda: panel.checkpoint_step is not None and panel.checkpoint_step >= 1, timeout=TIMEOUT)

    confirm["value"] = False
    w.reject()  # closing while training asks first; "no" keeps it running
    assert confirm["asked"] == ["Stop training?"] and w.isVisible() and panel.running

    panel.runner.kill()
    qtbot.waitUntil(lambda: panel.state == "crashed", timeout=TIMEOUT)
    assert panel.stderr.isVisibleTo(w) and "exit code" in panel.status.text()
    assert panel.pause_button.text() == "Resume" and panel.pause_button.isEnabled()
    assert AdapterLibrary().list(TINY_ID) == []
    assert not (tmp_path / "home" / "data" / "adapters" / TINY_ID / "crashy").exists()
    w.reject()
    assert not w.isVisible()

    w2 = make_wizard(extra_args=["--precision", "bf16"])  # opened again on the same run: Resume is offered
    panel2 = to_train(qtbot, w2, data, "crashy", steps=40)
    assert panel2.state == "paused" and not panel2.running
    assert panel2.pause_button.text() == "Resume" and panel2.pause_button.isEnabled()
    assert w2.train_page.start_over.isVisible()


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM is how the stop reaches the child on POSIX")
def test_pause_pressed_while_the_process_starts_is_a_pause_not_a_crash(qtbot, ponder_home, tmp_path):
    """Pause right after the start: the child dies of the SIGTERM before its handlers are set; that is the pause the
    user asked for (no checkpoint yet: it can only start again), not a crash."""
    from ui.wizard_run import RunPanel

    data = write_jsonl(tmp_path / "good.jsonl", good_rows())
    panel = RunPanel("progress", {"loss": "loss"})
    qtbot.addWidget(panel)
    panel.start(["train", "sft", "--data", str(data), "--name", "x", "--model-id", TINY_ID, "--json-progress"],
                tmp_path / "run")
    panel.stop("paused")
    qtbot.waitUntil(lambda: panel.state != "running", timeout=TIMEOUT)
    assert panel.events[-1]["returncode"] != 0
    assert panel.state == "paused" and "first checkpoint" in panel.status.text(), panel.status.text()
    assert not panel.stderr.isVisibleTo(panel)
    assert panel.pause_button.text() == "Start again" and panel.pause_button.isEnabled()
    panel.pause_button.click()  # starts the same run again
    assert panel.state == "running" and panel.runner.running
    panel.runner.kill()
    qtbot.waitUntil(lambda: panel.state != "running", timeout=TIMEOUT)


def test_resume_is_offered_only_for_the_run_the_wizard_would_start_and_never_on_edited_data(qtbot, make_wizard,
                                                                                              tmp_path, confirm):
    """A paused run's folder is keyed by the adapter name: a later wizard with the same name but another data file
    offers to start again, not Resume (which would train the old file); with the same settings but the file
    edited in place, Resume is refused by the child (the data changed) and Start again trains from step 1."""
    data = write_jsonl(tmp_path / "good.jsonl", good_rows())
    w = make_wizard(extra_args=["--precision", "bf16", "--checkpoint-every", "1"])
    panel = to_train(qtbot, w, data, "edited", steps=40)
    qtbot.waitUntil(lambda: panel.checkpoint_step is not None and panel.checkpoint_step >= 1, timeout=TIMEOUT)
    panel.pause_button.click()
    qtbot.waitUntil(lambda: panel.state == "paused" and not panel.running, timeout=TIMEOUT)
    state = tmp_path / "runs" / "edited" / "checkpoint" / "state.json"
    paused_at = json.loads(state.read_text())["step"]
    w.reject()

    other = write_jsonl(tmp_path / "other.jsonl", [{"prompt": f"Name colour {i}", "response": f"Colour {i} is blue."}
                                                   for i in range(12)])
    w2 = make_wizard(extra_args=["--precision", "bf16"])
    panel2 = to_train(qtbot, w2, other, "edited", steps=40)
    assert panel2.state == "paused" and not panel2.running
    assert "another data file" in panel2.status.text() and "Start again" in panel2.status.text()
    assert panel2.pause_button.text() == "Start again" and panel2.pause_button.isEnabled()
    assert w2.train_page.start_over.isVisible()
    w2.reject()

    write_jsonl(data, [{"prompt": f"Spell the number {i}", "response": f"It is written {i}."} for i in range(40)])
    w3 = make_wizard(extra_args=["--precision", "bf16"])
    panel3 = to_train(qtbot, w3, data, "edited", steps=40)
    assert panel3.state == "paused" and panel3.pause_button.text() == "Resume"  # same settings: Resume is offered
    panel3.pause_button.click()
    qtbot.waitUntil(lambda: panel3.state != "running", timeout=TIMEOUT)
    assert panel3.state == "failed" and "changed since the checkpoint" in panel3.status.text(), panel3.status.text()
    assert "Press Resume" not in panel3.status.text()
    assert not [e for e in panel3.events if e["event"] == "progress"]
    assert json.loads(state.read_text())["step"] == paused_at
    assert panel3.pause_button.text() == "Start again" and panel3.pause_button.isEnabled()
    assert w3.train_page.start_over.isVisible()

    seen = len(panel3.events)
    panel3.pause_button.click()  # a fresh run on the file as it is now; it replaces the old checkpoint
    qtbot.waitUntil(lambda: any(e["event"] == "progress" for e in panel3.events[seen:]), timeout=TIMEOUT)
    fresh = [e for e in panel3.events[seen:] if e["event"] in ("loaded", "progress")]
    assert fresh[0]["event"] == "loaded" and fresh[0]["examples"] + fresh[0]["held_out"] == 40
    assert fresh[1]["step"] == 1
    panel3.runner.kill()
    qtbot.waitUntil(lambda: panel3.state != "running", timeout=TIMEOUT)
