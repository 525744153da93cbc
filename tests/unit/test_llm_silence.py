"""The LLM load client against a server that goes silent: once a request has timed out
with nothing from the server (a chunk, an answer, an error) on any stream for a whole
request timeout, nothing more is sent and the step stops with a one-line error, where
each request left would otherwise wait out its own timeout. A real aiohttp server on
loopback streams OpenAI completions for its first requests and then hangs."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiohttp import web

from servelab.errors import StoreError
from servelab.measure.llm_load import Endpoint, LoadPlan, new_session, run_step
from servelab.measure.llm_workload import LlmRequest


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def load(answers: int, n: int, *, delay_s: float = 0.0, concurrency: int = 1
               ) -> tuple[object, float]:
    """`n` requests of 3 tokens, `concurrency` at a time, 0.3 s timeout, to a server that
    streams its first `answers` (a token every `delay_s`) and holds the rest unanswered.
    The run's records (or the error it raised) and how long it took."""
    count = [0]
    release = asyncio.Event()  # set when the run is over, so the server can shut down

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        count[0] += 1
        if count[0] > answers:
            await release.wait()  # hung: never a byte while the run lasts
            return web.Response(status=503)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(3):
            await asyncio.sleep(delay_s)
            await resp.write(sse({"choices": [{"index": 0, "text": "x"}]}))
        await resp.write(sse({"choices": [], "usage": {"prompt_tokens": 4,
                                                       "completion_tokens": 3}}))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    ep = Endpoint(f"http://127.0.0.1:{port}", "/v1/completions", "m")
    t0 = time.monotonic()
    try:
        async with new_session(8) as session:
            try:
                got: object = await run_step(
                    session, ep, [LlmRequest("hello there", 3) for _ in range(n)],
                    LoadPlan(max_concurrency=concurrency), seed=0, timeout_s=0.3,
                    ignore_eos=True)
            except StoreError as exc:
                got = exc
        took = time.monotonic() - t0
    finally:
        release.set()
        await runner.cleanup()
    return got, took


def test_a_hung_server_stops_the_step_with_what_was_served_and_not_sent():
    got, took = asyncio.run(load(3, 30))
    assert isinstance(got, StoreError)
    assert str(got).startswith("--url http://127.0.0.1:")
    assert ("sent nothing on any stream for 0.3 s (the request timeout); 3 of 30 requests "
            "were served and 26 not sent; fix: check the server's log") in str(got)
    assert took < 3.0  # not 27 timeouts of 0.3 s


def test_a_slow_server_that_keeps_streaming_is_not_silent():
    """Each token 0.15 s after the last: a request would take 0.45 s, so every one times
    out at 0.3 s; but each timeout comes 0.15 s after the last token heard, so the
    server is slow, not silent: every request is sent, and each is a timeout."""
    got, _ = asyncio.run(load(10**9, 8, delay_s=0.15, concurrency=4))
    assert not isinstance(got, StoreError), got
    assert list(got.errors) == ["timeout after 0.3 s"] * 8  # type: ignore[attr-defined]


@pytest.mark.parametrize("answers", [0, 2])
def test_silence_is_judged_from_the_last_thing_heard(answers):  # type: ignore[no-untyped-def]
    got, took = asyncio.run(load(answers, 12, concurrency=3))
    assert isinstance(got, StoreError)
    assert f"{answers} of 12 requests were served" in str(got)
    assert took < 3.0


def test_silence_found_after_every_request_is_out_leaves_each_its_own_reason():
    """All four sent at once to a server that never answers: nothing is left to hold
    back, so the step returns, each request a timeout (no error for the step)."""
    got, _ = asyncio.run(load(0, 4, concurrency=4))
    assert not isinstance(got, StoreError), got
    assert list(got.errors) == ["timeout after 0.3 s"] * 4  # type: ignore[attr-defined]
