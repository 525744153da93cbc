"""What every servelab HTTP server shares: loopback by default, a Host check against DNS
rebinding, a request body limit, errors as one JSON line, and a clear line when the
port cannot be taken."""

from __future__ import annotations

import json
import os
import socket
from typing import Any

from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from servelab.errors import ConfigError, cut

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def allowed_hosts(bind: str, extra: list[str] | None) -> tuple[str, ...]:
    """Loopback names, the bound address (unless a wildcard) and any --allow-host."""
    hosts = [*LOOPBACK_HOSTS, *(h.strip().lower() for h in extra or [] if h.strip())]
    if bind not in ("0.0.0.0", "::"):  # a wildcard bind names no host to answer to
        hosts.append(bind.lower())
    return tuple(dict.fromkeys(hosts))


def check_can_listen(host: str, port: int) -> None:
    """One clear line before uvicorn starts (it logs and exits on its own otherwise)."""
    try:
        with socket.create_server((host, port)):
            pass
    except (OSError, OverflowError) as exc:
        reason = (os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno
                  else str(exc))
        raise ConfigError(f"--port = {port}: cannot listen on {cut(host, 60)}:{port} "
                          f"({reason}); fix: choose another port, e.g. --port {port + 1}, "
                          "or another --host") from exc


def json_response(obj: Any, status_code: int = 200) -> Response:
    """Reports are plain JSON already: skip FastAPI's recursive encoder (it costs more
    than the simulation's report on a slider move)."""
    return Response(json.dumps(obj, allow_nan=False), status_code=status_code,
                    media_type="application/json")


def error_body(message: str) -> bytes:
    """Every error a servelab server sends: JSON, one line, the words the CLI would print."""
    return json.dumps({"error": cut(message, 500)}).encode()


def error_response(message: str, status_code: int) -> Response:
    return Response(error_body(message), status_code=status_code,
                    media_type="application/json")


def _host_name(host_header: str) -> str:
    """The host name of a Host header, without the port ("[::1]:8000" -> "::1")."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


class GuardMiddleware:
    """Refuses, before any route runs: a Host the lab was not started for (DNS
    rebinding: a page on another site resolving its own name to 127.0.0.1) with 403,
    and a request body over the size limit with 413."""

    def __init__(self, app: ASGIApp, allowed_hosts: tuple[str, ...], max_body: int,
                 server: str = "the lab") -> None:
        self.app = app
        self.server = server
        self.allowed = {h.lower() for h in allowed_hosts}
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        host = _host_name(headers.get(b"host", b"").decode("latin-1"))
        if host not in self.allowed:
            shown_host = cut(repr(host), 60)
            await error_response(f"Host {shown_host}: {self.server} answers only "
                         f"{', '.join(sorted(self.allowed))}; fix: use one of those names, "
                         "or start it with --allow-host NAME", 403
                         )(scope, receive, send)
            return
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            await error_response(f"request body of {cut(length.decode('latin-1'), 20)} bytes: "
                         f"expected at most {self.max_body:,}; fix: send a smaller body",
                         413)(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:
                    raise _BodyTooLargeError
            return message

        try:
            await self.app(scope, limited, send)
        except _BodyTooLargeError:
            await error_response(f"request body over {self.max_body:,} bytes; fix: send a smaller "
                         "body", 413)(scope, receive, send)


class _BodyTooLargeError(Exception):
    pass


