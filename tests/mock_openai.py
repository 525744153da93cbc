"""A mock OpenAI-compatible streaming server whose timing is known, for the load
generator's tests and bench. Run as `python -m tests.mock_openai --port P --mode M
[--log FILE]`; GET /health answers 200 once it listens.

Modes:
- `law` (default): TTFT = `--ttft-ms` + `--ms-per-prompt-word` × prompt words, then one
  token every `--itl-ms`, exactly `max_tokens` of them, and usage at the end. With `--log`
  each request's prompt and the monotonic ns at which each token chunk was written are
  appended (one JSON line per request): the truth the client's figures are held to.
- `garbage`: a 200 whose stream is not SSE JSON.
- `forever`: token chunks every 10 ms, without end.
- `huge`: one SSE line of 64 MiB.
- `nousage`: tokens, no usage, then [DONE].
- `error`: HTTP 503 with a JSON error body.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

CHUNK = (b'data: {"choices":[{"text":" word","index":0,"finish_reason":null}],'
         b'"object":"text_completion"}\n\n')
CHAT_CHUNK = (b'data: {"choices":[{"delta":{"content":" word"},"index":0,'
              b'"finish_reason":null}],"object":"chat.completion.chunk"}\n\n')


def _chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, object]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    path = lines[0].split(" ")[1]
    length = 0
    for line in lines[1:]:
        if line.lower().startswith("content-length:"):
            length = int(line.split(":", 1)[1])
    body = json.loads(await reader.readexactly(length)) if length else {}
    return path, body


def _text(content: object) -> str:
    """A chat message's text: a string, or OpenAI's list of {"type": "text", "text"} parts."""
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", default="law")
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--ms-per-prompt-word", type=float, default=0.0)
    ap.add_argument("--itl-ms", type=float, default=5.0)
    ap.add_argument("--log", default="")
    args = ap.parse_args()
    log = open(args.log, "a") if args.log else None  # noqa: SIM115 (lives as long as the server)

    async def sleep_until(t_ns: int) -> None:
        # asyncio's timer is coarse (about 1 ms); the truth is the logged write time anyway
        left = t_ns - time.monotonic_ns()
        if left > 0:
            await asyncio.sleep(left / 1e9)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            path, body = await _read_request(reader)
        except (asyncio.IncompleteReadError, ValueError, IndexError):
            writer.close()
            return
        if path in ("/health", "/v1/models"):
            data = json.dumps({"data": [{"id": "mock"}]}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Connection: close\r\nContent-Length: " + str(len(data)).encode()
                         + b"\r\n\r\n" + data)
            await writer.drain()
            writer.close()
            return
        if args.mode == "error":
            data = b'{"error": {"message": "overloaded", "code": 503}}'
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n"
                         b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
            await writer.drain()
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        t0 = time.monotonic_ns()
        chat = path.rstrip("/").endswith("/chat/completions")
        messages = body.get("messages") or []
        prompt = (" ".join(_text(m.get("content", "")) for m in messages if isinstance(m, dict))
                  if chat and isinstance(messages, list) else str(body.get("prompt", "")))
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens")  # type: ignore[call-overload]
                         or 16)
        chunk = CHAT_CHUNK if chat else CHUNK
        sent: list[int] = []
        try:
            if args.mode == "garbage":
                writer.write(_chunked(b"data: <html>not json</html>\n\n"))
            elif args.mode == "huge":
                writer.write(_chunked(b"data: " + b"x" * (64 << 20) + b"\n\n"))
            elif args.mode == "forever":
                while True:
                    writer.write(_chunked(CHUNK))
                    await writer.drain()
                    await asyncio.sleep(0.01)
            else:
                words = len(prompt.split())
                first = t0 + int((args.ttft_ms + args.ms_per_prompt_word * words) * 1e6)
                for k in range(max_tokens):
                    await sleep_until(first + int(k * args.itl_ms * 1e6))
                    sent.append(time.monotonic_ns())  # before the write: it may send at once
                    writer.write(_chunked(chunk))
                    await writer.drain()
                if args.mode != "nousage":
                    usage = {"usage": {"prompt_tokens": words, "completion_tokens": max_tokens,
                                       "total_tokens": words + max_tokens}, "choices": []}
                    writer.write(_chunked(f"data: {json.dumps(usage)}\n\n".encode()))
            writer.write(_chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
        if log is not None:
            log.write(json.dumps({"prompt": prompt, "start_ns": t0, "chunk_ns": sent}) + "\n")
            log.flush()

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", args.port, limit=1 << 20)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
