"""EngineWorker: the one thread that runs the Engine, and the FIFO queue of work waiting for it.

Every caller of the model goes through here: the window (through `EngineService`) and the local OpenAI server
(`app.server`). With `max_batch` 1, jobs run one at a time in the order they were submitted, so a long answer for
one client makes the next request wait instead of failing. With `max_batch` N > 1, up to N generations run at
once on the engine thread, each in a greenlet: they take turns on the model between decode steps, and on packed
int4 weights their steps run as one (core.decode.joint), so a request that arrives while others decode joins the
batch at the next step. Plain jobs (loading a model, switching adapters) still run alone: they wait for the
running generations and hold back new ones. All model work stays on one thread because torch's and the int4
kernel's OpenMP teams are per thread, and more than one on 2 cores makes every matmul slower (core.decode.joint).
A generation is a `Generation` value; its events are handed to a callback on the engine thread (the caller moves
them to its own thread), and setting its `cancel` Event stops it within one decode step, or before it starts when
it is still queued. Adapters from the adapter library are loaded here too, on the engine thread and without
reloading the model: a request's skill adapter (its `skill` option) before the request runs, the reasoning adapter
when the user picks one. No Qt, no asyncio loop of its own.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor, Future
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


@dataclass(eq=False)
class _Plain:
    fn: Callable
    args: tuple
    kwargs: dict
    future: Future = field(default_factory=Future)


@dataclass(eq=False)
class _Gen:
    gen: Generation
    on_event: Callable
    queued_at: float
    future: Future = field(default_factory=Future)


class _EngineExecutor(Executor):
    """The engine thread as a concurrent.futures Executor (for `loop.run_in_executor`): plain jobs."""

    def __init__(self, worker: EngineWorker):
        self._worker = worker

    def submit(self, fn, /, *args, **kwargs) -> Future:
        return self._worker.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._worker.shutdown(wait)


class EngineWorker:
    """Owns the Engine and the one thread allowed to run it; a FIFO of jobs in front of it."""

    def __init__(self, engine=None, *, max_waiting: int = 64, max_batch: int = 1, name: str = "ponder-engine"):
        self.engine = engine
        """The loaded Engine (or None). Replaced by whoever loads a model, from a job on this worker."""
        self.max_waiting = max_waiting
        self.max_batch = max_batch
        """Generations that run at once (1: one at a time, first come first served)."""
        self.executor = _EngineExecutor(self)
        """The engine thread as an Executor (plain jobs), for `loop.run_in_executor`."""
        self.recent: deque[JobRecord] = deque(maxlen=32)
        self._cond = threading.Condition()
        self._jobs: deque[_Plain | _Gen] = deque()
        self._queued = 0
        self._running = 0
        self._stopping = False
        self._library = None
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

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

    # --- queueing (any thread) ---------------------------------------------------------------------------
    def submit(self, fn: Callable, /, *args, **kwargs) -> Future:
        """Run `fn(*args, **kwargs)` on the engine thread after everything already queued, alone: it waits for
        the generations running and holds back the ones queued after it."""
        job = _Plain(fn, args, kwargs)
        self._enqueue(job)
        return job.future

    def generate(self, gen: Generation, on_event: Callable[[TokenEvent | DoneEvent], None]) -> Future:
        """Queue `gen`; `on_event` is called on the engine thread for each event; the Future gives the Answer.

        Raises QueueFull when `max_waiting` generations are already queued."""
        with self._cond:
            if self._queued >= self.max_waiting:
                raise QueueFull(f"{self._queued} requests are already waiting for the model")
            self._queued += 1
        job = _Gen(gen, on_event, time.perf_counter())
        self._enqueue(job)
        return job.future

    def _enqueue(self, job) -> None:
        with self._cond:
            if self._stopping:
                raise RuntimeError("the engine worker is shut down")
            self._jobs.append(job)
            self._cond.notify_all()

    @property
    def waiting(self) -> int:
        """Generations queued and not started yet."""
        return self._queued

    @property
    def busy(self) -> bool:
        """A generation is running or waiting."""
        return self._running > 0 or self._queued > 0

    # --- the engine thread ----------------------------------------------------------------------------------
    def _next(self, active: int) -> list:
        """The jobs to start now: generations from the head of the queue while fewer than `max_batch` run, or
        one plain job at the head once none runs. Blocks while there is nothing to do."""
        with self._cond:
            while not self._jobs and not active and not self._stopping:
                self._cond.wait()
            taken: list = []
            while self._jobs:
                head = self._jobs[0]
                if isinstance(head, _Gen) and active + len(taken) < self.max_batch:
                    taken.append(self._jobs.popleft())
                    self._queued -= 1
                elif isinstance(head, _Plain) and not active and not taken:
                    taken.append(self._jobs.popleft())
                    break
                else:
                    break
            return taken

    def _serve(self) -> None:
        """The engine thread: every model call of the process runs here (one OpenMP team: core.decode.joint)."""
        import torch

        active: set[Future] = set()
        while True:
            jobs = self._next(len(active))
            if not jobs and not active and self._stopping:
                return
            for job in jobs:
                if not job.future.set_running_or_notify_cancel():
                    continue  # cancelled while it waited
                if isinstance(job, _Plain):
                    try:
                        job.future.set_result(job.fn(*job.args, **job.kwargs))
                    except BaseException as err:
                        job.future.set_exception(err)
                    continue
                with torch.inference_mode():  # held across members' switches: core.decode.joint
                    member = self._start(job)
                if member is not None:
                    active.add(member)
                    member.add_done_callback(active.discard)
            engine = self.engine
            if active and engine is not None and engine.joint.parked:
                with torch.inference_mode():
                    engine.joint.advance()

    def _start(self, job: _Gen) -> Future | None:
        """Begin `job` as a member of the engine's joint steps (it runs until its first step); None when it ended
        at once (no model, a cancelled or module-path generation)."""

        def run():
            try:
                job.future.set_result(self._generate(job.gen, job.on_event, job.queued_at))
            except BaseException as err:  # the caller's Future carries it
                job.future.set_exception(err)

        engine = self.engine
        if engine is None or getattr(engine, "joint", None) is None:  # no model: the error reaches the Future
            run()
            return None
        member = engine.joint.start(run)
        return None if member.done() else member

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

    def _generate(self, gen: Generation, on_event, queued_at: float) -> Answer | None:
        with self._cond:
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
            with self._cond:
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

    def shutdown(self, wait: bool = True, timeout: float | None = None) -> bool:
        """Cancel what is queued, let the running job end, stop the thread (joined when `wait`, for at most
        `timeout` seconds). True when the thread has ended; False when a job still runs on it (a model load
        inside a library call): the thread is a daemon, left to finish that step alone."""
        with self._cond:
            self._stopping = True
            for job in self._jobs:
                job.future.cancel()
                self._queued -= isinstance(job, _Gen)
            self._jobs.clear()
            self._cond.notify_all()
        if wait and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        return not self._thread.is_alive()
