"""TrainWizard: from a data file to an adapter in the library, in five pages (Data → Recipe → Train → Concise
reasoning (reasoning adapters only) → Evaluate & save). Training runs in a `ponder train …` subprocess whose JSON
events drive the pages (ui.wizard_run), so the window stays responsive and a crash there cannot take it down.
Closing the wizard while a process runs asks to stop it; the process then checkpoints and exits on its own.
The wizard never loads a model: the data check and the name rules are app services, injected or looked up in
app.training_job."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtWidgets import QWizard

from ui.dialogs import ConfirmDialog
from ui.wizard_pages import DataPage, WizardState
from ui.wizard_recipe_page import RecipePage
from ui.wizard_train_pages import ConcisePage, EvaluatePage, TrainPage


def app_service(name: str) -> Callable:
    """`app.training_job.<name>`, called lazily so that the wizard opens even before the app provides it."""
    def call(*args, **kwargs):
        from app import training_job

        fn = getattr(training_job, name, None)
        if fn is None:
            raise RuntimeError(f"this build has no app.training_job.{name}")
        return fn(*args, **kwargs)

    return call


def default_check_data(path: Path, model_id: str, kind: str, max_tokens: int, csv_columns):
    """(DataReport, histogram bins) for `path`, tokenized with the installed `model_id`'s tokenizer."""
    return app_service("check_data")(path, model_id, kind=kind, max_tokens=max_tokens, csv_columns=csv_columns)


class TrainWizard(QWizard):
    DATA, RECIPE, TRAIN, CONCISE, EVALUATE = range(5)

    def __init__(self, parent=None, *, model_ids: list[str], current_model: str | None = None, library,
                 on_use: Callable | None = None, runs_dir: Path | None = None, extra_args: list[str] | None = None,
                 rl_args: list[str] | None = None,
                 check_data: Callable | None = None, validate_name: Callable[[str], str] | None = None):
        """`library` is an AdapterLibrary; `on_use(card)` is called by "Use in this chat"; `runs_dir` holds one
        run folder per adapter name (default: beside the library, `<data dir>/training`); `extra_args` go to
        every `ponder train` command, `rl_args` to `ponder train rl` only."""
        super().__init__(parent)
        self.setWindowTitle("Train an adapter")
        self.setOption(QWizard.WizardOption.NoBackButtonOnLastPage, True)
        self.setButtonText(QWizard.WizardButton.CommitButton, "Train")
        if runs_dir is None and getattr(library, "root", None) is not None:
            runs_dir = Path(library.root).parent / "training"
        model_ids = list(model_ids) or ([current_model] if current_model else [])
        self.state = WizardState(model_ids=model_ids, check_data=check_data or default_check_data,
                                 validate_name=validate_name or app_service("validate_adapter_name"),
                                 library=library, model_id=current_model or (model_ids[0] if model_ids else ""),
                                 runs_dir=Path(runs_dir) if runs_dir else None, extra_args=list(extra_args or []),
                                 rl_args=list(rl_args or []))
        self.data_page = DataPage(self.state)
        self.recipe_page = RecipePage(self.state)
        self.recipe_page.setCommitPage(True)
        self.train_page = TrainPage(self.state)
        self.concise_page = ConcisePage(self.state)
        self.evaluate_page = EvaluatePage(self.state, self.train_page, self.concise_page, on_use)
        for pid, page in ((self.DATA, self.data_page), (self.RECIPE, self.recipe_page), (self.TRAIN, self.train_page),
                          (self.CONCISE, self.concise_page), (self.EVALUATE, self.evaluate_page)):
            self.setPage(pid, page)
        self.setStartId(self.DATA)
        self.resize(760, 680)

    def panels(self):
        return (self.train_page.panel, self.concise_page.panel)

    @property
    def training(self) -> bool:
        return any(p.running for p in self.panels())

    def reject(self) -> None:
        """Cancel / Esc / the close button: a running training is stopped with its checkpoint kept, if confirmed."""
        if self.training:
            if not ConfirmDialog.ask(self, "Stop training?",
                                     "Training is still running. Stop it and close? The last checkpoint is kept, "
                                     "so you can resume this run later."):
                return
            for panel in self.panels():
                panel.stop("cancelled")
        self.recipe_page.runner.kill()  # an estimate saves nothing
        super().reject()
