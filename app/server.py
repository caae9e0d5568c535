"""The local OpenAI-compatible server: Starlette routes (`/v1/chat/completions`, `/v1/completions`,
`/v1/models`) over an `EngineWorker`, served by uvicorn.

Requests queue on the worker's one engine thread (shared with the window when the server runs inside the app),
so a long answer makes the next request wait, never fail. A client that disconnects, streaming or not, sets
its request's cancel Event at once; the engine stops within one decode step, or skips the request if it was
still queued. Local by default (127.0.0.1); every request first passes `app.server_guard` (Host, Origin,
Content-Type), and an API key (`Authorization: Bearer`) is optional on loopback and required elsewhere. The wire
format lives in `app.openai_schema`; this module knows HTTP, not the engine's internals.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from core.engine import PromptTooLong
from core.events import DoneEvent, TokenEvent

from . import openai_schema as schema
from .engine_worker import EngineNotReady, EngineWorker, Generation, QueueFull
from .openai_schema import ApiError, Limits
from .server_guard import Guard, is_loopback
from .server_protocol import GuardedH11Protocol

log = logging.getLogger(__name__)
API_KEY_ENV = "PONDER_API_KEY"


def _engine_error(err: Exception) -> ApiError:
    if isinstance(err, ApiError):
        return err
    if isinstance(err, PromptTooLong):
        return ApiError(400, str(err), param="messages", code="context_length_exceeded")
    if isinstance(err, EngineNotReady):
        return ApiError(503, str(err), type="server_error", code="model_not_ready")
    if isinstance(err, QueueFull):
        return ApiError(503, f"The server is busy: {err}. Retry later.", type="server_error", code="server_busy")
    if isinstance(err, ValueError):
        return ApiError(400, str(err), code="invalid_value")
    log.exception("generation failed", exc_info=err)
    return ApiError(500, f"The model failed: {err}", type="server_error", code="internal_error")


async def _watch_disconnect(request: Request, cancel: threading.Event) -> None:
    """Set `cancel` when the client goes away (uvicorn answers `receive()` with http.disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            cancel.set()
            return


def _sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)}\n\n"


class OpenAIApi:
    """The route handlers; `worker` runs the engine, `api_key` (when set) is required on every request."""

    def __init__(self, worker: EngineWorker, *, api_key: str | None = None, limits: Limits = Limits()):
        self.worker, self.api_key, self.limits = worker, api_key or None, limits

    def _authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        token = given[7:].strip() if given[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(token.encode(), self.api_key.encode()):
            raise ApiError(401, "Incorrect or missing API key (send 'Authorization: Bearer KEY').",
                           code="invalid_api_key")

    async def _body(self, request: Request) -> bytes:
        limit = self.limits.max_body_bytes
        declared = request.headers.get("content-length", "")
        too_large = ApiError(413, f"The request body is larger than {limit} bytes.", code="request_too_large")
        if declared.isdigit() and int(declared) > limit:
            raise too_large
        chunks, size = [], 0
        try:
            async with asyncio.timeout(self.limits.body_timeout_s):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise too_large
                    chunks.append(chunk)
        except TimeoutError:
            raise ApiError(408, f"The request body did not arrive within {self.limits.body_timeout_s:g} s.",
                           code="request_timeout") from None
        except ClientDisconnect:  # nobody is left to answer: an error response, no traceback in the log
            raise ApiError(400, "The client closed the connection before sending the whole body.",
                           code="client_disconnected") from None
        return b"".join(chunks)

    def _engine(self, model: str | None = None):
        engine = self.worker.engine
        if engine is None:
            raise ApiError(503, "The model is not loaded yet.", type="server_error", code="model_not_ready")
        if model is not None and model != engine.model_id:
            raise ApiError(404, f"The model '{model}' does not exist; this server has '{engine.model_id}'.",
                           param="model", code="model_not_found")
        return engine

    async def models(self, request: Request) -> JSONResponse:
        self._authorize(request)
        engine = self.worker.engine
        data = [] if engine is None else [{
            "id": engine.model_id, "object": "model", "created": 0, "owned_by": "ponder",
            "ponder": {"can_reason": engine.can_reason, "context": engine.context,
                       "verifier": getattr(engine, "verifier", None) is not None}}]
        return JSONResponse({"object": "list", "data": data})

    async def chat_completions(self, request: Request):
        return await self._generate(request, chat=True)

    async def completions(self, request: Request):
        return await self._generate(request, chat=False)

    async def _generate(self, request: Request, *, chat: bool):
        self._authorize(request)
        req = schema.parse(schema.ChatRequest if chat else schema.CompletionRequest, await self._body(request))
        engine = self._engine(req.model)
        gen = schema.to_generation(req, self.limits, can_reason=engine.can_reason)
        events = self.worker.stream(gen)
        watcher = asyncio.create_task(_watch_disconnect(request, gen.cancel))
        try:  # wait for the first event, so that errors found before any text get their own HTTP status
            first = await anext(events, None)
        except Exception as err:
            watcher.cancel()
            await events.aclose()
            raise _engine_error(err) from None
        if req.stream:
            return StreamingResponse(self._stream(req, gen, first, events, watcher, chat),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        try:
            answer = await self._collect(first, events)
        except Exception as err:
            raise _engine_error(err) from None
        finally:
            watcher.cancel()
            await events.aclose()
        if answer is None:  # the client left before it was answered: nobody reads this
            raise ApiError(499, "The request was cancelled.", code="cancelled")
        build = schema.chat_completion if chat else schema.completion
        return JSONResponse(build(answer, req, engine.model_id))

    @staticmethod
    async def _collect(first, events: AsyncIterator):
        event = first
        while event is not None:
            if isinstance(event, DoneEvent):
                return event.answer
            event = await anext(events, None)
        return None

    async def _stream(self, req, gen: Generation, first, events: AsyncIterator, watcher: asyncio.Task,
                      chat: bool) -> AsyncIterator[str]:
        cid, created = schema.new_id("chatcmpl" if chat else "cmpl"), int(time.time())
        model = self.worker.engine.model_id if self.worker.engine is not None else req.model
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices: list[dict], **extra) -> str:
            return _sse({"id": cid, "object": obj, "created": created, "model": model, "choices": choices, **extra})

        try:
            if chat:
                yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None,
                              "logprobs": None} for i in range(req.n)])
            event = first
            while event is not None:
                if isinstance(event, TokenEvent) and event.text:
                    yield chunk([schema.token_delta(event, chat)])
                elif isinstance(event, DoneEvent):
                    answer = event.answer
                    yield chunk(schema.final_deltas(answer, chat))
                    include_usage = req.stream_options is not None and req.stream_options.include_usage
                    yield chunk([], ponder=schema.ponder_extension(answer, req.vote),
                                usage=schema.usage(answer) if include_usage else None)
                event = await anext(events, None)
        except Exception as err:  # after the headers went out, an error can only be a last event
            yield _sse(_engine_error(err).body())
        finally:
            watcher.cancel()
            gen.cancel.set()  # no-op when finished; stops the engine when the client left mid-answer
            await events.aclose()
        yield _sse("[DONE]")


async def _api_error(request: Request, err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


async def _http_error(request: Request, err: HTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code)
    return JSONResponse(ApiError(err.status_code, str(err.detail), code=code).body(), status_code=err.status_code)


async def _server_error(request: Request, err: Exception) -> JSONResponse:
    log.exception("request failed", exc_info=err)
    body = ApiError(500, "Internal server error.", type="server_error", code="internal_error").body()
    return JSONResponse(body, status_code=500)


def create_app(worker: EngineWorker, *, api_key: str | None = None, limits: Limits = Limits()) -> Starlette:
    """The ASGI app serving `worker`'s engine (without the guard: `LocalServer` adds it)."""
    api = OpenAIApi(worker, api_key=api_key, limits=limits)
    routes = [
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={ApiError: _api_error, HTTPException: _http_error,
                                                        Exception: _server_error})


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0 picks a free one); raises OSError when it is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)  # from here connections wait in the backlog: `ponder serve` says "Serving" before uvicorn
        # has started, and a client that connects at once was refused (seen under load)
    except OSError:
        sock.close()
        raise
    return sock


class LocalServer:
    """uvicorn serving `create_app(worker)`: on its own thread and asyncio loop (`start`/`stop`, used inside
    the app and in tests) or in the calling thread (`run`, for `ponder serve`, where Ctrl+C stops it)."""

    def __init__(self, worker: EngineWorker, *, host: str = "127.0.0.1", port: int = 8080, api_key: str | None = None,
                 limits: Limits = Limits(), log_level: str = "warning", allow_hosts: tuple[str, ...] = (),
                 allow_origins: tuple[str, ...] = ()):
        if not api_key and not is_loopback(host):
            raise ValueError(f"Listening on {host or 'every address'} needs an API key (--api-key or "
                             f"{API_KEY_ENV}): anyone who can reach this computer could use the model.")
        self.host, self.api_key = host, api_key
        self._sock = bind(host, port)
        self.port = self._sock.getsockname()[1]
        app = Guard(create_app(worker, api_key=api_key, limits=limits), bound_host=host, allow_hosts=allow_hosts,
                    allow_origins=allow_origins)
        config = uvicorn.Config(app, http=GuardedH11Protocol, log_level=log_level, timeout_graceful_shutdown=2,
                                lifespan="off", proxy_headers=False, server_header=False)
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run(self) -> None:
        """Serve in this thread until stopped (a signal when this is the main thread)."""
        self._server.run(sockets=[self._sock])

    def start(self, timeout: float = 10.0) -> None:
        """Serve on a background thread; returns once it accepts connections."""
        self._thread = threading.Thread(target=self.run, name="ponder-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise OSError(f"the server on {self.host}:{self.port} did not start")
            time.sleep(0.01)

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self._sock.close()


class InAppServer:
    """The window's switch: the server on 127.0.0.1:port over the window's engine worker, or off; the same guard
    as `ponder serve` (origins allowed by PONDER_ALLOW_ORIGINS, comma-separated)."""

    def __init__(self, worker: EngineWorker):
        self.worker = worker
        self.server: LocalServer | None = None

    @property
    def url(self) -> str | None:
        return self.server.url if self.server is not None else None

    def apply(self, on: bool, port: int) -> str | None:
        """Start, stop or move the server; returns its URL when it runs. Raises OSError when the port is taken."""
        if self.server is not None and (not on or self.server.port != port):
            self.stop()
        if on and self.server is None:
            origins = tuple(os.environ.get("PONDER_ALLOW_ORIGINS", "").split(","))
            server = LocalServer(self.worker, port=port, api_key=os.environ.get(API_KEY_ENV) or None,
                                 allow_origins=origins)
            try:
                server.start()
            except OSError:
                server.stop()
                raise
            self.server = server
        return self.url

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
