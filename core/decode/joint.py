"""Joint decode steps: requests decoding at the same time share each fused step, all on one thread.

A decode step of one row reads every weight once; on a 2-core CPU that read, not the arithmetic, is most of the
step, so several rows cost little more than one (`bench.kernels`). `JointSteps.start(fn)` runs `fn` (one
request's whole generation: prefill, decode loop, answer) in a greenlet of the calling thread. When the request
needs a fused step it hands `(tokens, cache, adapter factors)` to `JointSteps.step` and parks; `advance()` runs
every parked step as one `FusedDecoder.step_many` and resumes each request with its logits, until it parks again
or ends. A request started while others decode prefills at once (the others wait, as they would for the model
lock) and joins the next step. Steps that cannot join (the module path: other weights than packed int4, sparse
feed-forward) still take turns, one step each (`turns`).

Why one thread and not a thread per request: torch and the int4 kernel parallelise with OpenMP, and libgomp keeps
a team of worker threads for every thread that has started parallel work. With more of those workers than CPUs it
stops spinning between parallel regions and sleeps, so every matmul pays a wake-up: on 2 cores a step from a
second thread took 13 ms instead of 9 (`bench/results/step_threads_*`). Greenlets keep every request's code as
it is and every parallel region on one thread.

Because the int4 kernel computes each row the same whatever the rows beside it and attention and adapters run per
request, a request's tokens are the same alone or joined (tests/core/test_joint_decode.py). A step asked for
outside `start` (a plain caller on any thread) runs alone under `model_lock`.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

import greenlet
import torch

from models import int4_kernel

MAX_ROWS = int4_kernel.CHUNKED_ROWS if int4_kernel.ENABLED else 64
"""Rows of one joint step at most: Ponder's int4 kernel's row-invariant range (models.int4_kernel.CHUNKED_ROWS)."""


@dataclass(eq=False)
class _Ticket:
    member: greenlet.greenlet
    tokens: torch.Tensor | None
    """None: a turn only (`JointSteps.turns`), no step to run."""
    cache: object = None
    lora: list | None = None
    alone: Callable[[torch.Tensor, object], torch.Tensor] | None = None
    """The step this request runs when no other joins it (the decoder's own, or its adapter's)."""
    logits: torch.Tensor | None = None
    error: BaseException | None = None
    rows: int = field(init=False)

    def __post_init__(self):
        self.rows = 0 if self.tokens is None else self.tokens.shape[0]


class JointSteps:
    """The requests decoding now on this thread (`start`), their parked steps, and the step that runs them."""

    def __init__(self, decoder, model_lock: threading.RLock, *, max_rows: int = MAX_ROWS):
        self.decoder, self.model_lock, self.max_rows = decoder, model_lock, max_rows
        self._members: dict[greenlet.greenlet, Future] = {}
        self._pending: list[_Ticket] = []
        self._thread: int | None = None
        self.steps = 0
        """Joint steps run so far."""
        self.joined_steps = 0
        """Of those, the steps that served more than one request."""

    @property
    def members(self) -> int:
        """Requests started and not finished."""
        return len(self._members)

    @property
    def parked(self) -> int:
        """Members waiting for the next `advance`."""
        return len(self._pending)

    def start(self, fn: Callable, /, *args, **kwargs) -> Future:
        """Begin `fn(*args, **kwargs)` as a member; it runs now, until its first step or its end. The Future gives
        its result or exception. Members are started and advanced from one thread, under `torch.inference_mode()`
        held for as long as any member runs (their own inference-mode blocks then nest instead of interleaving)."""
        if self._members and self._thread != threading.get_ident():
            raise RuntimeError("JointSteps members are started and advanced from one thread")
        if not torch.is_inference_mode_enabled():
            raise RuntimeError("JointSteps members run under torch.inference_mode()")
        self._thread = threading.get_ident()
        future: Future = Future()
        future.set_running_or_notify_cancel()

        def body():
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as err:  # handed to the Future, never thrown into the scheduler
                future.set_exception(err)
            finally:
                self._members.pop(greenlet.getcurrent(), None)

        member = greenlet.greenlet(body)
        self._members[member] = future
        member.switch()
        return future

    def step(self, tokens: torch.Tensor, cache, lora: list | None, alone: Callable) -> torch.Tensor:
        """This request's next-token logits after one step: run jointly when called from a member, else alone."""
        current = greenlet.getcurrent()
        if current not in self._members:
            with self.model_lock:
                return alone(tokens, cache)
        ticket = self._park(_Ticket(current, tokens, cache, lora, alone))
        if ticket.error is not None:
            raise ticket.error
        return ticket.logits

    def turns(self, events: Iterator) -> Iterator:
        """`events` (a decode loop whose steps take the module path, which cannot join) yielding to the other
        members after each event, so that requests still take turns step by step."""
        for event in events:
            yield event
            current = greenlet.getcurrent()
            if current in self._members:
                self._park(_Ticket(current, None))

    def _park(self, ticket: _Ticket) -> _Ticket:
        self._pending.append(ticket)
        ticket.member.parent.switch()  # back to whoever started or advanced us; resumed by `advance`
        return ticket

    def advance(self) -> int:
        """Run every parked step (in groups of up to `max_rows` rows, first come first) and resume their members,
        each until its next step or its end. Returns the steps' rows."""
        tickets, self._pending = self._pending, []
        rows = 0
        for group in _groups([t for t in tickets if t.tokens is not None], self.max_rows):
            try:
                with self.model_lock:
                    if len(group) == 1:
                        results = [group[0].alone(group[0].tokens, group[0].cache)]
                    else:
                        results = self.decoder.step_many([(t.tokens, t.cache, t.lora) for t in group])
                for t, logits in zip(group, results, strict=True):
                    t.logits = logits
            except Exception as err:  # every request of the step sees the failure
                for t in group:
                    t.error = err
            self.steps += 1
            self.joined_steps += len(group) > 1
            rows += sum(t.rows for t in group)
        for t in tickets:
            t.member.switch()
        return rows


def _groups(tickets: list[_Ticket], max_rows: int) -> list[list[_Ticket]]:
    groups, rows = [[]], 0
    for t in tickets:
        if groups[-1] and rows + t.rows > max_rows:
            groups.append([])
            rows = 0
        groups[-1].append(t)
        rows += t.rows
    return [g for g in groups if g]


def run_together(joint: JointSteps, calls: list[Callable]) -> list[Future]:
    """Start every call as a member of `joint` and advance until all have ended (on this thread)."""
    with torch.inference_mode():
        futures = [joint.start(call) for call in calls]
        while joint.parked:
            joint.advance()
    return futures


class JointStep:
    """One request's fused step through `JointSteps` (what decode_rows calls): `single` is the decoder's step or
    an adapter's (core.decode.fused), `single.lora` the adapter's factors it contributes to a joint step."""

    def __init__(self, joint: JointSteps, single):
        self.joint, self.single = joint, single
        self.lora = getattr(single, "lora", None)
        self.takes = joint.decoder.takes

    def step(self, tokens: torch.Tensor, cache) -> torch.Tensor:
        return self.joint.step(tokens, cache, self.lora, self.single.step)
