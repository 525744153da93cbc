"""An LLM load run's figures, with `vllm bench serve`'s definitions and names.

From each request's raw times (ns on one clock), all counted from its *intended* send time
(in an open loop the time its arrival was drawn for; with `--max-concurrency` the later of
that and the moment a slot freed), so a client that sends late cannot hide queueing:

- TTFT: to the first chunk that carries a token;
- ITL: each gap between consecutive token-carrying chunks (its own distribution);
- E2EL: to the end of the stream;
- TPOT: (E2EL − TTFT) / (output tokens − 1), for requests with more than one output token,
  output tokens from the server's `usage`;
- goodput: completed requests meeting every SLO given (`ttft`, `tpot`, `e2el`, in ms; a
  one-token request's TPOT counts as 0, as vLLM counts it) per second of the run;
- throughput: completed requests, output tokens and prompt + output tokens per second of
  the run (`duration`: from the run's start to its last answer);
- `max_output_tokens_per_s` and `max_concurrent_requests`: the busiest whole second, as
  vLLM buckets them (chunks as its token times).

Means, medians, standard deviations (NumPy's population form) and linear-interpolated
percentiles, as vLLM's; the JSON keys are its `--save-result` keys (seconds in the
per-request lists `ttfts` and `itls`, ms elsewhere), plus servelab's own under other names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servelab.errors import invalid

GOODPUT_KEYS = ("ttft", "tpot", "e2el")
METRICS = ("ttft", "tpot", "itl", "e2el")
MAX_PERCENTILES = 20


@dataclass(frozen=True, slots=True)
class RunRecords:
    """One run's raw record per request (the load generator's output; all ns from the run's
    start). `chunk_ns[i]` holds request i's token-carrying chunk times."""

    intended_ns: np.ndarray
    sent_ns: np.ndarray
    done_ns: np.ndarray
    chunk_ns: tuple[np.ndarray, ...]
    prompt_tokens: np.ndarray  # from usage; -1 unknown
    output_tokens: np.ndarray
    cached_tokens: np.ndarray  # -1 when the server does not say
    errors: tuple[str, ...]  # "" for a completed request
    t0_ns: int = 0  # the run's start on time.monotonic_ns(), to match a server's own log
    server_prompt_ms: np.ndarray | None = None  # llama.cpp's own prompt time; -1 unknown
    server_decode_ms: np.ndarray | None = None  # llama.cpp's first to last token; -1 unknown

    @property
    def ok(self) -> np.ndarray:
        good: np.ndarray = np.array([not e for e in self.errors], bool)
        return good

    def to_dict(self) -> dict[str, Any]:
        """Every raw time and count as JSON (ns as integers); `from_dict` reads it back,
        so a run can be scored again offline (`llm validate --out` keeps its steps')."""
        def ints(a: np.ndarray) -> list[int]:
            return [int(x) for x in a]

        def floats(a: np.ndarray | None) -> list[float] | None:
            return None if a is None else [float(x) for x in a]

        return {"t0_ns": self.t0_ns, "intended_ns": ints(self.intended_ns),
                "sent_ns": ints(self.sent_ns), "done_ns": ints(self.done_ns),
                "chunk_ns": [ints(c) for c in self.chunk_ns],
                "prompt_tokens": ints(self.prompt_tokens),
                "output_tokens": ints(self.output_tokens),
                "cached_tokens": ints(self.cached_tokens), "errors": list(self.errors),
                "server_prompt_ms": floats(self.server_prompt_ms),
                "server_decode_ms": floats(self.server_decode_ms)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunRecords:
        """The records `to_dict` wrote."""
        def i64(v: Any) -> np.ndarray:
            return np.array(v, np.int64)

        def f64(v: Any) -> np.ndarray | None:
            return None if v is None else np.array(v, float)

        return cls(i64(d["intended_ns"]), i64(d["sent_ns"]), i64(d["done_ns"]),
                   tuple(i64(c) for c in d["chunk_ns"]), i64(d["prompt_tokens"]),
                   i64(d["output_tokens"]), i64(d["cached_tokens"]),
                   tuple(str(e) for e in d["errors"]), int(d["t0_ns"]),
                   f64(d["server_prompt_ms"]), f64(d["server_decode_ms"]))


@dataclass(frozen=True, slots=True)
class Dist:
    """One metric's summary in ms."""

    mean: float
    median: float
    std: float
    percentiles: tuple[tuple[float, float], ...]

    @classmethod
    def of(cls, values_s: np.ndarray, percentiles: tuple[float, ...]) -> Dist:
        v = values_s if values_s.size else np.zeros(1)  # vLLM reports 0 for none
        return cls(float(np.mean(v)) * 1e3, float(np.median(v)) * 1e3, float(np.std(v)) * 1e3,
                   tuple((p, float(np.percentile(v, p)) * 1e3) for p in percentiles))


def _p_word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


@dataclass(frozen=True, slots=True)
class ServeMetrics:
    """A run's figures (see the module docstring for each definition)."""

    duration_s: float
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    request_goodput: float | None
    output_throughput: float
    total_token_throughput: float
    ttft: Dist
    tpot: Dist
    itl: Dist
    e2el: Dist
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    send_late_p50_ms: float
    send_late_p99_ms: float
    cached_prompt_tokens: int | None  # None when the server never said
    errors_by_reason: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """vLLM's `--save-result` metric keys, then servelab's (`send_late_*`, …)."""
        d: dict[str, Any] = {
            "duration": self.duration_s, "completed": self.completed, "failed": self.failed,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "request_goodput": self.request_goodput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "max_output_tokens_per_s": self.max_output_tokens_per_s,
            "max_concurrent_requests": self.max_concurrent_requests,
        }
        for name in METRICS:
            dist: Dist = getattr(self, name)
            d[f"mean_{name}_ms"] = dist.mean
            d[f"median_{name}_ms"] = dist.median
            d[f"std_{name}_ms"] = dist.std
            for p, value in dist.percentiles:
                d[f"p{_p_word(p)}_{name}_ms"] = value
        d["send_late_p50_ms"] = self.send_late_p50_ms
        d["send_late_p99_ms"] = self.send_late_p99_ms
        d["cached_prompt_tokens"] = self.cached_prompt_tokens
        d["errors_by_reason"] = dict(self.errors_by_reason)
        return d


def parse_goodput(items: list[str]) -> dict[str, float]:
    """`ttft:500 tpot:50` (vLLM's --goodput) into {"ttft": 500.0, "tpot": 50.0} (ms)."""
    out: dict[str, float] = {}
    fix = "e.g. --goodput ttft:500 tpot:50 (ms; keys ttft, tpot, e2el)"
    for item in items:
        for part in item.replace(",", " ").split():
            key, _, value = part.partition(":")
            if key not in GOODPUT_KEYS:
                raise invalid("--goodput", part,
                              f"KEY:MS with KEY one of {', '.join(GOODPUT_KEYS)}", fix)
            try:
                ms = float(value)
            except ValueError:
                ms = math.nan
            if not 0 < ms <= 3_600_000:
                raise invalid("--goodput", part, "a limit above 0 and at most 3,600,000 ms", fix)
            out[key] = ms
    return out


def parse_percentiles(text: str) -> tuple[float, ...]:
    """`90,99` (vLLM's --metric-percentiles) into (90.0, 99.0)."""
    try:
        ps = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        ps = ()
    if not ps or len(ps) > MAX_PERCENTILES or not all(0 < p < 100 for p in ps):
        raise invalid("--metric-percentiles", text, f"1 to {MAX_PERCENTILES} numbers above 0 "
                      "and below 100, comma-separated", "e.g. --metric-percentiles 90,99")
    return ps


def request_times(rec: RunRecords) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each completed request's TTFT (NaN where no token came), E2EL and TPOT (0 where
    it had one output token or none), in s, in the records' order."""
    idx = np.flatnonzero(rec.ok)
    ttft = np.array([(rec.chunk_ns[i][0] - rec.intended_ns[i]) / 1e9
                     if rec.chunk_ns[i].size else math.nan for i in idx])
    e2el = (rec.done_ns[idx] - rec.intended_ns[idx]) / 1e9
    out_tok = rec.output_tokens[idx]
    ttft_or_e2el = np.where(np.isnan(ttft), e2el, ttft)  # a zero-token answer: no first token
    many = out_tok > 1
    tpot = np.zeros(idx.size)
    tpot[many] = (e2el[many] - ttft_or_e2el[many]) / (out_tok[many] - 1)
    return ttft, e2el, tpot


def compute(rec: RunRecords, *, percentiles: tuple[float, ...] = (90.0, 99.0),
            goodput_ms: dict[str, float] | None = None) -> ServeMetrics:
    """The run's figures from its raw records (pure: same records, same figures)."""
    ok = rec.ok
    idx = np.flatnonzero(ok)
    n_ok = int(idx.size)
    duration_s = (float(rec.done_ns.max()) / 1e9) if rec.done_ns.size else 0.0
    ttft, e2el, tpot_all = request_times(rec)
    out_tok = rec.output_tokens[idx]
    ttft_or_e2el = np.where(np.isnan(ttft), e2el, ttft)
    many = out_tok > 1
    itl = (np.concatenate([np.diff(rec.chunk_ns[i]) for i in idx]) / 1e9 if n_ok
           else np.zeros(0))
    good: float | None = None
    if goodput_ms:
        limits = {"ttft": ttft_or_e2el, "tpot": tpot_all, "e2el": e2el}
        meets = np.ones(n_ok, bool)
        for key, ms in goodput_ms.items():
            meets &= limits[key] <= ms / 1e3
        good = int(meets.sum()) / duration_s if duration_s > 0 else 0.0
    total_in = int(rec.prompt_tokens[idx].sum())
    total_out = int(out_tok.sum())
    late = (rec.sent_ns - rec.intended_ns) / 1e6
    errors: dict[str, int] = {}
    for e in rec.errors:
        if e:
            errors[e] = errors.get(e, 0) + 1
    cached = rec.cached_tokens[idx]
    peak_tok, peak_conc = _busiest_second(rec, idx)
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: 0.0)
    return ServeMetrics(
        duration_s=duration_s, completed=n_ok, failed=int(ok.size - n_ok),
        total_input_tokens=total_in, total_output_tokens=total_out,
        request_throughput=per_s(n_ok), request_goodput=good,
        output_throughput=per_s(total_out), total_token_throughput=per_s(total_in + total_out),
        ttft=Dist.of(ttft[~np.isnan(ttft)], percentiles),
        tpot=Dist.of(tpot_all[many], percentiles), itl=Dist.of(itl, percentiles),
        e2el=Dist.of(e2el, percentiles), max_output_tokens_per_s=peak_tok,
        max_concurrent_requests=peak_conc,
        send_late_p50_ms=float(np.percentile(late, 50)) if late.size else 0.0,
        send_late_p99_ms=float(np.percentile(late, 99)) if late.size else 0.0,
        cached_prompt_tokens=int(cached[cached >= 0].sum()) if (cached >= 0).any() else None,
        errors_by_reason=errors)


def _busiest_second(rec: RunRecords, idx: np.ndarray) -> tuple[float, int]:
    """vLLM's peak: chunks per whole second from the first completed request's start, and
    the requests active in that busiest second's bucket row (its max over seconds)."""
    if idx.size == 0:
        return 0.0, 0
    start = rec.intended_ns[idx]
    end = rec.done_ns[idx]
    t0 = int(start.min())
    n_sec = math.ceil((int(end.max()) - t0) / 1e9) + 1
    tokens = np.zeros(n_sec)
    active = np.zeros(n_sec + 1)
    for i, s, e in zip(idx, start, end, strict=True):
        b = ((rec.chunk_ns[i] - t0) // 1_000_000_000).astype(np.int64)
        np.add.at(tokens, b[(b >= 0) & (b < n_sec)], 1)
        active[int((s - t0) // 1_000_000_000)] += 1
        active[int((e - t0) // 1_000_000_000) + 1] -= 1
    return float(tokens.max()), int(np.cumsum(active)[:n_sec].max())
