"""A server that answers every request badly, one way per `--mode`, for the clients'
tests (`servelab load`, `validate`, `llm load`): what a broken or hostile server can
send must cost the client a clear line, never a traceback or its memory.

    python tests/hostile_server.py PORT --mode MODE

Modes: notjson (200 with HTML for everything), endless (200 chunked, never ending),
huge (a Content-Length of 10 GB, then a trickle), garbage200 (v2 metadata is fine,
every inference is 200 with a body that is not an answer), badmeta (metadata JSON of
the wrong shapes: a dimension of 10^12, strings for numbers), deepjson (JSON nested
100,000 deep).
"""

from __future__ import annotations

import argparse
import asyncio
import json

META = {"name": "m", "versions": ["1"], "platform": "stub",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 1]}]}


def fixed(code: int, body: bytes, ctype: str = "application/json") -> bytes:
    return (f"HTTP/1.1 {code} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}"
            "\r\n\r\n").encode() + body


async def answer(mode: str, path: str, writer: asyncio.StreamWriter) -> bool:
    """Write one answer; False when the connection is done with."""
    if mode == "notjson":
        writer.write(fixed(200, b"<html>hello</html>", "text/html"))
    elif mode == "endless":
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"[" * 65536
        frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
        for _ in range(100_000):  # 6.5 GB unless the client stops reading first
            writer.write(frame)
            await writer.drain()
        return False
    elif mode == "huge":
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 10000000000\r\n\r\n{")
        for _ in range(600):
            writer.write(b" " * 1024)
            await writer.drain()
            await asyncio.sleep(0.05)
        return False
    elif mode == "garbage200":
        if path.endswith("/infer"):
            writer.write(fixed(200, b"this is not an answer"))
        elif path.startswith("/v2/models/m"):
            writer.write(fixed(200, json.dumps(META).encode()) if path == "/v2/models/m"
                         else fixed(404, b'{"error": "no"}'))
        else:
            writer.write(fixed(200, b"{}"))
    elif mode == "badmeta":
        meta = {**META, "inputs": [{"name": "x", "datatype": "FP32",
                                    "shape": [-1, 10**12]}]}
        if "config" in path:
            body = {"max_batch_size": "lots", "dynamic_batching": [1, 2],
                    "instance_group": ["x"]}
            writer.write(fixed(200, json.dumps(body).encode()))
        else:
            writer.write(fixed(200, json.dumps(meta).encode()))
    elif mode == "deepjson":
        writer.write(fixed(200, b"[" * 100_000 + b"]" * 100_000))
    await writer.drain()
    return True


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--mode", required=True)
    args = ap.parse_args()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                length = next((int(ln.split(":", 1)[1]) for ln in lines
                               if ln.lower().startswith("content-length:")), 0)
                if length:
                    await reader.readexactly(length)
                if not await answer(args.mode, path, writer):
                    break
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", args.port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
