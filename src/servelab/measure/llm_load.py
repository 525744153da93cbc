"""`servelab llm load`: an OpenAI-compatible streaming server measured as `vllm bench serve`
measures it, without its measuring mistakes.

- Requests leave at their *intended* times, drawn before the run (Poisson, or gamma with
  `burstiness` as vLLM draws it, or a recorded schedule), from a thread sleeping on the OS's
  fine timer, and every latency counts from the intended time. With `max_concurrency` as
  well, a request waits for one of that many slots and its intended time becomes the moment
  a slot freed (as `servelab llm simulate --max-concurrency` schedules it). How late the
  client sent is in the report; past `LATE_WARN_MS` at p99 the client, not the server, is
  the limit, and the step says so.
- Tokens come from the server's `usage`; prompt-cache hits from its own counts.
- The server's Prometheus counters (`vllm:*`, `llamacpp:*`) are read before and after each
  step and the difference reported beside the client's figures.
- Every request ends served or failed with a reason; nothing is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from servelab.errors import StoreError, invalid
from servelab.measure.client import split_url
from servelab.measure.llm_metrics import RunRecords, ServeMetrics, compute
from servelab.measure.llm_workload import MAX_PROMPTS, LlmRequest
from servelab.measure.loadgen import paused_gc, send_on_schedule
from servelab.measure.openai_stream import (
    MAX_LINE_BYTES,
    StreamTiming,
    request_body,
    stream_one,
)

LATE_WARN_MS = 10.0  # p99 send lateness past which a step is marked client-limited
MAX_CONCURRENCY = 10_000
MAX_METRICS_BYTES = 4 << 20
MAX_RESPONSE_BYTES = 16 << 20
MAX_RUN_S = 86_400  # the last request of a step leaves within a day of its start
METRIC_PREFIXES = ("vllm:", "llamacpp:", "sglang:")


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """How one step sends: `rate` requests/s (math.inf: all at once), gamma gaps of shape
    `burstiness` (1: Poisson), at most `max_concurrency` out at once (0: no limit), or a
    recorded schedule `schedule_s` (seconds from the start) instead of a rate."""

    rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int = 0
    schedule_s: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not (self.rate > 0):
            raise invalid("--request-rate", self.rate, "a rate above 0 (or inf)",
                          "e.g. --request-rate 4")
        if not (0 < self.burstiness <= 1e6):
            raise invalid("--burstiness", self.burstiness, "a number above 0 (1: Poisson)",
                          "e.g. --burstiness 0.5 for burstier arrivals than Poisson")
        if not 0 <= self.max_concurrency <= MAX_CONCURRENCY:
            raise invalid("--max-concurrency", self.max_concurrency,
                          f"0 (no limit) to {MAX_CONCURRENCY:,}", "e.g. --max-concurrency 8")

    def check_span(self, n: int) -> None:
        """A step is bounded in time too: its last request leaves within MAX_RUN_S."""
        if self.schedule_s is not None:
            span = self.schedule_s[min(n, len(self.schedule_s)) - 1] - self.schedule_s[0]
        else:
            span = 0.0 if math.isinf(self.rate) else n / self.rate
        if not span <= MAX_RUN_S:
            raise invalid("--request-rate" if self.schedule_s is None else "--trace",
                          self.label(), f"a step of at most {MAX_RUN_S:,} s ({n:,} requests "
                          f"would take {span:.3g} s)", "a higher rate or fewer prompts")

    def offsets_s(self, n: int, seed: int) -> np.ndarray:
        """Intended send times, seconds from the start, as vLLM draws them: gamma gaps
        (shape = burstiness, mean 1/rate) rescaled so the last lands at n / rate."""
        if self.schedule_s is not None:
            sched = np.asarray(self.schedule_s[:n], float)
            return sched - sched[0] if sched.size else sched
        if math.isinf(self.rate):
            return np.zeros(n)
        gaps = np.random.default_rng(seed).gamma(self.burstiness,
                                                 1.0 / (self.rate * self.burstiness), n)
        t = np.cumsum(gaps)
        scaled: np.ndarray = t * ((n / self.rate) / t[-1])
        return scaled

    def label(self) -> str:
        parts = ["trace" if self.schedule_s is not None else
                 ("inf" if math.isinf(self.rate) else f"{self.rate:g}/s")]
        if self.burstiness != 1.0 and self.schedule_s is None and not math.isinf(self.rate):
            parts.append(f"burstiness {self.burstiness:g}")
        if self.max_concurrency:
            parts.append(f"concurrency {self.max_concurrency}")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where requests go: `base` (scheme://host:port), the API path and the model name."""

    base: str
    path: str = "/v1/completions"
    model: str = ""

    @property
    def chat(self) -> bool:
        return self.path.rstrip("/").endswith("/chat/completions")

    @classmethod
    def parse(cls, url: str, path: str, model: str = "") -> Endpoint:
        u = split_url("--url", url, schemes=("http", "https"),
                      example="http://127.0.0.1:8080")
        if "://" not in url or u.path not in ("", "/"):
            raise invalid("--url", url, "the server's base URL, http://HOST:PORT",
                          "e.g. --url http://127.0.0.1:8080 (the API path goes in --endpoint)")
        if path not in ("/v1/completions", "/v1/chat/completions"):
            raise invalid("--endpoint", path, "/v1/completions or /v1/chat/completions",
                          "use --endpoint /v1/completions")
        return cls(u.base, path, model)


@dataclass(frozen=True, slots=True)
class StepResult:
    """One step: what was asked, the client's figures, the server's counters over it."""

    plan: LoadPlan
    num_prompts: int
    metrics: ServeMetrics
    server_counters: dict[str, float] = field(default_factory=dict)
    client_limited: bool = False

    def to_dict(self) -> dict[str, Any]:
        """vLLM's `--save-result` keys for the step (`request_rate`, `burstiness`,
        `max_concurrency`, `num_prompts` and the metrics), plus servelab's."""
        return {
            "request_rate": "inf" if math.isinf(self.plan.rate) else self.plan.rate,
            "burstiness": self.plan.burstiness,
            "max_concurrency": self.plan.max_concurrency or None,
            "num_prompts": self.num_prompts,
            **self.metrics.to_dict(),
            "client_limited": self.client_limited,
            "server_counters": dict(self.server_counters),
        }


@dataclass(frozen=True, slots=True)
class LlmLoadReport:
    """A whole `llm load` run: the endpoint, the workload's name and each step."""

    endpoint: Endpoint
    dataset: str
    tokens_per_word: float
    steps: tuple[StepResult, ...]
    records: tuple[RunRecords, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": "openai-chat" if self.endpoint.chat else "openai",
            "endpoint_type": "openai-chat" if self.endpoint.chat else "openai",
            "base_url": self.endpoint.base, "endpoint": self.endpoint.path,
            "model_id": self.endpoint.model, "dataset_name": self.dataset,
            "tokens_per_word": self.tokens_per_word,
            "steps": [s.to_dict() for s in self.steps],
        }


# ---------------------------------------------------------------- the server's counters


def parse_counters(text: str) -> dict[str, float]:
    """Summed samples of the engine's own families (`vllm:*`, `llamacpp:*`) from a
    Prometheus text page; label sets are added up. Buckets are left out."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    try:
        for fam in text_string_to_metric_families(text):
            if not fam.name.startswith(METRIC_PREFIXES):
                continue
            for s in fam.samples:
                if s.name.endswith("_bucket") or s.name.endswith("_created"):
                    continue
                out[s.name] = out.get(s.name, 0.0) + float(s.value)
    except (ValueError, TypeError, IndexError, KeyError):
        return {}
    return out


def counter_diff(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """After less before for monotone samples (counters, sums, counts); gauges as after."""
    out: dict[str, float] = {}
    for name, value in after.items():
        monotone = name.endswith(("_total", "_sum", "_count"))
        out[name] = value - before.get(name, 0.0) if monotone else value
    return out


async def read_bounded(resp: aiohttp.ClientResponse, limit: int = MAX_METRICS_BYTES) -> bytes:
    """A whole answer, up to `limit` bytes (ValueError past it: a server that streams
    forever costs the client nothing more)."""
    buf = bytearray()
    while chunk := await resp.content.read(65536):
        buf += chunk
        if len(buf) > limit:
            raise ValueError(f"answer over {limit:,} bytes")
    return bytes(buf)


async def read_metrics(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """The server's engine counters, or {} when it has no /metrics (or not in time)."""
    try:
        async with asyncio.timeout(5.0):
            async with session.get(base + "/metrics") as resp:
                if resp.status != 200:
                    return {}
                raw = await read_bounded(resp)
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
        return {}
    return parse_counters(raw.decode("utf-8", "replace"))


# ---------------------------------------------------------------- the run


def new_session(limit: int) -> aiohttp.ClientSession:
    """A connection per request, as vLLM's benchmark opens them (a kept-alive connection the
    server closed while idle fails the next request through no fault of the server; a
    loopback connect costs well under a millisecond against an LLM request's tens), a long
    line limit for SSE, no proxies from the environment (the load goes where it is told)."""
    conn = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, force_close=True)
    return aiohttp.ClientSession(connector=conn, read_bufsize=MAX_LINE_BYTES,
                                 trust_env=False, timeout=aiohttp.ClientTimeout(total=None))


async def model_name(session: aiohttp.ClientSession, base: str) -> str:
    """The first model `/v1/models` lists (vLLM's benchmark does the same)."""
    try:
        async with asyncio.timeout(10.0):
            async with session.get(base + "/v1/models") as resp:
                if resp.status != 200:
                    raise StoreError(f"--url {base}: GET /v1/models answered HTTP "
                                     f"{resp.status}; fix: give the model's name with --model")
                data = json.loads(await read_bounded(resp))
    except TimeoutError as exc:
        raise StoreError(f"--url {base}: no answer from /v1/models in 10 s; fix: check that "
                         "the server is up and listening there") from exc
    except aiohttp.ClientConnectorError as exc:
        raise StoreError(f"--url {base}: cannot connect ({exc.os_error.strerror or exc}); "
                         "fix: start the server or check the URL") from exc
    except (aiohttp.ClientError, ValueError, RecursionError) as exc:
        raise StoreError(f"--url {base}: /v1/models did not answer OpenAI's JSON "
                         f"({type(exc).__name__}); fix: give the model with --model") from exc
    models = data.get("data") if isinstance(data, dict) else None
    if not (isinstance(models, list) and models and isinstance(models[0], dict)
            and isinstance(models[0].get("id"), str)):
        raise StoreError(f"--url {base}: /v1/models listed no model; fix: give --model NAME")
    name: str = models[0]["id"]
    return name


async def tokens_per_word(session: aiohttp.ClientSession, ep: Endpoint, *, seed: int,
                          timeout_s: float) -> float:
    """Two probes of 24 and 96 words asking for 4 tokens each: they check that the server
    streams with usage before the run starts, and the slope of its prompt tokens against
    the words gives its tokens per word (the chat template's and BOS's tokens cancel)."""
    from servelab.measure.llm_workload import words

    vocab = np.array(words())
    rng = np.random.default_rng(seed + 99_991)
    counts = []
    for n_words in (24, 96):
        prompt = " ".join(vocab[rng.integers(0, vocab.size, n_words)])
        counts.append((await probe(session, ep, prompt, timeout_s=timeout_s)).prompt_tokens)
    slope = (counts[1] - counts[0]) / 72
    return min(max(slope, 0.05), 20.0) if slope > 0 else 1.0


async def probe(session: aiohttp.ClientSession, ep: Endpoint, prompt: str, *,
                timeout_s: float) -> StreamTiming:
    """One request asking for 4 tokens; a StoreError naming the fault when it fails."""
    out = StreamTiming()
    body = request_body(chat=ep.chat, model=ep.model, prompt=prompt, max_tokens=4,
                        ignore_eos=True)
    await stream_one(session, ep.base + ep.path, body, max_tokens=4, timeout_s=timeout_s,
                     max_bytes=MAX_RESPONSE_BYTES, out=out)
    if out.error:
        raise StoreError(f"--url {ep.base}{ep.path}: the first request failed ({out.error}); "
                         "fix: check the server, --endpoint and --model")
    return out


# a request not sent because the server had gone silent (run_step), as in measure/loadgen
NOT_SENT_SILENT = "not sent: the server had sent nothing for a request's timeout"


async def run_step(session: aiohttp.ClientSession, ep: Endpoint, requests: list[LlmRequest],
                   plan: LoadPlan, *, seed: int, timeout_s: float, ignore_eos: bool,
                   counter: list[int] | None = None) -> RunRecords:
    """Send every request by `plan`; return each one's raw record (times from the start)."""
    n = len(requests)
    if not 1 <= n <= MAX_PROMPTS:
        raise invalid("--num-prompts", n, f"1 to {MAX_PROMPTS:,}", "send fewer prompts")
    plan.check_span(n)
    offsets = plan.offsets_s(n, seed)
    intended = np.rint(offsets * 1e9).astype(np.int64)
    bodies = [request_body(chat=ep.chat, model=ep.model, prompt=r.prompt,
                           max_tokens=r.max_tokens, ignore_eos=ignore_eos, id_slot=r.id_slot)
              for r in requests]
    outs = [StreamTiming() for _ in range(n)]
    eff_intended = intended.copy()
    slots = asyncio.Semaphore(plan.max_concurrency) if plan.max_concurrency else None
    url = ep.base + ep.path
    t0 = 0
    silent = [False]

    def went_silent(now: int) -> bool:
        """Nothing from the server (a chunk, an answer, an error) for a whole timeout."""
        heard = max((max(o.chunk_ns[-1] if o.chunk_ns else 0,
                         o.done_ns if o.done_ns and not o.error.startswith("timeout") else 0)
                     for o in outs), default=0)
        return now - max(heard, t0) >= timeout_s * 1e9

    async def one(i: int) -> None:
        async with slots if slots is not None else contextlib.nullcontext():
            out = outs[i]
            if silent[0]:  # the server has gone silent: not sent, counted as such
                out.sent_ns = out.done_ns = time.monotonic_ns()
                out.error = NOT_SENT_SILENT
            else:
                if slots is not None:  # waited for a slot: intended is when it freed
                    eff_intended[i] = max(intended[i], time.monotonic_ns() - t0)
                await stream_one(session, url, bodies[i], max_tokens=requests[i].max_tokens,
                                 timeout_s=timeout_s, max_bytes=MAX_RESPONSE_BYTES, out=out)
                if out.error.startswith("timeout") and went_silent(time.monotonic_ns()):
                    silent[0] = True
        if counter is not None:
            counter[0] += 1

    with paused_gc():
        t0 = time.monotonic_ns()
        await send_on_schedule(intended, t0, one)
    skipped = sum(o.error == NOT_SENT_SILENT for o in outs)
    if skipped:  # (silent after every request was out: each has its own reason)
        served = sum(not o.error for o in outs)
        raise StoreError(
            f"--url {ep.base}{ep.path}: the server sent nothing on any stream for "
            f"{timeout_s:g} s (the request timeout); {served:,} of {n:,} requests were "
            f"served and {skipped:,} not sent; fix: check the server's log, it may have "
            "hung")
    return RunRecords(
        intended_ns=eff_intended,
        sent_ns=np.array([o.sent_ns - t0 for o in outs], np.int64),
        done_ns=np.array([o.done_ns - t0 for o in outs], np.int64),
        chunk_ns=tuple(np.array(o.chunk_ns, np.int64) - t0 for o in outs),
        prompt_tokens=np.array([o.prompt_tokens for o in outs], np.int64),
        output_tokens=np.array([o.output_tokens for o in outs], np.int64),
        cached_tokens=np.array([o.cached_tokens for o in outs], np.int64),
        errors=tuple(o.error for o in outs), t0_ns=t0,
        server_prompt_ms=np.array([o.server_prompt_ms for o in outs]),
        server_decode_ms=np.array([o.server_decode_ms for o in outs]))


async def run_load(ep: Endpoint, make_requests: Callable[[float, int], list[LlmRequest]],
                   plans: list[LoadPlan], *, dataset: str, seed: int = 0,
                   timeout_s: float = 600.0, ignore_eos: bool = True,
                   percentiles: tuple[float, ...] = (90.0, 99.0),
                   goodput_ms: dict[str, float] | None = None,
                   counter: list[int] | None = None,
                   on_step: Callable[[StepResult], None] | None = None) -> LlmLoadReport:
    """Probe the server, then run each plan in turn on the requests
    `make_requests(tokens_per_word, step)` builds for it."""
    limit = max((p.max_concurrency for p in plans), default=0) or 1000
    async with new_session(limit) as session:
        if not ep.model:
            ep = Endpoint(ep.base, ep.path, await model_name(session, ep.base))
        tpw = await tokens_per_word(session, ep, seed=seed, timeout_s=timeout_s)
        steps: list[StepResult] = []
        records: list[RunRecords] = []
        for k, plan in enumerate(plans):
            requests = make_requests(tpw, k)
            before = await read_metrics(session, ep.base)
            rec = await run_step(session, ep, requests, plan, seed=seed + k, timeout_s=timeout_s,
                                 ignore_eos=ignore_eos, counter=counter)
            after = await read_metrics(session, ep.base)
            metrics = compute(rec, percentiles=percentiles, goodput_ms=goodput_ms)
            step = StepResult(plan, len(requests), metrics, counter_diff(before, after),
                              client_limited=metrics.send_late_p99_ms > LATE_WARN_MS)
            steps.append(step)
            records.append(rec)
            if on_step is not None:
                on_step(step)
    return LlmLoadReport(ep, dataset, tpw, tuple(steps), tuple(records))
