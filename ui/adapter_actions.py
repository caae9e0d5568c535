"""`AdapterActions`, the main window's adapter part (mixed into MainWindow): it applies what the Adapters dialog
(ui.adapters_dialog) and the training wizard choose: the chat's skill adapter (composer and chat store), each
model's reasoning adapter (settings, applied on load and on change without reloading the model), and it opens the
dialog and the training wizard.
"""
from __future__ import annotations

from app.settings import AppSettings, with_reasoning_adapter

from .adapters_dialog import AdaptersDialog

NO_REASONING = ("This model has no reasoning adapter — train one (Tools ▸ Train an adapter…) or import one "
                "(Tools ▸ Adapters…).")


class AdapterActions:
    """The main window's adapter features; needs its service, controller, settings, composer, status, spawn."""

    adapters_dialog: AdaptersDialog | None = None
    train_wizard = None

    def skill_names(self) -> list[str] | None:
        """The loaded model's skill adapters in the library (None while no model is ready)."""
        if not self.service.ready:
            return None
        try:
            return [c.name for c in self.service.library.list(self.service.model_name, kind="skill")]
        except Exception as err:  # an unreadable library: the chat answers without an adapter
            self.status.setText(f"The adapter library could not be read: {err}")
            return []

    def refresh_adapters(self, *_args) -> None:
        """The composer's adapter choice for the open chat; a chat whose adapter is gone answers without it."""
        names, name = self.skill_names(), self.controller.adapter
        if names is not None and name and name not in names:
            self.controller.set_adapter(None, remember=False)  # kept with the chat: back if the adapter is
            self.status.setText(f"This chat's adapter “{name}” is not in the library for "  # re-imported
                                f"{self.service.model_name}; the chat answers without it.")
            name = None
        self.composer.set_adapters(names or [], name)
        if self.adapters_dialog is not None:
            self.adapters_dialog.show_state(self.service.model_name, self.service.adapter_names().get("reasoning"),
                                            self.controller.adapter)

    def choose_skill(self, name: str | None) -> None:
        self.controller.set_adapter(name)
        self.refresh_adapters()
        self.status.setText(f"This chat answers with the adapter “{name}”." if name
                            else "This chat answers without a skill adapter.")

    def choose_reasoning(self, name: str | None) -> None:
        """Make library adapter `name` the loaded model's reasoning adapter (None: its own), remembered."""
        model = self.service.model_name
        if not self.service.ready:  # remembered: applied when the model has loaded
            self._save_settings(with_reasoning_adapter(self.settings, model, name))
            self.status.setText(f"{model} will reason with “{name or 'its own adapter'}” once it has loaded.")
            return

        async def run():
            if await self.service.set_reasoning_adapter(name):
                self._save_settings(with_reasoning_adapter(self.settings, model, name))
                now = self.service.adapter_names().get("reasoning")
                self.status.setText(f"{model} now reasons with “{now}” (no reload needed)." if now
                                    else f"{model} has no reasoning adapter now. {NO_REASONING}")

        self.spawn(run())

    def apply_reasoning_adapter(self) -> None:
        """On load: the reasoning adapter chosen for this model, when it is not the one loaded (no reload)."""
        model = self.service.model_name
        name = self.settings.reasoning_adapters.get(model)
        if name is None or self.service.adapter_names().get("reasoning") == name:
            return

        async def run():
            if await self.service.set_reasoning_adapter(name):
                self.status.setText(f"Ready — {model}, reasoning with “{name}”")
            else:  # gone or broken: forgotten, and the status bar says why
                self._save_settings(with_reasoning_adapter(self.settings, model, None))
                self.status.setText(f"{self.status.text()} — {model} reasons with its own adapter instead.")

        self.spawn(run())

    def _save_settings(self, settings: AppSettings) -> None:
        self.settings = settings
        self.controller.save_settings(settings)

    def on_adapters_changed(self) -> None:
        self.update_reasoning_available()
        self.refresh_adapters()
        self.render()

    def on_adapter_renamed(self, old: str, new: str) -> None:
        model = self.service.model_name
        self.controller.rename_adapter(old, new)
        if self.settings.reasoning_adapters.get(model) == old or self.service.adapter_names().get("reasoning") == old:
            self.choose_reasoning(new)
        self.refresh_adapters()

    def on_adapter_removed(self, name: str) -> None:
        model = self.service.model_name
        self.controller.rename_adapter(name, None)
        if self.settings.reasoning_adapters.get(model) == name or self.service.adapter_names().get("reasoning") == name:
            self.choose_reasoning(None)
        self.refresh_adapters()

    def use_adapter(self, card) -> None:
        """The wizard's "use it": a skill answers in this chat, a reasoning adapter reasons for its model."""
        if card.base_model != self.service.model_name:
            if card.kind == "reasoning":
                self._save_settings(with_reasoning_adapter(self.settings, card.base_model, card.name))
            self.status.setText(f"“{card.name}” is for {card.base_model}: switch to that model (Tools ▸ Models) "
                                "to use it.")
        elif card.kind == "reasoning":
            self.choose_reasoning(card.name)
        else:
            self.choose_skill(card.name)

    def open_adapters(self) -> None:
        if self.adapters_dialog is None:
            d = self.adapters_dialog = AdaptersDialog(self.service.library, self.service.model_name, self)
            d.trainRequested.connect(self.open_train_wizard)
            d.reasoningChosen.connect(self.choose_reasoning)
            d.skillChosen.connect(self.choose_skill)
            d.renamed.connect(self.on_adapter_renamed)
            d.removed.connect(self.on_adapter_removed)
            d.libraryChanged.connect(self.refresh_adapters)
        self.refresh_adapters()
        self.adapters_dialog.show()
        self.adapters_dialog.raise_()

    def open_train_wizard(self) -> None:
        try:
            from .train_wizard import TrainWizard
        except ImportError as err:
            self.status.setText(f"The training wizard is not available in this build ({err}).")
            return
        if self.model_service is None:
            from app.model_service import ModelService

            self.model_service = ModelService(active_id=self.service.model_name)
        ids = [r.id for r in self.model_service.rows() if r.installed] or [self.service.model_name]
        self.train_wizard = TrainWizard(self, model_ids=ids, current_model=self.service.model_name,
                                        library=self.service.library, on_use=self.use_adapter)
        self.train_wizard.show()
