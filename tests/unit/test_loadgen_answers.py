"""How the open-loop client reads a server's answers: a head that breaks HTTP is an error
with its reason, and the connection it came on is not trusted again."""

from __future__ import annotations

import asyncio
import json

import numpy as np

from servelab.measure.loadgen import MALFORMED_HEAD, http_request, run_open_loop

GOOD = json.dumps({"model_name": "m", "outputs": [{"name": "y", "datatype": "FP32",
                                                    "shape": [1, 1], "data": [0.5]}]}).encode()


def head(*lines: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\n" + b"".join(x + b"\r\n" for x in lines) + b"\r\n"


async def serve_and_load(bad_every: int, n: int) -> tuple[np.ndarray, dict[str, int], int]:
    """A server whose every `bad_every`-th answer names no header for its length (as
    Triton 2.51's once did: `: 184`), the rest good; `n` requests over one connection
    at a time. The answers' statuses, the errors by reason, the connections opened."""
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
                name = b": " if count[0] % bad_every == 0 else b"Content-Length: "
                writer.write(head(b"Content-Type: application/json",
                                  name + str(len(GOOD)).encode()) + GOOD)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
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
