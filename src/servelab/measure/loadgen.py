"""An open-loop HTTP load generator for v2 servers: requests go at their *intended*
send times (Poisson, constant, or a trace) whatever the server does, and latency is
measured from the intended time, so a client that falls behind does not hide queueing
(no coordinated omission). It says how far behind it fell, as perf_analyzer warns about
delayed requests.

Plain asyncio streams over keep-alive HTTP/1.1 connections: a request's bytes are built
once, so one core sends a few thousand requests a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servelab.errors import InputError, StoreError
from servelab.measure.gaps import answer_gaps

MAX_REQUESTS = 2_000_000
MAX_IDLE_NS = 1_000_000_000  # a keep-alive connection idle longer is not reused
TIMEOUT_S = 30.0  # a request's, by default: the loops' and refuse_silent's


@dataclass(frozen=True, slots=True)
class LoadResult:
    """Per request: intended and actual send time, completion (ns from the start), status
    (HTTP code, 0 for a transport error or a timeout). `t0_ns`: the start on this
    machine's monotonic clock (time.monotonic_ns), which a server's trace on the same
    machine shares; 0 where not known."""

    intended_ns: np.ndarray
    sent_ns: np.ndarray
    done_ns: np.ndarray
    status: np.ndarray
    errors: dict[str, int] = field(default_factory=dict)
    t0_ns: int = 0

    @property
    def latency_ms(self) -> np.ndarray:
        ok = self.status == 200
        lat: np.ndarray = (self.done_ns[ok] - self.intended_ns[ok]) / 1e6
        return lat

    @property
    def behind_ms(self) -> np.ndarray:
        """How late each request left against its intended time."""
        late: np.ndarray = (self.sent_ns - self.intended_ns) / 1e6
        return late

    def p50_growth(self) -> float:
        """Median latency of the last third of the run (by intended send time) over the
        first third's: about 1 for a server that keeps up, growing through the run for
        one whose queue builds (an open loop past saturation). 1 with too few answers."""
        order = np.argsort(self.intended_ns, kind="stable")
        ok = (self.status == 200)[order]
        lat = ((self.done_ns - self.intended_ns)[order] / 1e6)
        third = order.size // 3
        if third < 10:
            return 1.0
        first, last = lat[:third][ok[:third]], lat[-third:][ok[-third:]]
        if first.size < 10 or last.size < 10:
            return 1.0
        return float(np.median(last) / max(np.median(first), 1e-9))

    def summary(self) -> dict[str, float | int]:
        lat = self.latency_ms
        span = (self.done_ns.max() - self.intended_ns.min()) / 1e9 if self.done_ns.size else 0
        good = self.status == 200
        ok = int(good.sum())
        drawn = (self.intended_ns.max() - self.intended_ns.min()) / 1e9 if self.status.size else 0
        gaps = answer_gaps(self.sent_ns[good], self.done_ns[good])
        q = (np.percentile(lat, [50, 90, 95, 99]) if lat.size else [float("nan")] * 4)
        return {
            "requests": int(self.status.size), "ok": ok,
            "errors": int(self.status.size - ok),
            "achieved_per_s": ok / span if span > 0 else 0.0,
            # the rate the send times actually drawn ask for (a 2 s Poisson draw's own
            # span varies by a few percent around the nominal rate's)
            "drawn_per_s": self.status.size / drawn if drawn > 0 else 0.0,
            "mean_ms": float(lat.mean()) if lat.size else float("nan"),
            "p50_ms": float(q[0]), "p90_ms": float(q[1]), "p95_ms": float(q[2]),
            "p99_ms": float(q[3]),
            "behind_p99_ms": float(np.percentile(self.behind_ms, 99)) if self.status.size
            else 0.0,
            "p50_growth": self.p50_growth(),
            # ~500 ms with requests waiting and no answer (Triton's lost wake-up)
            "wait_gaps": gaps[0], "wait_gap_s": gaps[1],
        }


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No garbage collection during a run (its allocations are bounded by the request
    count): a full collection over thousands of pending tasks stalls the client for
    tens of milliseconds, which would be charged to the server. Collected afterwards,
    by the outermost run only: a run inside another (`llm validate`'s mixed rows send a
    prompt while streams run) that collected on its way out stalled the other's streams
    55-64 ms, and the profile read that stall as a 64-token prompt's step (until
    2026-12-04)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
            gc.collect()


def poisson_offsets(rate: float, n: int, seed: int = 0) -> np.ndarray:
    """Intended send times (s from the start) of a Poisson stream."""
    if not (rate > 0 and 1 <= n <= MAX_REQUESTS):
        raise InputError(f"load: rate {rate} and {n} requests: expected a rate > 0 and "
                         f"1 to {MAX_REQUESTS:,} requests")
    gaps: np.ndarray = np.random.default_rng(seed).exponential(1.0 / rate, n)
    return np.cumsum(gaps)


def constant_offsets(rate: float, n: int) -> np.ndarray:
    """Intended send times (s) of an evenly spaced stream."""
    if not (rate > 0 and 1 <= n <= MAX_REQUESTS):
        raise InputError(f"load: rate {rate} and {n} requests: expected a rate > 0 and "
                         f"1 to {MAX_REQUESTS:,} requests")
    even: np.ndarray = np.arange(1, n + 1) / rate
    return even


def http_request(host: str, port: int, path: str, body: bytes,
                 headers: dict[str, str] | None = None, method: str = "POST") -> bytes:
    shown = f"[{host}]" if ":" in host else host
    head = [f"{method} {path} HTTP/1.1", f"Host: {shown}:{port}",
            f"Content-Length: {len(body)}", "Content-Type: application/json"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


MAX_ANSWER_BYTES = 64 * 1024 * 1024
NOT_AN_ANSWER = -1  # HTTP 200 whose body is not a v2 inference answer


class _AnswerTooLargeError(Exception):
    pass


MALFORMED_HEAD = "malformed HTTP answer (a header line without a name)"


class _MalformedAnswerError(Exception):
    """An answer whose head breaks HTTP/1.1: its body's length cannot be trusted, so the
    connection is closed (as h11 or any strict client would). Triton 2.51's HTTP server
    (libevhtp) sent one such head in about 16,000 answers at 400/s with its trace on
    (2026-12-06): `Content-Length`'s name was missing, the line read `: 184`."""


async def _read_response(reader: asyncio.StreamReader) -> int:
    """The answer's status; its body read (at most MAX_ANSWER_BYTES, Content-Length or
    chunked) and, for a 200, checked to be a v2 answer (a JSON object with outputs)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length, chunked = 0, False
    for line in lines[1:-2]:  # the head ends in an empty line
        if b":" not in line or not line.split(b":", 1)[0].strip():
            raise _MalformedAnswerError
        key = line[:18].lower()
        if key.startswith(b"content-length:"):
            length = int(line[15:])
        elif key.startswith(b"transfer-encoding:") and b"chunked" in line.lower():
            chunked = True
    if chunked:
        parts, total = [], 0
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
            total += size
            if total > MAX_ANSWER_BYTES:
                raise _AnswerTooLargeError
            parts.append(await reader.readexactly(size + 2))
            if size == 0:
                break
        body = b"".join(p[:-2] for p in parts)
    else:
        if not 0 <= length <= MAX_ANSWER_BYTES:
            raise _AnswerTooLargeError
        body = await reader.readexactly(length) if length else b""
    if status == 200 and not (body[:1] == b"{" and b'"outputs"' in body[:65536]):
        return NOT_AN_ANSWER
    return status


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]
_TRANSPORT = (TimeoutError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
              ValueError, IndexError, _AnswerTooLargeError, _MalformedAnswerError)


NOT_SENT = "not sent: the server had answered nothing for a request's timeout"


class Silence:
    """Whether the server has gone silent: a request timed out and nothing (an answer,
    an error, a refused connection) came back for a whole request timeout before it. A
    run stops sending then, and counts what it did not send under NOT_SENT: a server
    that hangs would otherwise hold each request for the timeout, one client's closed
    loop of 30 requests 15 minutes (a CI run of 2026-12-06 saw PyTriton's Triton stop
    answering in the middle of validate's profile, and validate ran past 10 minutes)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_ns = int(timeout_s * 1e9)
        self.last_ns = time.monotonic_ns()
        self.silent = False

    def heard(self, timed_out: bool) -> None:
        now = time.monotonic_ns()
        if not timed_out:
            self.last_ns = now
        elif now - self.last_ns >= self.timeout_ns:
            self.silent = True


def not_sent(res: LoadResult) -> int:
    """Requests a run did not send because the server had gone silent (Silence)."""
    return res.errors.get(NOT_SENT, 0)


def refuse_silent(res: LoadResult, url: str, what: str, timeout_s: float = TIMEOUT_S) -> None:
    """A clear error for a run the server stopped answering: its figures would be the
    timeouts', not the server's."""
    if skipped := not_sent(res):
        raise StoreError(
            f"--url = {url}: the server answered nothing for {timeout_s:g} s during "
            f"{what}; {skipped:,} of {res.status.size:,} requests were not sent (errors "
            f"by reason: {dict(res.errors)}); fix: check the server's log, it may have hung")


async def _exchange(host: str, port: int, conn: Conn | None, request: bytes,
                    timeout_s: float, errors: dict[str, int], silence: Silence | None = None
                    ) -> tuple[int, Conn | None]:
    """One request on a keep-alive connection (opened if None): (HTTP status or 0, the
    connection to reuse, or None when it broke). Errors are counted by reason. The
    timeout covers the connection's opening too (a full listen queue holds a connect
    for minutes)."""
    async def exchange() -> int:
        nonlocal conn
        if conn is None:
            conn = await asyncio.open_connection(host, port)
        conn[1].write(request)
        return await _read_response(conn[0])

    try:
        code = await asyncio.wait_for(exchange(), timeout_s)
    except _TRANSPORT as exc:
        if silence is not None:
            silence.heard(isinstance(exc, asyncio.TimeoutError))
        kind = ("timeout" if isinstance(exc, asyncio.TimeoutError) else
                f"answer over {MAX_ANSWER_BYTES:,} bytes"
                if isinstance(exc, _AnswerTooLargeError) else MALFORMED_HEAD
                if isinstance(exc, _MalformedAnswerError) else type(exc).__name__)
        errors[kind] = errors.get(kind, 0) + 1
        if conn is not None:
            conn[1].close()
        return 0, None
    if silence is not None:
        silence.heard(False)
    if code == NOT_AN_ANSWER:
        errors["HTTP 200 without a v2 answer"] = errors.get("HTTP 200 without a v2 answer",
                                                            0) + 1
        return 0, conn
    if code != 200:
        errors[f"http {code}"] = errors.get(f"http {code}", 0) + 1
    return code, conn


async def run_open_loop(host: str, port: int, requests: list[bytes], offsets_s: np.ndarray,
                        *, max_connections: int = 256, timeout_s: float = TIMEOUT_S,
                        counter: list[int] | None = None) -> LoadResult:
    """Send requests[i % len(requests)] at offsets_s[i] seconds from now; wait for all.
    `counter[0]` counts answers as they come (for a progress bar)."""
    counter = counter if counter is not None else [0]
    n = offsets_s.size
    intended = np.rint(offsets_s * 1e9).astype(np.int64)
    sent = np.zeros(n, np.int64)
    done = np.zeros(n, np.int64)
    status = np.zeros(n, np.int64)
    errors: dict[str, int] = {}
    idle: list[tuple[Conn, int]] = []  # keep-alive connections and when last used
    slots = asyncio.Semaphore(max_connections)
    # Open the connections a burst will need before the clock starts (as many as 20 ms
    # of arrivals at the mean rate): opening them mid-run costs the client and the server
    # time that belongs to neither's steady state.
    span = float(offsets_s[-1] - offsets_s[0]) if n > 1 else 0.0
    rate = (n - 1) / span if span > 0 else 1.0
    for _ in range(min(max_connections, max(4, int(rate * 0.02)), n)):
        try:
            idle.append((await asyncio.open_connection(host, port), time.monotonic_ns()))
        except OSError:
            break  # the run will count the errors itself
    t0 = time.monotonic_ns()

    def reuse(now: int) -> Conn | None:
        """The most recently used idle connection; ones idle too long are closed, since
        the server may already have closed them (uvicorn does after 5 s), and a request
        written into such a socket would fail through no fault of the server."""
        while idle:
            conn, last = idle.pop()
            if now - last < MAX_IDLE_NS:
                return conn
            conn[1].close()
        return None

    silence = Silence(timeout_s)

    async def one(i: int) -> None:
        async with slots:
            now = time.monotonic_ns()
            sent[i] = now - t0
            if silence.silent:
                done[i] = sent[i]
                errors[NOT_SENT] = errors.get(NOT_SENT, 0) + 1
                counter[0] += 1
                return
            code, conn = await _exchange(host, port, reuse(now), requests[i % len(requests)],
                                         timeout_s, errors, silence)
            end = time.monotonic_ns()
            status[i] = code
            if conn is not None:
                idle.append((conn, end))
            done[i] = end - t0
            counter[0] += 1

    with paused_gc():
        await send_on_schedule(intended, t0, one)
    for (_, w), _ in idle:
        w.close()
    return LoadResult(intended, sent, done, status, errors, t0)


async def send_on_schedule(intended_ns: np.ndarray, t0: int,
                           one: Callable[[int], Coroutine[Any, Any, None]]) -> None:
    """Start `one(i)` at `t0 + intended_ns[i]` (time.monotonic_ns) for every i, and wait
    for them all. Send times come from a thread sleeping with the OS's fine timer: the
    event loop's own timers round up to whole milliseconds (epoll), which would make
    every request up to 1 ms late. A shorter GIL switch interval lets the thread in on
    time while the loop is busy."""
    n = intended_ns.size
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Future[None]] = []
    all_started = asyncio.Event()
    stop = threading.Event()

    def start(i: int) -> None:
        tasks.append(asyncio.ensure_future(one(i)))
        if len(tasks) == n:
            all_started.set()

    def sender() -> None:
        for i in range(n):
            delay = (intended_ns[i] - (time.monotonic_ns() - t0)) / 1e9
            if delay > 0 and stop.wait(delay):
                return
            loop.call_soon_threadsafe(start, i)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(min(switch, 0.0002))
    thread = threading.Thread(target=sender, name="servelab-load-sender", daemon=True)
    thread.start()
    try:
        await all_started.wait()
    finally:
        stop.set()
        sys.setswitchinterval(switch)
    await asyncio.gather(*tasks)


async def run_closed_loop(host: str, port: int, requests: list[bytes], concurrency: int,
                          n: int, *, timeout_s: float = TIMEOUT_S,
                          counter: list[int] | None = None) -> LoadResult:
    """`concurrency` clients, each sending its next request when the last is answered,
    `n` requests in all (perf_analyzer's --concurrency-range mode). Latency counts from
    each actual send: in a closed loop the intended time is the send time."""
    intended = np.zeros(n, np.int64)
    done = np.zeros(n, np.int64)
    status = np.zeros(n, np.int64)
    errors: dict[str, int] = {}
    next_i = [0]
    t0 = time.monotonic_ns()
    silence = Silence(timeout_s)

    async def client() -> None:
        conn: Conn | None = None
        while next_i[0] < n and not silence.silent:
            i = next_i[0]
            next_i[0] += 1
            intended[i] = time.monotonic_ns() - t0
            status[i], conn = await _exchange(host, port, conn, requests[i % len(requests)],
                                              timeout_s, errors, silence)
            done[i] = time.monotonic_ns() - t0
            if counter is not None:
                counter[0] += 1
        if conn is not None:
            conn[1].close()

    with paused_gc():
        await asyncio.gather(*(client() for _ in range(concurrency)))
    if next_i[0] < n:  # the server went silent: the rest are accounted as not sent
        intended[next_i[0]:] = done[next_i[0]:] = time.monotonic_ns() - t0
        errors[NOT_SENT] = n - next_i[0]
    return LoadResult(intended, intended.copy(), done, status, errors, t0)
