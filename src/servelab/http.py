"""What every servelab HTTP server shares: loopback by default, a Host check against DNS
rebinding, request body limits (per request, by time, and in flight in total), bounded
connections, errors as one JSON line, and a clear line when the port cannot be taken."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import socket
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

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


def error_body(message: str, key: str | None = None) -> bytes:
    """Every error a servelab server sends: JSON, one line, the words the CLI would print;
    with the scenario key it is about ("llm.tp") when the error knows it."""
    return json.dumps({"error": cut(message, 500), **({"key": key} if key else {})}).encode()


def error_response(message: str, status_code: int, close: bool = False,
                   key: str | None = None) -> Response:
    """An error line; `close` ends the connection after it (the body was not read)."""
    return Response(error_body(message, key), status_code=status_code,
                    media_type="application/json",
                    headers={"connection": "close"} if close else None)


def _host_name(host_header: str) -> str:
    """The host name of a Host header, without the port ("[::1]:8000" -> "::1")."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """How much request body a server takes: per request (a callable may give a route its
    own, e.g. a model's largest valid request), how long its arrival may take, and how
    many bytes of bodies all requests together may hold at once."""

    max_body: int
    body_timeout_s: float = 30.0
    max_inflight_bytes: int = 256 * 1024 * 1024
    per_route: Callable[[Scope], int | None] | None = None

    def limit(self, scope: Scope) -> int:
        got = self.per_route(scope) if self.per_route is not None else None
        return self.max_body if got is None else got


class GuardMiddleware:
    """Refuses, before any route runs: a Host the lab was not started for (DNS
    rebinding: a page on another site resolving its own name to 127.0.0.1) with 403,
    two Host headers with 400, a request body over its limit with 413 (from its
    Content-Length before reading it, or as it arrives), a body that takes longer than
    the body timeout with 408, and one that would take the bodies in flight past their
    total with 503. A refused body is not read: the connection is closed after the
    answer."""

    def __init__(self, app: ASGIApp, allowed_hosts: tuple[str, ...], max_body: int,
                 server: str = "the lab", limits: BodyLimits | None = None) -> None:
        self.app = app
        self.server = server
        self.allowed = {h.lower() for h in allowed_hosts}
        self.limits = limits or BodyLimits(max_body)
        self.inflight = 0  # bytes of request bodies held by requests not yet answered

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        hosts = [v for k, v in scope["headers"] if k == b"host"]
        if len(hosts) > 1:
            await error_response(f"{len(hosts)} Host headers: expected one; fix: send one "
                                 "Host header", 400, close=True)(scope, receive, send)
            return
        host = _host_name(hosts[0].decode("latin-1") if hosts else "")
        if host not in self.allowed:
            shown_host = cut(repr(host), 60)
            await error_response(f"Host {shown_host}: {self.server} answers only "
                         f"{', '.join(sorted(self.allowed))}; fix: use one of those names, "
                         "or start it with --allow-host NAME", 403, close=True
                         )(scope, receive, send)
            return
        lim = self.limits
        max_body = lim.limit(scope)
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None and (not length.isdigit() or int(length) > max_body):
            await error_response(f"request body of {cut(length.decode('latin-1'), 20)} bytes: "
                         f"expected at most {max_body:,} for {cut(scope['path'], 80)}; fix: "
                         "send a smaller body (fewer rows per request)", 413, close=True
                         )(scope, receive, send)
            return
        held = int(length) if length is not None else 0
        if self.inflight + held > lim.max_inflight_bytes:
            await error_response(f"server busy: {self.inflight:,} bytes of request bodies in "
                                 f"flight, at most {lim.max_inflight_bytes:,} together; fix: "
                                 "retry shortly", 503, close=True)(scope, receive, send)
            return
        self.inflight += held
        received = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + lim.body_timeout_s
        # uvicorn's receive returns at once while its message event is set (the body, or
        # its next part, is in hand): only a receive that would wait needs the deadline.
        in_hand = getattr(getattr(receive, "__self__", None), "message_event", None)
        if not isinstance(in_hand, asyncio.Event):
            in_hand = None

        async def limited() -> Message:
            nonlocal received, held
            if in_hand is not None and in_hand.is_set():
                message = await receive()
            else:
                try:
                    async with asyncio.timeout_at(deadline):
                        message = await receive()
                except TimeoutError:
                    raise _BodyTimeoutError from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_body:
                    raise _BodyTooLargeError
                if received > held:  # a chunked body: counted as it arrives
                    self.inflight += received - held
                    held = received
                    if self.inflight > lim.max_inflight_bytes:
                        raise _BusyError
            return message

        try:
            await self.app(scope, limited, send)
        except _BodyTooLargeError:
            await error_response(f"request body over {max_body:,} bytes; fix: send a smaller "
                         "body", 413, close=True)(scope, receive, send)
        except _BodyTimeoutError:
            await error_response(f"request body not received within {lim.body_timeout_s:g} "
                                 "s; fix: send the whole body at once", 408, close=True
                                 )(scope, receive, send)
        except _BusyError:
            await error_response(f"server busy: request bodies in flight over "
                                 f"{lim.max_inflight_bytes:,} bytes together; fix: retry "
                                 "shortly", 503, close=True)(scope, receive, send)
        finally:
            self.inflight -= held


class _BodyTooLargeError(Exception):
    pass


class _BodyTimeoutError(Exception):
    pass


class _BusyError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How many connections a server keeps open and how long one may sit without a
    request. Past `max_connections`, a new connection closes the one idle longest
    (waiting for, or part-way through, its request's headers); if every open
    connection has a request in progress, the new one is answered 503."""

    max_connections: int = 1000
    header_timeout_s: float = 10.0

    def fitted_to_file_limit(self, reserve: int = 64) -> ConnectionLimits:
        """Raise the process's open-file limit as far as it may go, and keep
        `max_connections` under it (models, stores and logs need files too)."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = self.max_connections + reserve
        if soft != resource.RLIM_INFINITY and soft < want:
            new = want if hard == resource.RLIM_INFINITY else min(want, hard)
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
                soft = new
            except (ValueError, OSError):
                pass
        if soft == resource.RLIM_INFINITY or soft >= want:
            return self
        return ConnectionLimits(max(1, soft - reserve), self.header_timeout_s)


async def _too_many_connections(scope: Scope, receive: Receive, send: Send) -> None:
    await error_response("server busy: every connection has a request in progress; fix: "
                         "retry shortly, or reuse a keep-alive connection", 503,
                         close=True)(scope, receive, send)


def guarded_http_protocol(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a header timeout and a bound on open
    connections (uvicorn has neither: a connection that never sends a request is never
    closed, and enough of them use up the process's files)."""
    idle: OrderedDict[GuardedProtocol, None] = OrderedDict()  # oldest idle first

    class GuardedProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _refuse = False

        def _wait_for_headers(self) -> None:
            idle[self] = None
            idle.move_to_end(self)
            self._header_timer = self.loop.call_later(limits.header_timeout_s,
                                                      self._header_timeout)

        def _header_timeout(self) -> None:
            self._header_timer = None
            idle.pop(self, None)
            if not self.transport.is_closing():
                self.transport.close()

        def _stop_waiting(self) -> None:
            idle.pop(self, None)
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                if idle:
                    oldest = next(iter(idle))
                    oldest._stop_waiting()
                    oldest.transport.close()
                else:
                    self._refuse = True
            self._wait_for_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_waiting()
            super().connection_lost(exc)

        def on_headers_complete(self) -> None:
            self._stop_waiting()
            if self._refuse:
                self.app = _too_many_connections
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and (
                    self.cycle is None or self.cycle.response_complete):
                self._wait_for_headers()

    return GuardedProtocol
