"""Joint decode steps: requests decoding at the same time on their own threads share each fused step.

A decode step of one row reads every weight once; on a 2-core CPU that read, not the arithmetic, is most of the
step, so several rows cost little more than one (`bench.kernels`). Each request keeps its own cache, rows and
thread (its own `decode_rows` loop); when it needs a fused step it hands `(tokens, cache, adapter factors)` to
`JointSteps.step` and waits. One of the waiting threads, the leader, runs every request handed in as one
`FusedDecoder.step_many` and gives each its logits. A request that starts while others decode prefills under the
model lock between two steps and joins the next one.

The leader runs as soon as every member has handed in its step, or after `wait_s` when one is busy elsewhere
(sampling, a module-path step, a verifier pass). Because the int4 kernel computes each row the same whatever the
rows beside it and attention and adapters run per request, a request's tokens are the same alone or joined
(tests/core/test_joint_decode.py). `model_lock` serialises everything else that runs the model (prefills,
module-path steps, adapter switches) with the joint steps.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

MAX_ROWS = 64
"""Rows of one joint step at most (the int4 kernel's row-invariant range, models.int4_kernel.CHUNKED_ROWS)."""


@dataclass(eq=False)
class _Ticket:
    tokens: torch.Tensor
    cache: object
    lora: list | None
    alone: Callable[[torch.Tensor, object], torch.Tensor]
    """The step this request runs when no other joins it (the decoder's own, or its adapter's)."""
    logits: torch.Tensor | None = None
    error: BaseException | None = None
    done: bool = False
    rows: int = field(init=False)

    def __post_init__(self):
        self.rows = self.tokens.shape[0]


class JointSteps:
    """The fused steps of every request decoding now, run together; `member(events)` wraps one request's loop."""

    def __init__(self, decoder, model_lock: threading.RLock, *, wait_s: float = 0.01, max_rows: int = MAX_ROWS):
        self.decoder, self.model_lock, self.wait_s, self.max_rows = decoder, model_lock, wait_s, max_rows
        self._cond = threading.Condition()
        self._members = 0
        self._pending: list[_Ticket] = []
        self._leading = False
        self.steps = 0
        """Joint steps run so far."""
        self.joined_steps = 0
        """Of those, the steps that served more than one request."""

    @property
    def members(self) -> int:
        return self._members

    def member(self, events: Iterator) -> Iterator:
        """`events` (a decode loop) counted as a member while it runs, so the leader knows whom to wait for."""
        with self._cond:
            self._members += 1
        try:
            yield from events
        finally:
            with self._cond:
                self._members -= 1
                self._cond.notify_all()

    def step(self, tokens: torch.Tensor, cache, lora: list | None, alone: Callable) -> torch.Tensor:
        """This request's next-token logits after one step, run jointly with the other members' steps."""
        ticket = _Ticket(tokens, cache, lora, alone)
        with self._cond:
            self._pending.append(ticket)
            self._cond.notify_all()
            deadline = time.monotonic() + self.wait_s
            while not ticket.done:
                ready = len(self._pending) >= max(1, self._members) or time.monotonic() >= deadline
                if not self._leading and self._pending and ready:
                    self._lead()
                    continue
                self._cond.wait(None if self._leading else max(0.0, deadline - time.monotonic()))
        if ticket.error is not None:
            raise ticket.error
        return ticket.logits

    def _lead(self) -> None:
        """Run the pending steps (up to max_rows rows, first come first): called with the condition held."""
        batch, rows = [], 0
        for t in self._pending:
            if batch and rows + t.rows > self.max_rows:
                break
            batch.append(t)
            rows += t.rows
        del self._pending[: len(batch)]
        self._leading = True
        self._cond.release()
        try:
            with self.model_lock:
                if len(batch) == 1:
                    results = [batch[0].alone(batch[0].tokens, batch[0].cache)]
                else:
                    results = self.decoder.step_many([(t.tokens, t.cache, t.lora) for t in batch])
            for t, logits in zip(batch, results, strict=True):
                t.logits = logits
        except BaseException as err:  # every request of the step sees the failure
            for t in batch:
                t.error = err
        finally:
            self._cond.acquire()
            self._leading = False
            self.steps += 1
            self.joined_steps += len(batch) > 1
            for t in batch:
                t.done = True
            self._cond.notify_all()


class JointStep:
    """One request's fused step through `JointSteps` (what decode_rows calls): `single` is the decoder's step or
    an adapter's (core.decode.fused), `single.lora` the adapter's factors it contributes to a joint step."""

    def __init__(self, joint: JointSteps, single):
        self.joint, self.single = joint, single
        self.lora = getattr(single, "lora", None)
        self.takes = joint.decoder.takes

    def step(self, tokens: torch.Tensor, cache) -> torch.Tensor:
        return self.joint.step(tokens, cache, self.lora, self.single.step)
