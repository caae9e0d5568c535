"""uvicorn's h11 protocol with the two limits it lacks: a deadline for each request's head, and a cap on one
client's open connections.

uvicorn waits forever for a request that never comes: a client that opens connections and sends nothing, or its
headers a byte at a time, holds them, and a few hundred such connections lock everyone out (the API key and the
Guard only see a request once its head has arrived). Here a connection whose request head is not complete within
`HEAD_TIMEOUT_S` of its first byte (or of the connection, for the first request) is closed, and a client address
may hold at most `MAX_CONNECTIONS_PER_CLIENT` connections at once. Slow bodies are the app's to refuse
(`Limits.body_timeout_s`).
"""
from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT_S = 10.0
MAX_CONNECTIONS_PER_CLIENT = 32


class GuardedH11Protocol(H11Protocol):
    head_timeout_s = HEAD_TIMEOUT_S
    max_per_client = MAX_CONNECTIONS_PER_CLIENT

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        host = self.client[0] if self.client else None
        same = sum(1 for c in self.connections if (c.client[0] if c.client else None) == host)
        if same > self.max_per_client:
            self.logger.warning("refusing a connection: %s already holds %d", host, self.max_per_client)
            transport.close()
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle:  # a request head arrived: the app's own limits take over
            self._disarm()
        elif self._head_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # the next request on a kept-alive connection has begun to arrive

    def _arm(self) -> None:
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _disarm(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()
