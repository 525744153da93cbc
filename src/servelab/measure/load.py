"""`servelab load`: measure any Open Inference Protocol v2 server (servelab's gateway,
Triton, KServe) under open-loop load, perf_analyzer style.

Request bodies come from the model's own metadata (random tensors of its input
shapes, batch 1) or from entity keys in a Parquet file; the server's statistics are
read before and after each rate, so mean batch (inferences / executions), queue and
compute time per request come from the server itself.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np

from servelab.errors import InputError, StoreError, cut
from servelab.measure.loadgen import (
    LoadResult,
    constant_offsets,
    http_request,
    poisson_offsets,
    run_closed_loop,
    run_open_loop,
)

# perf_analyzer's CSV header (request-rate mode; with --concurrency the first column holds
# the client count, as perf_analyzer's "Concurrency"); latencies in microseconds.
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
        return f"http://{self.host}:{self.port}"


def parse_url(url: str, model: str) -> Target:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise InputError(f"--url = {cut(url)!r}: expected http://HOST:PORT of a v2 server; "
                         "fix: e.g. --url http://127.0.0.1:8000")
    return Target(parts.hostname, parts.port or 80, model)


def metadata(t: Target) -> dict[str, Any]:
    try:
        r = httpx.get(f"{t.base}/v2/models/{t.model}", timeout=10)
    except httpx.HTTPError as exc:
        raise StoreError(f"--url = {t.base}: cannot reach the server ({exc}); fix: start it, "
                         "or check the address") from None
    if r.status_code != 200:
        raise InputError(f"--model = {t.model!r}: the server answered {r.status_code} "
                         f"({cut(r.text, 150)}); fix: check the model name")
    out: dict[str, Any] = r.json()
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


def server_stats(t: Target) -> dict[str, float] | None:
    """Cumulative counts and times from the server's v2 statistics (None if refused)."""
    try:
        r = httpx.get(f"{t.base}/v2/models/{t.model}/stats", timeout=10)
        s = r.json()["model_stats"][0]
    except (httpx.HTTPError, KeyError, IndexError, ValueError):
        return None
    inf = s["inference_stats"]
    return {"inferences": s["inference_count"], "executions": s["execution_count"],
            "success": inf["success"]["count"], "queue_ns": inf["queue"]["ns"],
            "input_ns": inf["compute_input"]["ns"], "infer_ns": inf["compute_infer"]["ns"],
            "output_ns": inf["compute_output"]["ns"]}


def measure_rate(t: Target, bodies: list[bytes | tuple[bytes, int]], rate: float, n: int,
                 seed: int, max_connections: int, arrival: str = "poisson",
                 concurrency: int | None = None, offsets: np.ndarray | None = None,
                 counter: list[int] | None = None,
                 on_result: Callable[[LoadResult], object] | None = None) -> dict[str, Any]:
    """One step of a sweep: open loop at `rate` (Poisson or constant, or the given
    intended send times), or closed loop with `concurrency` clients; the server's
    statistics before and after. `on_result` gets the per-request result."""
    reqs = []
    for b in bodies:
        body, hlen = b if isinstance(b, tuple) else (b, None)
        headers = {"Inference-Header-Content-Length": str(hlen)} if hlen is not None else None
        reqs.append(http_request(t.host, t.port, f"/v2/models/{t.model}/infer", body,
                                 headers))
    before = server_stats(t)
    cpu0 = cpu_times()
    if concurrency is not None:
        res = asyncio.run(run_closed_loop(t.host, t.port, reqs, concurrency, n,
                                          counter=counter))
    else:
        if offsets is None:
            offsets = (poisson_offsets(rate, n, seed) if arrival == "poisson"
                       else constant_offsets(rate, n))
        res = asyncio.run(run_open_loop(t.host, t.port, reqs, offsets,
                                        max_connections=max_connections, counter=counter))
    cpu1 = cpu_times()
    if on_result is not None:
        on_result(res)
    after = server_stats(t)
    row: dict[str, Any] = {"offered_per_s": rate, "concurrency": concurrency,
                           **res.summary(), "errors_by_reason": dict(res.errors),
                           "behind_requests": int((res.behind_ms > 1.0).sum()),
                           **cpu_use(cpu0, cpu1)}
    if before is not None and after is not None:
        d = {k: after[k] - before[k] for k in after}
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
