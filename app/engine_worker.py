"""EngineWorker: the threads that call the Engine, and the FIFO queue of work waiting for them.

Every caller of the model goes through here: the window (through `EngineService`) and the local OpenAI server
(`app.server`). With `max_batch` 1, jobs run one at a time in the order they were submitted, so a long answer for
one client makes the next request wait instead of failing. With `max_batch` N > 1, up to N generations run at
once, each on its own thread: they take turns on the model between decode steps, and on packed int4 weights
their steps run as one (core.decode.joint), so a request that arrives while others decode joins the batch at
the next step. Plain jobs (loading a model, switching adapters) still run alone: they wait for the running
generations and hold back new ones. A generation is a `Generation` value; its events are handed to a
callback on the worker thread (the caller moves them to its own thread), and setting its `cancel` Event stops
it within one decode step, or before it starts when it is still queued. Adapters from the adapter library are
loaded here too, on the engine thread and without reloading the model: a request's skill adapter (its `skill`
option) before the request runs, the reasoning adapter when the user picks one. No Qt, no asyncio loop of its own.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from core.config import SamplingConfig
from core.events import Answer, DoneEvent, TokenEvent
from core.memory import release_free_memory

KINDS = ("stream", "parallel", "think_longer")


class EngineNotReady(RuntimeError):
    """No model is loaded (still loading, failed, or being switched)."""


class QueueFull(RuntimeError):
    """Too many requests are already waiting for the engine."""


@dataclass
class Generation:
    """One request for the engine: which call, its arguments, and the Event that cancels it."""

    kind: str
    """'stream' (one answer), 'parallel' (N answers and a vote) or 'think_longer'."""
    messages: object
    sampling: SamplingConfig | None = None
    options: dict = field(default_factory=dict)
    """Keyword arguments of the Engine call (mode, budget, answer_max_tokens, n, system, trace_key, ...)."""
    thinking: str = ""
    """think_longer only: the reply's stored trace."""
    cancel: threading.Event = field(default_factory=threading.Event)
    source: str = "window"
    """Who asked ('window', 'server'): kept in `EngineWorker.recent`."""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}")


@dataclass(frozen=True)
class JobRecord:
    """What became of a finished generation (for logs and tests)."""

    source: str
    finish_reason: str
    """The Answer's, or 'error'."""
    completion_tokens: int
    cancel_seen: bool
    """The request's cancel Event was set when the job ended."""
    waited_s: float
    """Time spent in the queue before the engine started on it."""
    ran_s: float


class _Gate:
    """Shared for generations, exclusive for plain jobs; a waiting plain job holds back new generations."""

    def __init__(self):
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @contextlib.contextmanager
    def shared(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive and not self._waiting)
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self):
        with self._cond:
            self._waiting += 1
            self._cond.wait_for(lambda: not self._exclusive and not self._shared)
            self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class EngineWorker:
    """Owns the Engine and the threads allowed to call it; a FIFO of jobs in front of them."""

    def __init__(self, engine=None, *, max_waiting: int = 64, max_batch: int = 1, name: str = "ponder-engine"):
        self.engine = engine
        """The loaded Engine (or None). Replaced by whoever loads a model, from a job on this worker."""
        self.max_waiting = max_waiting
        self.max_batch = max_batch
        """Generations that run at once (1: one at a time, first come first served)."""
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._pool = (ThreadPoolExecutor(max_workers=max_batch, thread_name_prefix=f"{name}-batch")
                      if max_batch > 1 else None)
        self._gate = _Gate()
        self._threads: int | None = None
        self.recent: deque[JobRecord] = deque(maxlen=32)
        self._lock = threading.Lock()
        self._queued = 0
        self._running = 0
        self._library = None

    @property
    def library(self):
        """The core.adapters.library.AdapterLibrary adapters are looked up in (the user's, by default)."""
        if self._library is None:
            from core.adapters.library import AdapterLibrary

            self._library = AdapterLibrary()
        return self._library

    @library.setter
    def library(self, library) -> None:
        self._library = library

    # --- plain jobs -----------------------------------------------------------------------------------
    def submit(self, fn: Callable, /, *args, **kwargs) -> Future:
        """Run `fn(*args, **kwargs)` on the engine thread after everything already queued (alone: no generation
        runs beside it)."""
        if self._pool is None:
            return self.executor.submit(fn, *args, **kwargs)
        return self.executor.submit(self._alone, fn, *args, **kwargs)

    def _alone(self, fn: Callable, /, *args, **kwargs):
        import torch

        with self._gate.exclusive():
            try:
                return fn(*args, **kwargs)
            finally:
                self._threads = torch.get_num_threads()  # set_threads on this thread: the batch threads follow

    @property
    def waiting(self) -> int:
        """Generations queued and not started yet."""
        return self._queued

    @property
    def busy(self) -> bool:
        """A generation is running or waiting."""
        return self._running > 0 or self._queued > 0

    # --- generations ----------------------------------------------------------------------------------
    def generate(self, gen: Generation, on_event: Callable[[TokenEvent | DoneEvent], None]) -> Future:
        """Queue `gen`; `on_event` is called on the worker thread for each event; the Future gives the Answer.

        Raises QueueFull when `max_waiting` generations are already queued."""
        with self._lock:
            if self._queued >= self.max_waiting:
                raise QueueFull(f"{self._queued} requests are already waiting for the model")
            self._queued += 1
        future = (self._pool or self.executor).submit(self._run, gen, on_event, time.perf_counter())
        future.add_done_callback(lambda f: f.cancelled() and self._dequeued())
        return future

    def _dequeued(self) -> None:
        with self._lock:
            self._queued -= 1

    # --- adapters (engine thread only) --------------------------------------------------------------------
    def _ready(self):
        if self.engine is None:
            raise EngineNotReady("The model is not loaded yet.")
        return self.engine

    def use_reasoning_adapter(self, name: str | None) -> str | None:
        """Make library adapter `name` the model's reasoning adapter; None: the model's own (its component
        folder, else the shipped one), or none when it has neither. Returns the name now reasoning.
        Raises AdapterError (unknown name, another model's adapter); the model is not reloaded."""
        engine = self._ready()
        if name is not None:
            card = self.library.get(engine.model_id, name)
        else:
            card = next((c for c in self.library.list(engine.model_id, kind="reasoning") if c.builtin), None)
        engine.use_reasoning_adapter(card)
        return engine.adapter_names().get("reasoning")

    def _events(self, gen: Generation):
        engine = self._ready()
        options = dict(gen.options)
        if options.get("skill"):  # looked up on every request: the engine loads each set of files once
            with getattr(engine, "model_lock", contextlib.nullcontext()):  # others may be decoding
                options["skill"] = engine.load_skill(self.library.get(engine.model_id, options["skill"]))
        else:
            options.pop("skill", None)
        if gen.kind == "think_longer":
            return engine.think_longer(gen.messages, gen.thinking, cancel=gen.cancel, **options)
        if gen.kind == "parallel":
            options.pop("trace_key", None)  # parallel answers keep no trace
            return engine.parallel(gen.messages, gen.sampling, cancel=gen.cancel, **options)
        return engine.stream(gen.messages, gen.sampling, cancel=gen.cancel, **options)

    def _run(self, gen: Generation, on_event, queued_at: float) -> Answer | None:
        if self._pool is None:
            return self._generate(gen, on_event, queued_at)
        import torch

        with self._gate.shared():
            if self._threads is not None and torch.get_num_threads() != self._threads:
                torch.set_num_threads(self._threads)
            return self._generate(gen, on_event, queued_at)

    def _generate(self, gen: Generation, on_event, queued_at: float) -> Answer | None:
        self._dequeued()
        with self._lock:
            self._running += 1
        started = time.perf_counter()
        answer, finish = None, "error"
        try:
            if gen.cancel.is_set():  # given up while it waited: nothing to compute
                finish = "cancelled"
                return None
            for event in self._events(gen):
                if isinstance(event, DoneEvent):
                    answer = event.answer
                on_event(event)
            finish = answer.finish_reason if answer is not None else "error"
            return answer
        finally:
            with self._lock:
                self._running -= 1
            release_free_memory(collect=False)  # a long prefill's freed buffers go back to the OS, not kept in RSS
            tokens = answer.stats.completion_tokens if answer is not None else 0
            self.recent.append(JobRecord(gen.source, finish, tokens, gen.cancel.is_set(), started - queued_at,
                                         time.perf_counter() - started))

    async def stream(self, gen: Generation) -> AsyncIterator[TokenEvent | DoneEvent]:
        """The events of `gen` on the running asyncio loop; leaving the loop early (or being cancelled)
        cancels the generation. Raises what the engine raised (PromptTooLong, ValueError, EngineNotReady)."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        end = object()

        def post(item) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                gen.cancel.set()

        future = self.generate(gen, post)
        future.add_done_callback(lambda _f: post(end))
        try:
            while True:
                item = await events.get()
                if item is end:
                    if not future.cancelled():
                        future.result()  # re-raise the engine's error, if any
                    return
                yield item
        finally:
            gen.cancel.set()
            future.cancel()

    def shutdown(self, wait: bool = True) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)
        self.executor.shutdown(wait=wait, cancel_futures=True)
