"""`servelab load`: measure any Open Inference Protocol v2 server (servelab's gateway,
Triton, KServe) under open-loop load, perf_analyzer style.

Request bodies come from the model's own metadata (random tensors of its input
shapes, batch 1) or from entity keys in a Parquet file; the server's statistics are
read before and after each rate, so mean batch (inferences / executions), queue and
compute time per request come from the server itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servelab.errors import InputError, StoreError, cut, invalid
from servelab.measure.client import base_url, fetch, split_url
from servelab.measure.loadgen import (
    LoadResult,
    constant_offsets,
    http_request,
    poisson_offsets,
    refuse_silent,
    run_closed_loop,
    run_open_loop,
)
from servelab.measure.stability import Stability, joined, take

# perf_analyzer's CSV header in request-rate mode; with --concurrency the first column is
# "Concurrency", as perf_analyzer names it there. Latencies in microseconds. Client Send
# and Client Recv (perf_analyzer's serialization and parse time) are not measured by
# servelab's client, which sends prepared bytes: left blank.
PA_COLUMNS = ("Request Rate", "Inferences/Second", "Client Send", "Network+Server Send/Recv",
              "Server Queue", "Server Compute Input", "Server Compute Infer",
              "Server Compute Output", "Client Recv", "p50 latency", "p90 latency",
              "p95 latency", "p99 latency", "Avg latency")
INT_TYPES = {"INT64": np.int64, "INT32": np.int32, "INT16": np.int16, "INT8": np.int8,
             "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64}
FLOAT_TYPES = {"FP32": np.float32, "FP64": np.float64, "FP16": np.float16}


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int
    model: str

    @property
    def base(self) -> str:
        return base_url("http", self.host, self.port)


def parse_url(url: str, model: str) -> Target:
    u = split_url("--url", url)
    return Target(u.host, u.port, model)


MAX_ROW_ELEMENTS = 1 << 20  # per input, per row: generated request bodies stay bounded


def metadata(t: Target) -> dict[str, Any]:
    """The model's v2 metadata, checked: inputs with a name, a datatype and a shape of
    whole numbers (a server that answers anything else is named, not trusted)."""
    try:
        r = fetch("GET", f"{t.base}/v2/models/{t.model}")
    except StoreError as exc:
        raise StoreError(f"--url = {t.base}: {cut(str(exc).split(': ', 1)[-1], 300)}"
                         ) from None
    if r.status != 200:
        raise InputError(f"--model = {t.model!r}: the server answered {r.status} "
                         f"({r.head()}); fix: check the model name")
    doc = r.json()
    ins = doc.get("inputs") if isinstance(doc, dict) else None
    ok = isinstance(ins, list) and bool(ins) and all(
        isinstance(i, dict) and isinstance(i.get("name"), str)
        and isinstance(i.get("datatype"), str) and isinstance(i.get("shape"), list)
        and i["shape"] and all(type(d) is int and d >= -1 for d in i["shape"])
        and math.prod(max(d, 1) for d in i["shape"][1:]) <= MAX_ROW_ELEMENTS
        for i in ins)
    if not ok:
        raise StoreError(f"--url = {t.base}: GET /v2/models/{cut(t.model, 60)} did not answer "
                         f"v2 model metadata with inputs (name, datatype, shape of at most "
                         f"{MAX_ROW_ELEMENTS:,} values a row): {r.head(60)}; fix: point --url "
                         "at a v2 (Triton/KServe) server")
    out: dict[str, Any] = doc
    return out


def random_bodies(meta: dict[str, Any], n: int, seed: int = 0, binary: bool = False,
                  rows: int = 1) -> list[bytes | tuple[bytes, int]]:
    """Request bodies with random values of each input's datatype and shape (`rows` rows
    each); with `binary`, the binary tensor extension (body, JSON header length)."""
    rng = np.random.default_rng(seed)
    bodies: list[bytes | tuple[bytes, int]] = []
    for _ in range(n):
        inputs = []
        for t in meta["inputs"]:
            shape = [rows, *[d if d > 0 else 1 for d in t["shape"][1:]]]
            dt = t["datatype"]
            if dt in FLOAT_TYPES:
                data = rng.normal(size=shape).astype(FLOAT_TYPES[dt])
            elif dt in INT_TYPES:
                data = rng.integers(1, 100, size=shape).astype(INT_TYPES[dt])
            elif dt == "BOOL":
                data = rng.random(shape) < 0.5
            else:
                raise InputError(f"input {t['name']!r}: datatype {dt} is not generated; "
                                 "fix: give --entities with the values to send")
            inputs.append((t["name"], dt, shape, data))
        if binary:
            head = json.dumps({"inputs": [
                {"name": nm, "datatype": dt, "shape": sh,
                 "parameters": {"binary_data_size": int(d.nbytes)}}
                for nm, dt, sh, d in inputs]}).encode()
            bodies.append((head + b"".join(d.tobytes() for *_, d in inputs), len(head)))
        else:
            bodies.append(json.dumps({"inputs": [
                {"name": nm, "datatype": dt, "shape": sh, "data": d.reshape(-1).tolist()}
                for nm, dt, sh, d in inputs]}).encode())
    return bodies


def entity_bodies(meta: dict[str, Any], path: str, n: int) -> list[bytes]:
    """Bodies carrying entity keys drawn in order from a Parquet file's columns."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:
        raise InputError(f"--entities = {cut(path)!r}: not a readable Parquet file "
                         f"({cut(str(exc), 120)})") from None
    names = [t["name"] for t in meta["inputs"]]
    missing = [c for c in names if c not in table.column_names]
    if missing:
        raise InputError(f"--entities = {cut(path)!r}: no column(s) {missing} for the model's "
                         "inputs; fix: a file with one column per input")
    cols = {c: table.column(c).to_pylist() for c in names}
    rows = table.num_rows
    if rows == 0:
        raise InputError(f"--entities = {cut(path)!r}: no rows")
    dtypes = {t["name"]: t["datatype"] for t in meta["inputs"]}
    return [json.dumps({"inputs": [
        {"name": c, "datatype": dtypes[c], "shape": [1, 1], "data": [cols[c][i % rows]]}
        for c in names]}).encode() for i in range(min(n, rows))]


CpuTimes = tuple[float, float, float, float, int]


def cpu_times() -> CpuTimes:
    """(wall s, this process's CPU s, the machine's busy CPU s, CPU s its hypervisor took
    (steal), CPUs); the machine's figures from Linux's /proc/stat (0 where there is none)."""
    import os
    import resource
    import time

    ru = resource.getrusage(resource.RUSAGE_SELF)
    busy = steal = 0.0
    try:
        with open("/proc/stat") as fh:
            f = [float(x) for x in fh.readline().split()[1:]]
        tick = os.sysconf("SC_CLK_TCK")
        busy = (sum(f[:8]) - f[3] - f[4]) / tick  # all but idle, iowait
        steal = f[7] / tick if len(f) > 7 else 0.0
    except (OSError, ValueError, IndexError):
        busy = steal = 0.0
    return time.monotonic(), ru.ru_utime + ru.ru_stime, busy, steal, os.cpu_count() or 1


def cpu_use(a: CpuTimes, b: CpuTimes) -> dict[str, float]:
    """How busy the machine's CPUs were over a run, how much of their time the hypervisor
    gave to other machines (steal: on a shared virtual machine that time stalls the
    server and the client alike), and how many cores the load generator itself used: on
    one machine the client competes with the server for them."""
    wall = max(b[0] - a[0], 1e-9)
    out = {"client_cpu_cores": (b[1] - a[1]) / wall}
    if b[2] > 0:
        out["host_cpu_busy"] = min((b[2] - a[2]) / wall / b[4], 1.0)
        out["host_cpu_steal"] = min(max((b[3] - a[3]) / wall / b[4], 0.0), 1.0)
    return out


def server_stats(t: Target, tries: int = 3) -> dict[str, float] | None:
    """Cumulative counts and times from the server's v2 statistics (None if refused).
    A transport error is tried again (`tries` in all, 0.5 s apart): a server busy
    finishing the last run's requests can drop one connection, and one dropped read of
    a counter should not end a whole validation."""
    import time

    for attempt in range(tries):
        try:
            doc = fetch("GET", f"{t.base}/v2/models/{t.model}/stats").json()
            break
        except StoreError:
            if attempt == tries - 1:
                return None
            time.sleep(0.5)
    else:
        return None
    try:
        s = doc["model_stats"][0]
        inf = s["inference_stats"]
        out: dict[str, Any] = {
               "inferences": s["inference_count"], "executions": s["execution_count"],
               "success": inf["success"]["count"], "success_ns": inf["success"]["ns"],
               "queue_ns": inf["queue"]["ns"],
               "input_ns": inf["compute_input"]["ns"], "infer_ns": inf["compute_infer"]["ns"],
               "output_ns": inf["compute_output"]["ns"]}
    except (KeyError, IndexError, TypeError):
        return None
    if not all(type(v) is int and v >= 0 for v in out.values()):
        return None  # not Triton's counters: none rather than nonsense
    return out


# Seeds of a step's later windows (see measure/stability.py): window j draws its send
# times from seed + j * WINDOW_SEED; window 0 is the step as it always was.
WINDOW_SEED = 104_729  # (not validate's WARMUP_SEED: a window is not its warm-up)


def measure_rate(t: Target, bodies: list[bytes | tuple[bytes, int]], rate: float, n: int,
                 seed: int, max_connections: int, arrival: str = "poisson",
                 concurrency: int | None = None, offsets: np.ndarray | None = None,
                 counter: list[int] | None = None,
                 on_result: Callable[[LoadResult], object] | None = None,
                 stability: Stability | None = None,
                 around: Callable[[], object] | None = None) -> dict[str, Any]:
    """One step of a sweep: open loop at `rate` (Poisson or constant, or the given
    intended send times), or closed loop with `concurrency` clients; the server's
    statistics before and after. `on_result` gets the per-request result.

    With `stability` on, the step runs window after window until the last three agree
    (measure/stability.py); its figures are then the three windows joined, and
    row["stability"] says how it went. Window 0 sends on `offsets` (or the seed's);
    later Poisson windows draw their own send times, a trace or a closed loop repeats.
    `around` (validate: the server's per-size batch counts) is called before and after
    each window; row["around"] holds the kept windows' (before, after) pairs."""
    reqs = []
    for b in bodies:
        body, hlen = b if isinstance(b, tuple) else (b, None)
        headers = {"Inference-Header-Content-Length": str(hlen)} if hlen is not None else None
        reqs.append(http_request(t.host, t.port, f"/v2/models/{t.model}/infer", body,
                                 headers))
    how = stability if stability is not None else Stability()

    def window(j: int) -> tuple[LoadResult, dict[str, Any]]:
        if counter is not None:
            counter[0] = 0  # a progress bar counts each window afresh
        edge = {"around": around() if around is not None else None,
                "stats": server_stats(t), "cpu": cpu_times()}
        if concurrency is not None:
            res = asyncio.run(run_closed_loop(t.host, t.port, reqs, concurrency, n,
                                              counter=counter))
        else:
            sends = offsets if (offsets is not None and (j == 0 or arrival == "trace")) else (
                poisson_offsets(rate, n, seed + j * WINDOW_SEED) if arrival == "poisson"
                else constant_offsets(rate, n))
            res = asyncio.run(run_open_loop(t.host, t.port, reqs, sends,
                                            max_connections=max_connections,
                                            counter=counter))
        refuse_silent(res, t.base, f"the run at {rate:g}/s" if concurrency is None else
                      f"the closed loop of {concurrency} clients")
        return res, {"before": edge, "after": {
            "cpu": cpu_times(), "stats": server_stats(t),
            "around": around() if around is not None else None}}

    got = take(window, how)
    res = joined(got.used)
    if on_result is not None:
        on_result(res)
    edges = got.used_extras
    row: dict[str, Any] = {"offered_per_s": rate, "concurrency": concurrency,
                           **res.summary(), "errors_by_reason": dict(res.errors),
                           "behind_requests": int((res.behind_ms > 1.0).sum()),
                           **cpu_use(edges[0]["before"]["cpu"], edges[-1]["after"]["cpu"])}
    if how.on:
        row["stability"] = got.summary()
    if around is not None:
        row["around"] = [(e["before"]["around"], e["after"]["around"]) for e in edges]
    pairs = [(e["before"]["stats"], e["after"]["stats"]) for e in edges]
    if all(a is not None and b is not None for a, b in pairs):
        d: dict[str, float] = {}
        for a, b in pairs:
            for k in b:
                d[k] = d.get(k, 0.0) + b[k] - a[k]
        ok = max(d["success"], 1)
        row.update(mean_batch=d["inferences"] / max(d["executions"], 1),
                   server_queue_ms=d["queue_ns"] / ok / 1e6,
                   server_compute_ms=(d["input_ns"] + d["infer_ns"] + d["output_ns"]) / ok / 1e6,
                   compute_input_ms=d["input_ns"] / ok / 1e6,
                   compute_infer_ms=d["infer_ns"] / ok / 1e6,
                   compute_output_ms=d["output_ns"] / ok / 1e6)
    return row


def perf_analyzer_row(r: dict[str, Any]) -> list[str]:
    """One CSV row with perf_analyzer's columns (microseconds); unmeasured ones blank."""
    def us(key: str) -> str:
        v = r.get(key)
        return "" if v is None or not np.isfinite(v) else f"{v * 1e3:.0f}"

    net = ""
    if "server_compute_ms" in r and np.isfinite(r["mean_ms"]):
        net = f"{(r['mean_ms'] - r['server_queue_ms'] - r['server_compute_ms']) * 1e3:.0f}"
    first = str(r["concurrency"]) if r.get("concurrency") else f"{r['offered_per_s']:g}"
    return [first, f"{r['achieved_per_s']:.1f}", "", net,
            us("server_queue_ms"), us("compute_input_ms"), us("compute_infer_ms"),
            us("compute_output_ms"), "", us("p50_ms"), us("p90_ms"), us("p95_ms"),
            us("p99_ms"), us("mean_ms")]


# ---------------------------------------------------------------- the typed run


MAX_STEPS = 100
MAX_RUN_REQUESTS = 2_000_000


@dataclass(frozen=True, slots=True)
class LoadStep:
    """One rate (or client count) of a `load` run: the client's figures, how busy the
    machine was, and the server's own statistics over the step when it has them."""

    offered_per_s: float
    concurrency: int | None
    requests: int
    ok: int
    errors: int
    achieved_per_s: float
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    behind_p99_ms: float
    p50_growth: float
    errors_by_reason: dict[str, int]
    behind_requests: int
    cpu: dict[str, float]  # client_cpu_cores, host_cpu_busy, host_cpu_steal
    server: dict[str, float]  # mean_batch, server_queue_ms, server_compute_ms, compute_*_ms
    drawn_per_s: float = 0.0  # the rate the drawn send times ask for
    wait_gaps: int = 0  # ~500 ms with requests waiting and no answer (see gaps.py)
    wait_gap_s: float = 0.0
    # with --stability-percentage: the windows run and whether the last three agreed
    # (measure/stability.py); None: one window, unchecked
    stability: dict[str, Any] | None = None

    @classmethod
    def of(cls, row: dict[str, Any]) -> LoadStep:
        """From `measure_rate`'s row."""
        cpu: dict[str, float] = {k: row[k] for k in (
            "client_cpu_cores", "host_cpu_busy", "host_cpu_steal") if k in row}
        server: dict[str, float] = {k: row[k] for k in SERVER_KEYS if k in row}
        return cls(row["offered_per_s"], row["concurrency"], row["requests"], row["ok"],
                   row["errors"], row["achieved_per_s"], row["mean_ms"], row["p50_ms"],
                   row["p90_ms"], row["p95_ms"], row["p99_ms"], row["behind_p99_ms"],
                   row["p50_growth"], dict(row["errors_by_reason"]), row["behind_requests"],
                   cpu, server, row.get("drawn_per_s", 0.0), row.get("wait_gaps", 0),
                   row.get("wait_gap_s", 0.0), row.get("stability"))

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON keys (`servelab load --json`): the row `measure_rate` gives."""
        return {"offered_per_s": self.offered_per_s, "concurrency": self.concurrency,
                "requests": self.requests, "ok": self.ok, "errors": self.errors,
                "achieved_per_s": self.achieved_per_s, "drawn_per_s": self.drawn_per_s,
                "mean_ms": self.mean_ms, "p50_ms": self.p50_ms, "p90_ms": self.p90_ms,
                "p95_ms": self.p95_ms, "p99_ms": self.p99_ms,
                "behind_p99_ms": self.behind_p99_ms, "p50_growth": self.p50_growth,
                "wait_gaps": self.wait_gaps, "wait_gap_s": self.wait_gap_s,
                "errors_by_reason": dict(self.errors_by_reason),
                "behind_requests": self.behind_requests, **self.cpu, **self.server,
                **({"stability": dict(self.stability)} if self.stability is not None else {})}


SERVER_KEYS = ("mean_batch", "server_queue_ms", "server_compute_ms", "compute_input_ms",
               "compute_infer_ms", "compute_output_ms")


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """What a `load` run sends: one of `rates` (open loop), `concurrency` (closed loop) or a
    recorded `trace_s`; each checked on construction, with the flag's name."""

    rates: tuple[float, ...] = ()
    concurrency: tuple[int, ...] = ()
    trace_s: np.ndarray | None = None
    arrival: str = "poisson"
    duration_s: float = 10.0
    num_requests: int | None = None
    connections: int = 256
    # one window a step unless a percentage is given
    stability: Stability = field(default_factory=Stability)

    def __post_init__(self) -> None:
        if self.arrival not in ("poisson", "constant", "trace"):
            raise invalid("--arrival", self.arrival, "poisson, constant or trace",
                          "use --arrival poisson")
        if (self.arrival == "trace") != (self.trace_s is not None):
            raise invalid("--arrival trace/--trace", self.arrival, "both or neither",
                          "give --arrival trace --trace arrivals.csv")
        if self.trace_s is not None and (self.trace_s.size > MAX_RUN_REQUESTS
                                         or self.trace_s[-1] > 3600):
            raise invalid("--trace", f"{self.trace_s.size:,} arrivals", "at most 2,000,000 "
                          "arrivals within 3,600 s", "cut the trace")
        if bool(self.rates) == bool(self.concurrency):
            raise invalid("--qps/--rates/--concurrency", (self.rates, self.concurrency),
                          "exactly one of them", "give --qps 500, --rates 100,200,400 or "
                          "--concurrency 1,2,4")
        if self.rates and (len(self.rates) > MAX_STEPS
                           or not all(0 < r <= 1e6 for r in self.rates)):
            raise invalid("--rates", self.rates, f"1 to {MAX_STEPS} rates from above 0 to "
                          "1e6 per second", "e.g. --rates 100,200,400")
        if self.concurrency and (len(self.concurrency) > MAX_STEPS
                                 or not all(1 <= c <= 1024 for c in self.concurrency)):
            raise invalid("--concurrency", self.concurrency, f"1 to {MAX_STEPS} counts from "
                          "1 to 1024", "e.g. --concurrency 1,2,4")
        if self.concurrency and self.num_requests is None:
            raise invalid("--num-requests", None, "a count with --concurrency",
                          "e.g. --concurrency 4 --num-requests 2000")
        if not 0 < self.duration_s <= 3600:
            raise invalid("--duration", self.duration_s, "seconds from above 0 to 3600",
                          "e.g. 10")
        if self.num_requests is not None and not 1 <= self.num_requests <= MAX_RUN_REQUESTS:
            raise invalid("--num-requests", self.num_requests, "1 to 2,000,000", "e.g. 5000")
        if not 1 <= self.connections <= 10_000:
            raise invalid("--connections", self.connections, "1 to 10,000", "e.g. 256")

    def steps(self) -> list[tuple[float, int | None, np.ndarray | None, int]]:
        """(rate, clients, intended offsets or None, requests) for each step."""
        out = []
        for rate, c in zip(self.rates or [0.0] * len(self.concurrency),
                           self.concurrency or [None] * len(self.rates), strict=True):
            offsets = None
            if self.trace_s is not None:
                offsets = self.trace_s[:self.num_requests] if self.num_requests else self.trace_s
            n = (offsets.size if offsets is not None
                 else (self.num_requests or max(1, int(rate * self.duration_s))))
            if n > MAX_RUN_REQUESTS:
                raise invalid("--duration", self.duration_s, "a run of at most 2,000,000 "
                              f"requests ({n:,} at {rate:g}/s)", "shorten --duration")
            out.append((rate, c, offsets, n))
        return out


@dataclass(frozen=True, slots=True)
class LoadReport:
    """A whole `load` run: where it went and each step."""

    base_url: str
    model: str
    steps: tuple[LoadStep, ...]

    def to_dict(self) -> list[dict[str, Any]]:
        """`servelab load --json`: one object per step."""
        return [s.to_dict() for s in self.steps]


def run_load(url: str, model: str, spec: LoadSpec, *, entities: str | None = None,
             binary: bool = False, seed: int = 0,
             each_step: Callable[[str, int], contextlib.AbstractContextManager[list[int]]]
             | None = None,
             on_step: Callable[[LoadStep], None] | None = None) -> LoadReport:
    """Load a v2 server step by step as `spec` says. Each step runs inside
    `each_step(what, n)`, whose counter the run increments per answer (a progress bar)."""
    plan = spec.steps()  # every step's size checked before the server is touched
    target = parse_url(url, model)
    meta = metadata(target)
    bodies: list[bytes | tuple[bytes, int]] = (
        list(entity_bodies(meta, entities, 4096)) if entities is not None
        else random_bodies(meta, 256, seed, binary=binary))
    steps = []
    for rate, c, offsets, n in plan:
        what = f"{c} clients" if c else ("the trace" if offsets is not None else f"{rate:g}/s")
        with (each_step(what, n) if each_step is not None
              else contextlib.nullcontext([0])) as counter:
            step = LoadStep.of(measure_rate(target, bodies, rate, n, seed, spec.connections,
                                            spec.arrival, c, offsets=offsets,
                                            counter=counter, stability=spec.stability))
        steps.append(step)
        if on_step is not None:
            on_step(step)
    return LoadReport(target.base, model, tuple(steps))
