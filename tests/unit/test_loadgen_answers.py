"""How the load client reads a server's answers: a head that breaks HTTP is an error with
its reason, and the connection it came on is not trusted again; a server that has gone
silent for a whole request timeout is sent nothing more, and what was not sent is
counted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np
import pytest

from servelab.errors import StoreError
from servelab.measure.loadgen import (
    MALFORMED_HEAD,
    NOT_SENT,
    LoadResult,
    http_request,
    not_sent,
    refuse_silent,
    run_closed_loop,
    run_open_loop,
)

GOOD = json.dumps({"model_name": "m", "outputs": [{"name": "y", "datatype": "FP32",
                                                    "shape": [1, 1], "data": [0.5]}]}).encode()


def head(*lines: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\n" + b"".join(x + b"\r\n" for x in lines) + b"\r\n"


@contextlib.asynccontextmanager
async def serving(answer: Callable[[int], Awaitable[bytes | None]]
                  ) -> AsyncIterator[tuple[int, list[int]]]:
    """A loopback HTTP server that reads each request whole and writes what
    `answer(k)` gives for the k-th (1-based; None: nothing). Yields its port and a
    one-item list counting the connections it took."""
    count, conns = [0], [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns[0] += 1
        try:
            while True:
                req = await reader.readuntil(b"\r\n\r\n")
                length = next(int(x.split(b":")[1]) for x in req.split(b"\r\n")
                              if x.lower().startswith(b"content-length:"))
                await reader.readexactly(length)
                count[0] += 1
                if (out := await answer(count[0])) is not None:
                    writer.write(out)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1], conns


async def serve_and_load(bad_every: int, n: int) -> tuple[np.ndarray, dict[str, int], int]:
    """A server whose every `bad_every`-th answer names no header for its length (as
    Triton 2.51's once did: `: 184`), the rest good; `n` requests over one connection
    at a time. The answers' statuses, the errors by reason, the connections opened."""
    async def answer(k: int) -> bytes:
        name = b": " if k % bad_every == 0 else b"Content-Length: "
        return head(b"Content-Type: application/json", name + str(len(GOOD)).encode()) + GOOD

    async with serving(answer) as (port, conns):
        req = http_request("127.0.0.1", port, "/v2/models/m/infer", b'{"inputs": []}')
        res = await run_open_loop("127.0.0.1", port, [req],
                                  np.arange(1, n + 1) * 0.002, max_connections=1)
    return res.status, res.errors, conns[0]


def test_a_head_line_without_a_name_is_an_error_and_the_connection_is_dropped():
    status, errors, conns = asyncio.run(serve_and_load(bad_every=4, n=12))
    assert errors == {MALFORMED_HEAD: 3}
    assert (status == 200).sum() == 9  # every other answer read whole, in step
    assert conns == 3  # a fresh one after each broken head but the last


def test_good_heads_keep_one_connection():
    status, errors, conns = asyncio.run(serve_and_load(bad_every=10**9, n=12))
    assert errors == {}
    assert (status == 200).all()
    assert conns == 1


async def load_a_server_that_goes_quiet(answers: int, n: int, *, closed: bool,
                                        delay_s: float = 0.0) -> tuple[LoadResult, float]:
    """A server that answers its first `answers` requests (each `delay_s` late) and then
    reads requests without ever answering, as a hung Triton did in CI; `n` requests
    with a 0.3 s timeout, one client (closed) or 50/s (open). The result and its time."""
    async def answer(k: int) -> bytes | None:
        if k > answers:
            return None  # read, never answered
        await asyncio.sleep(delay_s)
        return head(b"Content-Length: " + str(len(GOOD)).encode()) + GOOD

    async with serving(answer) as (port, _):
        req = http_request("127.0.0.1", port, "/v2/models/m/infer", b'{"inputs": []}')
        t0 = time.monotonic()
        res = await (run_closed_loop("127.0.0.1", port, [req], 1, n, timeout_s=0.3) if closed
                     else run_open_loop("127.0.0.1", port, [req], np.arange(1, n + 1) / 50,
                                        timeout_s=0.3))
        return res, time.monotonic() - t0


def test_a_closed_loop_stops_once_the_server_answers_nothing_for_a_timeout():
    res, took = asyncio.run(load_a_server_that_goes_quiet(3, 40, closed=True))
    assert (res.status == 200).sum() == 3
    # one client: its first unanswered request was sent after the last answer, so its
    # timeout is the whole silence
    assert res.errors == {"timeout": 1, NOT_SENT: 36}
    assert not_sent(res) == 36
    assert res.status.size == 40
    assert took < 2.0  # not 37 timeouts of 0.3 s
    with pytest.raises(StoreError, match=r"answered nothing for 0.3 s during the test; "
                       r"36 of 40 requests were not sent.*fix: check the server's log"):
        refuse_silent(res, "http://127.0.0.1:1", "the test", 0.3)


def test_an_open_loop_stops_sending_once_the_server_answers_nothing_for_a_timeout():
    res, took = asyncio.run(load_a_server_that_goes_quiet(5, 100, closed=False))
    assert (res.status == 200).sum() == 5
    assert res.errors["timeout"] + not_sent(res) == 95
    assert not_sent(res) >= 70  # silent 0.3 s after the 6th send at 0.12 s, of 2 s of sends
    assert took < 2.5


def test_a_slow_server_that_keeps_answering_is_not_silent():
    """Answers 0.2 s late, under the 0.3 s timeout, every one: nothing is cut."""
    res, _ = asyncio.run(load_a_server_that_goes_quiet(10**9, 8, closed=True, delay_s=0.2))
    assert (res.status == 200).all()
    assert res.errors == {}
    refuse_silent(res, "http://127.0.0.1:1", "the test", 0.3)  # says nothing
