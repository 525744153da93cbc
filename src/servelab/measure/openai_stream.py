"""One streaming request to an OpenAI-compatible server, timed chunk by chunk.

A chunk *carries a token* when its `choices[0].text` (completions) or
`choices[0].delta.content` (chat) is not empty; TTFT runs to the first such chunk and each
later one adds an inter-chunk gap. Tokens are counted from the `usage` the server sends last
(`stream_options.include_usage`), never by chunk: servers send several tokens in a chunk
(vLLM on CPU sent 64 tokens in 47 chunks) or hold some back. A stream without usage is a
failed request, said so, not a guess.

Every way a request can go wrong ends it with a reason, in bounded time and memory: the
connection (refused, reset), an HTTP error (its status and the start of its body), a stream
that is not SSE JSON, one over `max_bytes` or with more chunks than its `max_tokens` allows,
and the request's own time limit.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError

MAX_LINE_BYTES = 1 << 20  # one SSE line; a longer one ends the request ("line too long")


@dataclass(slots=True)
class StreamTiming:
    """What one request did (times: `time.monotonic_ns()`); filled in as the stream runs."""

    sent_ns: int = 0
    chunk_ns: list[int] = field(default_factory=list)  # each token-carrying chunk's arrival
    done_ns: int = 0
    error: str = ""  # empty when the request succeeded
    prompt_tokens: int = -1  # from usage; -1 when the server did not say
    output_tokens: int = -1
    cached_tokens: int = -1  # prompt tokens served from the server's cache, when it tells
    server_prompt_ms: float = -1.0  # llama.cpp's timings.prompt_ms: its prompt's compute
    # llama.cpp's timings.predicted_ms: from its first token to its last by the server's
    # clock (the decode steps after the first token; no network, no client)
    server_decode_ms: float = -1.0


def request_body(*, chat: bool, model: str, prompt: str, max_tokens: int, ignore_eos: bool,
                 temperature: float = 0.0, id_slot: int | None = None) -> bytes:
    """The JSON body vLLM's benchmark sends (greedy, streamed, with usage); `id_slot`:
    the llama.cpp slot to run in."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": True,
                            "stream_options": {"include_usage": True},
                            "temperature": temperature}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if ignore_eos:
        body["ignore_eos"] = True
    if id_slot is not None:
        body["id_slot"] = id_slot
    return json.dumps(body).encode()


def _token_text(event: dict[str, Any]) -> str:
    choices = event.get("choices")
    if not (isinstance(choices, list) and choices and isinstance(choices[0], dict)):
        return ""
    c = choices[0]
    text = c.get("text")
    if text is None and isinstance(c.get("delta"), dict):
        d = c["delta"]
        text = d.get("content") or d.get("reasoning_content")
    return text if isinstance(text, str) else ""


def _take_usage(event: dict[str, Any], out: StreamTiming) -> None:
    usage = event.get("usage")
    if isinstance(usage, dict):
        p, o = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(p, int) and isinstance(o, int) and p >= 0 and o >= 0:
            out.prompt_tokens, out.output_tokens = p, o
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            out.cached_tokens = details["cached_tokens"]
    timings = event.get("timings")  # llama.cpp's per-request figures
    if isinstance(timings, dict):
        if isinstance(timings.get("cache_n"), int):
            out.cached_tokens = timings["cache_n"]
        if isinstance(timings.get("prompt_ms"), int | float):
            out.server_prompt_ms = float(timings["prompt_ms"])
        if isinstance(timings.get("predicted_ms"), int | float):
            out.server_decode_ms = float(timings["predicted_ms"])


async def stream_one(session: aiohttp.ClientSession, url: str, body: bytes, *,
                     max_tokens: int, timeout_s: float, max_bytes: int,
                     out: StreamTiming) -> None:
    """Send `body` to `url` and read its SSE stream into `out` (never raises for the
    server's or the network's faults: `out.error` says what went wrong)."""
    try:
        async with asyncio.timeout(timeout_s):
            out.sent_ns = time.monotonic_ns()
            async with session.post(url, data=body,
                                    headers={"Content-Type": "application/json"}) as resp:
                if resp.status != 200:
                    text = (await resp.content.read(200)).decode("utf-8", "replace")
                    out.error = f"http {resp.status}: {' '.join(text.split())[:120]}"
                    return
                await _read_events(resp, out, max_tokens, max_bytes)
    except TimeoutError:
        out.error = f"timeout after {timeout_s:g} s"
    except aiohttp.ClientConnectorError as exc:
        out.error = f"connect: {exc.os_error.strerror or type(exc.os_error).__name__}"
    except (aiohttp.ClientError, OSError) as exc:
        out.error = f"transport: {type(exc).__name__}"
    except (ValueError, HttpProcessingError) as exc:  # e.g. a line past read_bufsize
        kind = "line too long" if "bytes when reading" in str(exc) or "too big" in str(
            exc) else " ".join(str(exc).split())[:80]
        out.error = f"bad stream: {kind}"
    finally:
        out.done_ns = time.monotonic_ns()


async def _read_events(resp: aiohttp.ClientResponse, out: StreamTiming, max_tokens: int,
                       max_bytes: int) -> None:
    max_chunks = 4 * max_tokens + 64  # room for role, usage and empty chunks; never endless
    seen_bytes = 0
    events = 0
    done = False
    async for raw in resp.content:
        now = time.monotonic_ns()
        seen_bytes += len(raw)
        if seen_bytes > max_bytes:
            out.error = f"response over {max_bytes:,} bytes"
            return
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue  # blank lines, comments, event:, id:, retry: carry no payload here
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            break
        events += 1
        if events > max_chunks:
            out.error = f"stream over {max_chunks:,} chunks for max_tokens {max_tokens}"
            return
        try:
            event = json.loads(data)
        except ValueError:
            out.error = f"bad stream: not JSON: {data[:60].decode('utf-8', 'replace')!r}"
            return
        if not isinstance(event, dict):
            out.error = "bad stream: an event that is not a JSON object"
            return
        if "error" in event:
            msg = event["error"].get("message") if isinstance(event["error"], dict) else ""
            out.error = f"server error in stream: {' '.join(str(msg).split())[:100]}"
            return
        text = _token_text(event)
        if text:
            out.chunk_ns.append(now)
        _take_usage(event, out)
    if not done:
        out.error = "stream ended without [DONE]"
    elif out.output_tokens < 0:
        out.error = "no usage in the stream (the server must honour stream_options.include_usage)"
    elif not out.chunk_ns and out.output_tokens > 0:
        out.error = "usage counted output tokens but no chunk carried text"
