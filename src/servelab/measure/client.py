"""What servelab's clients read from a server they are pointed at: a URL checked into
host and port with one clear line, and answers read up to a bound in bytes and time
(a server that streams forever, or sends a gigabyte, costs the client nothing more)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

import httpx

from servelab.errors import InputError, StoreError, cut

MAX_ANSWER_BYTES = 8 * 1024 * 1024  # metadata, config, statistics: far below this


@dataclass(frozen=True, slots=True)
class Url:
    scheme: str
    host: str
    port: int
    path: str

    @property
    def base(self) -> str:
        return base_url(self.scheme, self.host, self.port)


def base_url(scheme: str, host: str, port: int) -> str:
    """scheme://host:port, an IPv6 address in brackets."""
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def split_url(flag: str, url: str, *, schemes: tuple[str, ...] = ("http",),
              example: str = "http://127.0.0.1:8000") -> Url:
    """`url` as scheme, host, port and path, or one line naming what is wrong."""
    def bad(why: str) -> InputError:
        return InputError(f"{flag} = {cut(url)!r}: {why}; expected "
                          f"{' or '.join(s + '://HOST:PORT' for s in schemes)}; fix: e.g. "
                          f"{flag} {example}")

    if not url or any(c.isspace() for c in url) or not url.isprintable():
        raise bad("empty, or has spaces or control characters")
    try:
        parts: SplitResult = urlsplit(url if "://" in url else f"http://{url}")
        port = parts.port
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range", a port not a number
        raise bad(f"not a URL ({exc})") from None
    if parts.scheme not in schemes:
        raise bad(f"scheme {cut(parts.scheme, 20)!r}")
    if not parts.hostname:
        raise bad("no host")
    if port == 0:
        raise bad("port 0")
    default = 443 if parts.scheme == "https" else 80
    return Url(parts.scheme, parts.hostname, port or default, parts.path)


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes

    def json(self) -> Any:
        """The body as JSON, or None if it is not JSON."""
        try:
            return json.loads(self.body)
        except (ValueError, RecursionError):
            return None

    def head(self, n: int = 150) -> str:
        return cut(self.body.decode("utf-8", "replace"), n).replace("\n", " ")


def fetch(method: str, url: str, *, body: bytes | None = None, timeout_s: float = 10.0,
          limit: int = MAX_ANSWER_BYTES, headers: dict[str, str] | None = None) -> Answer:
    """One request, its answer read to at most `limit` bytes within `timeout_s` in all.
    StoreError (one line) for a server that cannot be reached, is too slow, or says
    too much."""
    deadline = time.monotonic() + timeout_s
    try:
        with httpx.stream(method, url, content=body, timeout=timeout_s, headers=headers,
                          trust_env=False) as r:
            buf = bytearray()
            for chunk in r.iter_bytes():
                buf += chunk
                if len(buf) > limit:
                    raise StoreError(f"{cut(url, 120)}: the answer runs past {limit:,} "
                                     "bytes; fix: check the URL points at the right server")
                if time.monotonic() > deadline:
                    raise StoreError(f"{cut(url, 120)}: the answer took over {timeout_s:g} "
                                     "s; fix: check the server")
            return Answer(r.status_code, bytes(buf))
    except httpx.HTTPError as exc:
        raise StoreError(f"{cut(url, 120)}: cannot reach the server "
                         f"({type(exc).__name__}: {cut(str(exc), 120)}); fix: start it, or "
                         "check the address") from None
