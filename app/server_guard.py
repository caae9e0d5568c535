"""What a web page must not be able to do to the local server: the checks every request passes first.

A page open in the user's browser can send requests to 127.0.0.1. Three rules stop it (as Ollama's fix for
CVE-2024-28224 and llama.cpp's server do):
- `Host` must name this computer (localhost, a loopback address, the bound address, or `allow_hosts`): a
  DNS-rebinding page reaches the server under its own domain name, and is refused.
- A browser's cross-site request carries `Origin`; only this computer's origins (any port) and `allow_origins`
  (`*` allows all) pass. Allowed origins get CORS headers, so a local web UI can call the API.
- POSTs must be `application/json`: a page can send `text/plain` or form bodies cross-site without asking first.
Everything refused is answered in OpenAI's error format with the reason. An API key, required off loopback,
is checked by the routes (`app.server`).
"""
from __future__ import annotations

import ipaddress
import json
import re
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from .openai_schema import ApiError

WILDCARD = ("0.0.0.0", "::", "")
HEADER_LIST = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+(\s*,\s*[A-Za-z0-9!#$%&'*+.^_`|~-]+)*\s*")
"""A preflight's requested header names (HTTP tokens, comma-separated): echoed back for an allowed origin."""


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def host_name(value: str) -> str:
    """The host part of a Host header ('[::1]:8080' -> '::1', 'Example.com.:80' -> 'example.com'); anything after
    a bracketed address other than a port keeps the whole value (so it names no loopback address)."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        rest = value[end + 1:] if end != -1 else "?"
        return value[1:end] if rest == "" or (rest.startswith(":") and rest[1:].isdigit()) else value
    host = value.rsplit(":", 1)[0] if value.count(":") == 1 else value
    return host[:-1] if host.endswith(".") else host


class Guard:
    """ASGI middleware around the API app; refuses what a web page could send before any route runs."""

    def __init__(self, app, *, bound_host: str = "127.0.0.1", allow_hosts: Iterable[str] = (),
                 allow_origins: Iterable[str] = ()):
        self.app = app
        self.bound_host = bound_host.strip("[]").lower()
        self.allow_hosts = {host_name(h) for h in allow_hosts if h.strip()}  # 'name:port' allows 'name'
        self.allow_origins = {o.strip().rstrip("/").lower() for o in allow_origins if o.strip()}
        self.names = {socket.gethostname().lower(), socket.getfqdn().lower()} if self.bound_host in WILDCARD else set()

    def host_allowed(self, value: str) -> bool:
        host = host_name(value)
        if not host:
            return False
        if is_loopback(host) or host == self.bound_host or host in self.allow_hosts:
            return True
        # Bound to every interface: this machine's addresses are reached by IP or by its own name. A
        # rebinding page always uses a domain name, so IP literals are safe to accept.
        return self.bound_host in WILDCARD and (_is_ip(host) or host in self.names)

    def origin_allowed(self, origin: str) -> bool:
        origin = origin.strip().rstrip("/").lower()
        if "*" in self.allow_origins or origin in self.allow_origins:
            return True
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and is_loopback(parts.hostname or "")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        origin = headers.get("origin")
        if not self.host_allowed(headers.get("host", "")):
            return await _refuse(send, 403, f"The Host header '{headers.get('host', '')}' does not name this "
                                 "server; allow it with --allow-host.", "host_not_allowed")
        if origin is not None and not self.origin_allowed(origin):
            return await _refuse(send, 403, f"Requests from the web origin '{origin}' are refused; allow it with "
                                 "--allow-origin.", "origin_not_allowed")
        cors = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")] if origin else []
        if scope["method"] == "OPTIONS" and origin is not None:  # a CORS preflight from an allowed origin
            asked = headers.get("access-control-request-headers", "")  # e.g. the openai JS SDK's X-Stainless-*
            allowed = asked if HEADER_LIST.fullmatch(asked) and asked.strip() else "Authorization, Content-Type"
            return await _respond(send, 204, b"", cors + [
                (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
                (b"access-control-allow-headers", allowed.encode("latin-1")),
                (b"access-control-max-age", b"600")])
        if scope["method"] == "POST":
            kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if kind != "application/json":
                return await _refuse(send, 415, f"POST bodies must be sent as 'Content-Type: application/json', "
                                     f"not '{kind or 'none'}'.", "unsupported_media_type")
        if not cors:
            return await self.app(scope, receive, send)

        async def send_with_cors(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *cors]}
            await send(message)

        return await self.app(scope, receive, send_with_cors)


async def _respond(send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


async def _refuse(send, status: int, message: str, code: str) -> None:
    body = json.dumps(ApiError(status, message, code=code).body()).encode()
    await _respond(send, status, body, [(b"content-type", b"application/json")])
