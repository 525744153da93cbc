"""The gateway's HTTP side: Open Inference Protocol v2 routes as Triton serves them,
Triton's statistics and Prometheus metrics, over models batched by ``AsyncBatcher``.

Safe by default as the lab is: loopback hosts only (403 otherwise), errors as one JSON
line with Triton's status codes. A request costs what its tensors are worth: a body
longer than the model's largest valid request is refused from its Content-Length (413)
before it is read, bodies in flight are bounded in total (503), and a large body is
parsed off the event loop, one at a time, so small requests wait at most its parse.
"""

from __future__ import annotations

import asyncio
import functools
import math
import re
import threading
import time
import zlib
from collections import defaultdict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from servelab.errors import InputError, ServelabError, StoreError, cut
from servelab.gateway.batcher import AsyncBatcher
from servelab.gateway.drift_monitor import DriftMonitor
from servelab.gateway.join import FeatureJoin
from servelab.gateway.log import ServedLog
from servelab.gateway.protocol import (
    InferRequest,
    build_response,
    max_request_bytes,
    parse_request,
)
from servelab.gateway.runner import OnnxModel, Timing
from servelab.http import (
    LOOPBACK_HOSTS,
    BodyLimits,
    GuardMiddleware,
    error_body,
    error_response,
    json_response,
)
from servelab.scenario import BatchingPolicy
from servelab.trace_file import TraceWriter

_T = TypeVar("_T")

disable_created_metrics()  # type: ignore[no-untyped-call]  # Triton has no *_created
OTHER_BODY_BYTES = 1024 * 1024  # any route but infer: none reads a body
INLINE_PARSE_BYTES = 256 * 1024  # a larger body is parsed on the parse thread
# Fine enough to read a p99 between 0.1 ms and 10 s.
LATENCY_BUCKETS_S = (*(round(b * 10.0**e, 9) for e in range(-4, 1)
                       for b in (1, 1.5, 2, 3, 5, 7)), 10.0)


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, n: int = 1) -> None:
        self.count += n
        self.ns += ns

    def json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class ModelStats:
    """Triton's /v2/models/{m}/stats figures, kept as Triton keeps them."""

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    batches: dict[int, tuple[Duration, Duration, Duration]] = field(
        default_factory=lambda: defaultdict(lambda: (Duration(), Duration(), Duration())))


# Triton's own metric names (no "_total": Triton's prometheus-cpp exposition has none).
TRITON_METRICS = {
    "nv_inference_request_success": "Number of successful inference requests, all batch sizes",
    "nv_inference_request_failure": "Number of failed inference requests, all batch sizes",
    "nv_inference_count": "Number of inferences performed (rows)",
    "nv_inference_exec_count": "Number of model executions performed (batches)",
    "nv_inference_request_duration_us": "Cumulative inference request duration in microseconds",
    "nv_inference_queue_duration_us": "Cumulative inference queuing duration in microseconds",
    "nv_inference_compute_input_duration_us": "Cumulative compute input duration in microseconds",
    "nv_inference_compute_infer_duration_us": "Cumulative compute inference duration in "
                                              "microseconds",
    "nv_inference_compute_output_duration_us": "Cumulative inference compute output duration "
                                               "in microseconds",
    "nv_inference_pending_request_count": "Instantaneous number of pending requests awaiting "
                                          "execution per-model",
}


# Triton's latency summaries (`--metrics-config summary_latencies=true`; here
# `--summary-latencies`): per request, the quantiles over a sliding window.
TRITON_SUMMARIES = {
    "nv_inference_request_summary_us": "Summary of inference request duration in "
                                       "microseconds (includes cached requests)",
    "nv_inference_queue_summary_us": "Summary of inference queuing duration in microseconds "
                                     "(includes cached requests)",
    "nv_inference_compute_input_summary_us": "Cumulative compute input duration in "
                                             "microseconds (does not include cached requests)",
    "nv_inference_compute_infer_summary_us": "Cumulative compute inference duration in "
                                             "microseconds (does not include cached requests)",
    "nv_inference_compute_output_summary_us": "Cumulative inference compute output duration "
                                              "in microseconds (does not include cached "
                                              "requests)",
}
SUMMARY_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)  # Triton's
SUMMARY_WINDOW_S = 60.0  # the quantiles' window
SUMMARY_MAX_SAMPLES = 10_000  # per model and summary: the window's memory is bounded


class _Summary:
    """One summary series: count and sum over all time, and the samples of the last
    SUMMARY_WINDOW_S (the latest SUMMARY_MAX_SAMPLES of them) for its quantiles."""

    __slots__ = ("count", "times", "total", "values")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.times: deque[float] = deque(maxlen=SUMMARY_MAX_SAMPLES)
        self.values: deque[float] = deque(maxlen=SUMMARY_MAX_SAMPLES)

    def observe(self, value: float, times: int, now: float) -> None:
        self.count += times
        self.total += value * times
        k = min(times, SUMMARY_MAX_SAMPLES)
        self.times.extend([now] * k)
        self.values.extend([value] * k)

    def window(self, now: float) -> np.ndarray:
        """The window's samples (a copy: the quantiles are taken outside the lock)."""
        while self.times and self.times[0] < now - SUMMARY_WINDOW_S:
            self.times.popleft()
            self.values.popleft()
        return np.array(self.values, dtype=np.float64)


def _quantiles(values: np.ndarray) -> list[float]:
    if not values.size:
        return [math.nan] * len(SUMMARY_QUANTILES)
    return [float(q) for q in np.quantile(values, SUMMARY_QUANTILES)]


# The failure reasons Triton 2.51 exposes, each from 0 as soon as the model is loaded.
FAILURE_REASONS = ("OTHER", "BACKEND", "CANCELED", "REJECTED")
_GAUGES = {"nv_inference_pending_request_count"}


class _TritonMetrics:
    """Triton's counters (and summaries) under Triton's exact names, types and labels.

    prometheus_client names a counter family "<name>_total" in its HELP and TYPE lines;
    Triton's (prometheus-cpp) has no suffix, and its dashboards query the bare names. So
    these families are kept here and written by `exposition`, typed as Triton types them
    (counters, one gauge, summaries), beside prometheus_client's own registry.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = defaultdict(float)
        self.summaries: dict[tuple[str, tuple[tuple[str, str], ...]], _Summary] | None = None

    def enable_summaries(self) -> None:
        self.summaries = {}

    def observe(self, name: str, labels: dict[str, str], value: float, times: int = 1
                ) -> None:
        """A summary's sample (`times` requests of `value`), when summaries are on."""
        if self.summaries is None:
            return
        key = (name, tuple(sorted(labels.items())))
        with self.lock:
            got = self.summaries.get(key)
            if got is None:
                got = self.summaries[key] = _Summary()
            got.observe(value, times, time.monotonic())

    def add_model(self, labels: dict[str, str]) -> None:
        """Every series of a model at 0, as Triton has them once it is loaded."""
        if self.summaries is not None:
            for name in TRITON_SUMMARIES:
                self.summaries[(name, tuple(sorted(labels.items())))] = _Summary()
        for name in TRITON_METRICS:
            if name == "nv_inference_request_failure":
                for reason in FAILURE_REASONS:
                    self.inc(name, {**labels, "reason": reason}, 0.0)
            else:
                self.inc(name, labels, 0.0)

    def exposition(self) -> bytes:
        """Triton's families in the Prometheus text format."""
        with self.lock:
            items = sorted(self.values.items())
        lines = []
        for name, doc in TRITON_METRICS.items():
            lines += [f"# HELP {name} {doc}",
                      f"# TYPE {name} {'gauge' if name in _GAUGES else 'counter'}"]
            for (n, labels), v in items:
                if n == name:
                    lines.append(f"{name}{{{_labels_text(labels)}}} {_number(v)}")
        if self.summaries is not None:
            lines += self._summary_lines()
        return ("\n".join(lines) + "\n").encode()

    def _summary_lines(self) -> list[str]:
        assert self.summaries is not None
        now = time.monotonic()
        with self.lock:
            snap = sorted((k, s.count, s.total, s.window(now))
                          for k, s in self.summaries.items())
        items = [(k, count, total, _quantiles(w)) for k, count, total, w in snap]
        lines = []
        for name, doc in TRITON_SUMMARIES.items():
            lines += [f"# HELP {name} {doc}", f"# TYPE {name} summary"]
            for (n, labels), count, total, qs in items:
                if n != name:
                    continue
                text = _labels_text(labels)
                lines += [f"{name}_count{{{text}}} {count}",
                          f"{name}_sum{{{text}}} {_number(total)}"]
                lines += [f'{name}{{{text},quantile="{q:g}"}} {_number(v)}'
                          for q, v in zip(SUMMARY_QUANTILES, qs, strict=True)]
        return lines

    def inc(self, name: str, labels: dict[str, str], amount: float = 1.0) -> None:
        self.add(tuple(sorted(labels.items())), (name, amount))

    def add(self, labels: tuple[tuple[str, str], ...], *amounts: tuple[str, float]) -> None:
        """Several counters of one series' labels (sorted, as `inc` keys them) at once:
        the per-request path takes the lock once and sorts nothing."""
        values = self.values
        with self.lock:
            for name, amount in amounts:
                values[(name, labels)] += amount

    def set(self, name: str, labels: dict[str, str], value: float) -> None:
        with self.lock:
            self.values[(name, tuple(sorted(labels.items())))] = value



def _number(v: float) -> str:
    """A sample value as Triton writes it: whole numbers without a point (34)."""
    v = float(v)
    if math.isnan(v):
        return "NaN"
    return str(int(v)) if v.is_integer() else repr(v)


def _labels_text(labels: tuple[tuple[str, str], ...]) -> str:
    """Labels as the text format writes them inside the braces (values escaped)."""
    return ",".join(f'{k}="{_escape(v)}"' for k, v in labels)


def _escape(value: str) -> str:
    """A label value as the text format writes it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Metrics:
    """Prometheus metrics: Triton's counters by Triton's names and labels, plus servelab's
    histograms (fine enough buckets to read a p99)."""

    def __init__(self, summary_latencies: bool = False) -> None:
        self.registry = CollectorRegistry()
        self.triton = _TritonMetrics()  # exposed by its own `exposition`
        if summary_latencies:
            self.triton.enable_summaries()
        r, labels = self.registry, ["model", "version"]
        self.request_s = Histogram("servelab_request_duration_seconds",
                                   "Request duration in the gateway (s)", labels,
                                   buckets=LATENCY_BUCKETS_S, registry=r)
        self.queue_s = Histogram("servelab_queue_duration_seconds",
                                 "Time queued before the batch started (s)", labels,
                                 buckets=LATENCY_BUCKETS_S, registry=r)
        self.batch_size = Histogram("servelab_batch_size", "Requests per executed batch",
                                    labels, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
                                    registry=r)
        self.fetch_s = Histogram("servelab_feature_fetch_seconds",
                                 "Online feature read per batch (s)", labels,
                                 buckets=LATENCY_BUCKETS_S, registry=r)
        self.missing = Counter("servelab_feature_missing", "Feature values not present in "
                               "the online store (missing or expired)",
                               [*labels, "feature", "status"], registry=r)
        self.log_dropped = Gauge("servelab_served_log_dropped",
                                 "Served rows dropped because the log writer fell behind",
                                 labels, registry=r)
        self.log_written = Gauge("servelab_served_log_rows",
                                 "Served rows written to the log", labels, registry=r)
        drift_labels = [*labels, "feature"]
        self.psi = Gauge("servelab_feature_psi", "PSI of the served window of a feature "
                         "against the drift reference", drift_labels, registry=r)
        self.psi_chance = Gauge("servelab_feature_psi_chance_p99", "PSI that two samples of "
                                "one distribution exceed 1 time in 100 at these sizes",
                                drift_labels, registry=r)
        self.drift_status = Gauge("servelab_feature_drift_status", "0 ok, 1 warn, 2 alert "
                                  "(warn and alert only above the chance level)",
                                  drift_labels, registry=r)

    def inc(self, name: str, labels: dict[str, str], amount: float = 1.0) -> None:
        self.triton.inc(name, labels, amount)


class ServedModel:
    """One model: its runner, batching policy, batcher, statistics; with a feature join,
    requests carry entity keys and the model's input is built from the online store."""

    def __init__(self, model: OnnxModel, policy: BatchingPolicy, instances: int,
                 metrics: Metrics, join: FeatureJoin | None = None,
                 log: ServedLog | None = None, drift: DriftMonitor | None = None,
                 trace: TraceWriter | None = None, dynamic_batching: bool = True,
                 version: str = "1", class_labels: dict[str, tuple[str, ...]] | None = None,
                 version_policy: dict[str, Any] | None = None) -> None:
        self.model = model
        self.version = version
        # as Triton's config reports it; its default serves the highest version alone
        self.version_policy = version_policy or {"latest": {"num_versions": 1}}
        self.class_labels = class_labels or {}  # output -> its label file's lines
        self.policy = policy
        self.dynamic_batching = dynamic_batching
        self.instances = instances
        self.join = join
        self.log = log
        if join is not None and (len(model.inputs) != 1
                                 or model.inputs[0].shape[1:] != (len(join.pairs),)):
            raise InputError(
                f"model {model.name!r}: inputs {[list(t.shape) for t in model.inputs]}; "
                f"expected one input of shape [-1, {len(join.pairs)}] for feature service "
                f"{join.service!r}; fix: export the model over the service's features")
        self.inputs = join.inputs if join is not None else model.inputs
        self.max_request_bytes = max_request_bytes(self.inputs, policy.max_batch_size)
        # The labelled children, bound once (labels() on every request costs more).
        lab = {"model": model.name, "version": version}
        self.request_hist = metrics.request_s.labels(**lab)
        self.queue_hist = metrics.queue_s.labels(**lab)
        self.stats = ModelStats()
        self.metrics = metrics
        self.labels = {"model": model.name, "version": version}
        self.label_key = tuple(sorted(self.labels.items()))  # _TritonMetrics.add's
        metrics.triton.add_model(self.labels)
        self.lock = threading.Lock()
        self.batcher = AsyncBatcher(
            policy, instances, self._execute,
            on_request=None if trace is None else functools.partial(trace.add, model.name),
            dynamic=dynamic_batching)
        self.drift = drift
        if drift is not None:
            drift.on_report.append(self._publish_drift)
            drift.start()

    def _publish_drift(self, report: Any) -> None:
        m, lab = self.metrics, self.labels
        for f in report.features:
            m.psi.labels(**lab, feature=f.feature).set(f.psi)
            m.psi_chance.labels(**lab, feature=f.feature).set(f.chance_psi_p99)
            m.drift_status.labels(**lab, feature=f.feature).set(
                ("ok", "warn", "alert").index(f.status))

    def _execute(self, requests: list[dict[str, np.ndarray]]) -> list[Any]:
        if self.join is not None:
            return self._execute_joined(requests)
        outs, timing = self.model.run(requests)
        self._record(requests, timing)
        return [(o, timing) for o in outs]

    def _execute_joined(self, requests: list[dict[str, np.ndarray]]) -> list[Any]:
        assert self.join is not None
        jr = self.join.join(requests)
        lab = self.labels
        self.metrics.fetch_s.labels(**lab).observe(jr.fetch_s)
        for (feat, status), k in jr.missing.items():
            self.metrics.missing.labels(**lab, feature=feat, status=status).inc(k)
        results: list[Any] = [jr.errors.get(i) for i in range(len(requests))]
        if not jr.kept:
            return results
        kept = [requests[i] for i in jr.kept]
        if self.drift is not None:
            self.drift.add(jr.features)
        outs, timing = self.model.run([{self.model.inputs[0].name: jr.features}])
        self._record(kept, timing)
        at = 0
        now_us = time.time_ns() // 1000
        for i, served in zip(jr.kept, jr.values, strict=True):
            rows = next(iter(requests[i].values())).shape[0]
            part = {k: v[at:at + rows] for k, v in outs[0].items()}
            at += rows
            results[i] = (part, timing)
            if self.log is not None:
                keys = {k: np.asarray(requests[i][k]).reshape(-1).tolist()
                        for k in self.join.join_keys}
                pred = {k: v.reshape(v.shape[0], -1).tolist() for k, v in part.items()}
                for r in range(rows):
                    self.log.append({"request_time": now_us, "model": self.model.name,
                                     **{k: keys[k][r] for k in keys}, **served[r],
                                     **{f"pred_{k}": v[r] for k, v in pred.items()}})
        return results

    def _record(self, requests: list[dict[str, np.ndarray]], timing: Timing) -> None:
        n = len(requests)
        rows = sum(next(iter(r.values())).shape[0] for r in requests)
        with self.lock:  # worker threads record the batch as Triton's batch_stats does
            s = self.stats
            s.execution_count += 1
            s.inference_count += rows
            # each request is credited with its batch's time, as Triton does
            s.compute_input.add(timing.input_ns * n, n)
            s.compute_infer.add(timing.infer_ns * n, n)
            s.compute_output.add(timing.output_ns * n, n)
            b_in, b_inf, b_out = s.batches[rows]  # keyed by rows, as Triton's are
            b_in.add(timing.input_ns)
            b_inf.add(timing.infer_ns)
            b_out.add(timing.output_ns)
        m, lab = self.metrics, self.labels
        m.triton.add(self.label_key, ("nv_inference_exec_count", 1.0),
                     ("nv_inference_count", rows),
                     ("nv_inference_compute_input_duration_us", timing.input_ns * n / 1e3),
                     ("nv_inference_compute_infer_duration_us", timing.infer_ns * n / 1e3),
                     ("nv_inference_compute_output_duration_us", timing.output_ns * n / 1e3))
        m.batch_size.labels(**lab).observe(n)
        if m.triton.summaries is not None:  # per request, as Triton's
            m.triton.observe("nv_inference_compute_input_summary_us", lab,
                             timing.input_ns / 1e3, n)
            m.triton.observe("nv_inference_compute_infer_summary_us", lab,
                             timing.infer_ns / 1e3, n)
            m.triton.observe("nv_inference_compute_output_summary_us", lab,
                             timing.output_ns / 1e3, n)

    def metadata_json(self, versions: list[str]) -> dict[str, Any]:
        """The model's metadata in the v2 protocol's JSON form, listing `versions`."""
        def tensors(ts: Any) -> list[dict[str, Any]]:
            return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
                    for t in ts]

        return {"name": self.model.name, "versions": versions, "platform": "onnxruntime_onnx",
                "inputs": tensors(self.inputs), "outputs": tensors(self.model.outputs)}

    def config_json(self) -> dict[str, Any]:
        """The model's configuration in Triton's JSON form (GET .../config)."""
        p = self.policy

        def tensors(ts: Any) -> list[dict[str, Any]]:
            return [{"name": t.name, "data_type": f"TYPE_{t.datatype}",
                     "dims": list(t.shape[1:])} for t in ts]

        policy: dict[str, Any] = {"max_queue_size": p.max_queue_size}
        if p.default_timeout_microseconds:
            policy.update(timeout_action="REJECT",
                          default_timeout_microseconds=p.default_timeout_microseconds)
        config: dict[str, Any] = {
            "name": self.model.name, "platform": "onnxruntime_onnx",
            "backend": "onnxruntime", "version_policy": self.version_policy,
            "max_batch_size": p.max_batch_size,
            "input": tensors(self.inputs), "output": tensors(self.model.outputs),
            "instance_group": [{"name": f"{self.model.name}_0", "count": self.instances,
                                "kind": "KIND_CPU"}],
        }
        if self.dynamic_batching:
            config["dynamic_batching"] = {
                "preferred_batch_size": list(p.preferred_batch_size),
                "max_queue_delay_microseconds": p.max_queue_delay_microseconds,
                "default_queue_policy": policy,
            }
        return config

    def stats_json(self) -> dict[str, Any]:
        s = self.stats
        with self.lock:
            batch_stats = [{"batch_size": b, "compute_input": d[0].json(),
                            "compute_infer": d[1].json(), "compute_output": d[2].json()}
                           for b, d in sorted(s.batches.items())]
            inference = {k: getattr(s, k).json() for k in (
                "success", "fail", "queue", "compute_input", "compute_infer",
                "compute_output")}
            counts = (s.inference_count, s.execution_count)
        inference["cache_hit"] = {"count": 0, "ns": 0}
        inference["cache_miss"] = {"count": 0, "ns": 0}
        return {"name": self.model.name, "version": self.version,
                "last_inference": s.last_inference_ms,
                "inference_count": counts[0], "execution_count": counts[1],
                "inference_stats": inference, "batch_stats": batch_stats}


class ModelVersions:
    """The served versions of one model (each a ServedModel with its own batcher and
    statistics, as Triton loads each version), by version; a request that names no
    version goes to the highest, as Triton sends it."""

    def __init__(self, versions: list[ServedModel]) -> None:
        ordered = sorted(versions, key=lambda sm: (len(sm.version), sm.version))
        self.by_version = {sm.version: sm for sm in ordered}
        self.latest = ordered[-1]
        self.max_request_bytes = max(sm.max_request_bytes for sm in ordered)

    def get(self, version: str | None) -> ServedModel | None:
        """The model at `version` (None or "": the highest), or None if not served."""
        return self.latest if not version else self.by_version.get(version)

    @property
    def versions(self) -> list[str]:
        return list(self.by_version)


def every_version(models: dict[str, ModelVersions]) -> list[ServedModel]:
    """Every served model version, model by model."""
    return [sm for mv in models.values() for sm in mv.by_version.values()]


def by_model(models: list[ServedModel]) -> dict[str, ModelVersions]:
    """Served models grouped by name; one version given twice is refused."""
    groups: dict[str, list[ServedModel]] = defaultdict(list)
    for sm in models:
        if any(o.version == sm.version for o in groups[sm.model.name]):
            raise InputError(f"model {sm.model.name!r} version {sm.version} is given twice; "
                             "fix: one path per model version")
        groups[sm.model.name].append(sm)
    return {name: ModelVersions(vs) for name, vs in groups.items()}


# The protocol extensions served, named as Triton names them (load/unload answer as
# Triton's default model control mode does).
EXTENSIONS = ("classification", "model_repository", "model_configuration",
              "binary_tensor_data", "statistics")
# Triton's answer to load/unload when it serves the repository it started with (its
# default model control mode), the gateway's always: it never loads a model later.
MODEL_CONTROL_REFUSED = ("explicit model load / unload is not allowed: the gateway serves "
                         "the models it started with (Triton's model control mode NONE); "
                         "fix: restart servelab serve with the repository you want")


_INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$")
INFER_MATCH = "servelab.infer"  # the scope's key for _INFER_PATH's match, made once


class BodyTooLargeError(InputError):
    pass


class UnsupportedEncodingError(InputError):
    """415, as RFC 9110 says for a content coding the server does not know (Triton 2.51
    answers 501, a server error, which this project's servers do not use for a client's
    request)."""


ENCODINGS = {"gzip": 31, "deflate": 15}  # zlib's wbits to compress: gzip, zlib headers
INFLATE_WBITS = 47  # to inflate either (Triton takes gzip data sent as deflate too)


def decompressed(body: bytes, encoding: str, limit: int) -> bytes:
    """A request body sent with Content-Encoding gzip or deflate (zlib), as Triton takes
    them, inflated to at most `limit` bytes (the model's largest valid request): a small
    body that inflates past it is refused before it takes that memory."""
    if encoding not in ENCODINGS:
        raise UnsupportedEncodingError(
            f"Content-Encoding {cut(encoding, 40)!r}: not supported; fix: send gzip, deflate "
            "or an uncompressed body")
    d = zlib.decompressobj(wbits=INFLATE_WBITS)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InputError(f"Content-Encoding {encoding}: the body is not {encoding} data "
                         f"({exc}); fix: compress the whole body once") from None
    if len(out) > limit:
        raise BodyTooLargeError(f"the request body inflates past {limit} bytes, the largest "
                                "valid request for this model; fix: send fewer rows a request")
    if not d.eof:
        raise InputError(f"Content-Encoding {encoding}: the body ends before its compressed "
                         "data does; fix: send the whole compressed body")
    return out


def _answer_encoding(accept: str | None) -> str | None:
    """The first of gzip and deflate an Accept-Encoding header names, if any."""
    if not accept:
        return None
    for part in accept.split(","):
        name = part.split(";")[0].strip()
        if name in ENCODINGS and "q=0" not in part.replace(" ", "").split(";")[1:]:
            return name
    return None


def compressed(payload: bytes, encoding: str) -> bytes:
    c = zlib.compressobj(wbits=ENCODINGS[encoding])
    return c.compress(payload) + c.flush()


def unknown_model(name: str) -> str:
    return f"Request for unknown model: '{cut(name, 80)}' is not found"


def unknown_version(name: str, version: str) -> str:
    return f"Request for unknown model: '{cut(name, 80)}' version {cut(version, 20)} is not found"


@dataclass(frozen=True, slots=True)
class Failure:
    """A request that reached the batcher and was not served: Triton's failure reason
    (the nv_inference_request_failure label), the HTTP status (the gRPC side maps it to
    a status code) and the message."""

    reason: str
    status: int
    message: str


def record_failure(sm: ServedModel, t0: int, reason: str, status: int, message: str
                   ) -> Failure:
    sm.metrics.inc("nv_inference_request_failure", {**sm.labels, "reason": reason})
    sm.stats.fail.add(time.monotonic_ns() - t0)
    return Failure(reason, status, message)


async def run_request(sm: ServedModel, req: InferRequest, t0: int,
                      build: Callable[[dict[str, np.ndarray]], _T]) -> _T | Failure:
    """A parsed request through the batcher: `build(outputs)` (the front end's answer;
    an InputError from it, such as an output the model lacks, is the request's failure)
    or the Failure, each counted in the model's statistics and metrics as Triton counts
    them. Both front ends (HTTP and gRPC) answer through here."""
    fut = sm.batcher.submit(req.inputs, req.rows)
    if fut is None:
        return record_failure(sm, t0, "REJECTED", 503, "Exceeds maximum queue size")
    try:
        (values, _timing), queue_ns = await fut
    except TimeoutError:
        return record_failure(sm, t0, "REJECTED", 503, "Request timeout expired")
    except InputError as exc:  # e.g. a feature missing under --missing reject
        return record_failure(sm, t0, "OTHER", 400, str(exc))
    except StoreError as exc:  # the online store is down: try again later
        return record_failure(sm, t0, "BACKEND", 503, str(exc))
    except Exception as exc:  # the model itself failed on this batch
        return record_failure(sm, t0, "BACKEND", 500, f"inference failed: {cut(str(exc), 300)}")
    try:
        out = build(values)
    except InputError as exc:  # an output the model does not have
        return record_failure(sm, t0, "OTHER", 400, str(exc))
    done = time.monotonic_ns()
    metrics, lab = sm.metrics, sm.labels
    sm.stats.success.add(done - t0)
    sm.stats.queue.add(queue_ns)
    sm.stats.last_inference_ms = int(time.time() * 1000)
    metrics.triton.add(sm.label_key, ("nv_inference_queue_duration_us", queue_ns / 1e3),
                       ("nv_inference_request_success", 1.0),
                       ("nv_inference_request_duration_us", (done - t0) / 1e3))
    if metrics.triton.summaries is not None:
        metrics.triton.observe("nv_inference_request_summary_us", lab, (done - t0) / 1e3)
        metrics.triton.observe("nv_inference_queue_summary_us", lab, queue_ns / 1e3)
    sm.queue_hist.observe(queue_ns / 1e9)
    sm.request_hist.observe((done - t0) / 1e9)
    return out


class InferFastPath:
    """ASGI, behind GuardMiddleware (whose body limit puts the infer path's match in the
    scope): POST .../infer straight to the gateway's infer function; all else to the
    app, whose own routes answer infer too."""

    def __init__(self, app: ASGIApp, infer: Any) -> None:
        self.app = app
        self.infer = infer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        m = scope.get(INFER_MATCH)  # matched once, by the guard's body limit
        if m is None:
            await self.app(scope, receive, send)
            return
        chunks = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        header_length = encoding = accept = None
        for k, v in scope["headers"]:
            if k == b"inference-header-content-length":
                header_length = v.decode("latin-1")
            elif k == b"content-encoding":
                encoding = v.decode("latin-1").strip().lower() or None
            elif k == b"accept-encoding":
                accept = v.decode("latin-1").lower()
        try:
            status, payload, ctype, hlen = await self.infer(
                m.group(1), b"".join(chunks), header_length, m.group(2),
                None if encoding == "identity" else encoding)
        except Exception as exc:  # a bug: answered as FastAPI's stack answers one
            status, payload, ctype, hlen = 500, error_body(
                f"internal error ({type(exc).__name__}: {cut(str(exc), 200)})"
            ), "application/json", None
        headers = [(b"content-type", ctype.encode())]
        answer_encoding = _answer_encoding(accept) if status == 200 else None
        if answer_encoding is not None:  # as Triton: an answer compressed when asked
            payload = compressed(payload, answer_encoding)
            headers.append((b"content-encoding", answer_encoding.encode()))
        headers.append((b"content-length", str(len(payload)).encode()))
        if hlen is not None:
            headers.append((b"inference-header-content-length", hlen.encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


class GatewayApp(FastAPI):
    """FastAPI with the gateway's guard and inference fast path in front of its whole
    stack: an HTTP request meets the Host and body checks first, and an inference goes
    straight to the gateway's infer function. FastAPI's own layers (its error and
    telemetry middleware, its body limit, the router) cost about as much CPU as the
    inference itself here, and only the other routes need them."""

    front: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.front is not None and scope["type"] == "http":
            await self.front(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    async def stack(self, scope: Scope, receive: Receive, send: Send) -> None:
        """FastAPI's own handling: what the front passes on."""
        await super().__call__(scope, receive, send)


def create_gateway(models: list[ServedModel], *, allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS,
                   metrics: Metrics | None = None, body_timeout_s: float = 30.0,
                   max_inflight_bytes: int = 256 * 1024 * 1024) -> GatewayApp:
    """The v2 app over loaded models."""
    by_name = by_model(models)
    metrics = metrics or (models[0].metrics if models else Metrics())
    # One thread parses large bodies, one at a time: their parse holds the GIL anyway,
    # and one at a time bounds the memory their Python objects take.
    parse_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parse")
    app = GatewayApp(title="servelab gateway", docs_url=None, redoc_url=None,
                     openapi_url=None)

    def served(name: str) -> ModelVersions:
        if name not in by_name:
            raise StarletteHTTPException(404, unknown_model(name))
        return by_name[name]

    def served_version(name: str, version: str) -> ServedModel:
        """The model at a version it serves; Triton's 404 for one it does not."""
        sm = served(name).get(version)
        if sm is None:
            raise StarletteHTTPException(404, unknown_version(name, version))
        return sm

    @app.exception_handler(ServelabError)
    async def user_error(_: Request, exc: ServelabError) -> Response:
        return error_response(str(exc), 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Response:
        return error_response(str(exc.detail), exc.status_code)

    @app.exception_handler(Exception)
    async def bug(_: Request, exc: Exception) -> Response:
        return error_response(f"internal error ({type(exc).__name__}: {cut(str(exc), 200)})", 500)

    @app.get("/v2/health/live")
    async def live() -> Response:
        return Response(status_code=200)

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        return Response(status_code=200 if by_name else 400)

    @app.get("/v2")
    async def server_metadata() -> Response:
        return json_response({"name": "servelab", "version": "0.1.0",
                      "extensions": list(EXTENSIONS)})

    def metadata(sm: ServedModel, versions: list[str]) -> Response:
        return json_response(sm.metadata_json(versions))

    # Before the model routes, which would take "stats" for a model's name (as Triton's
    # own router, a model named "stats" has no metadata path).
    @app.get("/v2/models/stats")
    async def all_stats() -> Response:
        return json_response({"model_stats": [sm.stats_json() for sm in every_version(by_name)]})

    @app.get("/v2/models/{name}")
    async def model_metadata(name: str) -> Response:
        mv = served(name)  # every version it serves, as Triton lists them
        return metadata(mv.latest, mv.versions)

    @app.get("/v2/models/{name}/versions/{version}")
    async def model_version_metadata(name: str, version: str) -> Response:
        return metadata(served_version(name, version), [version])

    @app.get("/v2/models/{name}/ready")
    async def model_ready(name: str) -> Response:
        served(name)
        return Response(status_code=200)

    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_version_ready(name: str, version: str) -> Response:
        if served(name).get(version) is None:  # Triton: 400, so is_model_ready(m, v) False
            return error_response("Model version not ready", 400)
        return Response(status_code=200)

    @app.get("/v2/models/{name}/config")
    async def model_config(name: str) -> Response:
        return json_response(served(name).latest.config_json())

    @app.get("/v2/models/{name}/stats")
    async def model_stats(name: str) -> Response:
        return json_response({"model_stats": [sm.stats_json()
                                              for sm in served(name).by_version.values()]})

    @app.get("/v2/models/{name}/versions/{version}/stats")
    async def model_version_stats(name: str, version: str) -> Response:
        sm = served(name).get(version)
        if sm is None:
            return error_response("requested model version is not available for model "
                                  f"'{cut(name, 80)}'", 400)
        return json_response({"model_stats": [sm.stats_json()]})

    @app.get("/v2/models/{name}/drift")
    async def model_drift(name: str) -> Response:
        sm = served(name).latest
        if sm.drift is None:
            return error_response(f"model {cut(name, 80)!r} watches no drift; start "
                                  "servelab serve with --drift-reference", 404)
        return json_response(sm.drift.to_dict())

    @app.post("/v2/repository/index")
    async def repository_index() -> Response:
        return json_response([{"name": n, "version": v, "state": "READY"}
                              for n, mv in by_name.items() for v in mv.versions])

    @app.post("/v2/repository/models/{name}/load")
    @app.post("/v2/repository/models/{name}/unload")
    async def repository_control(name: str) -> Response:
        return error_response(MODEL_CONTROL_REFUSED, 503)

    def metrics_text() -> bytes:
        for m in every_version(by_name):
            metrics.triton.set("nv_inference_pending_request_count", m.labels,
                               m.batcher.in_flight)
            if m.log is not None:
                metrics.log_dropped.labels(**m.labels).set(m.log.dropped)
                metrics.log_written.labels(**m.labels).set(m.log.written)
        return metrics.triton.exposition() + generate_latest(metrics.registry)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics_text(), media_type=CONTENT_TYPE_LATEST)

    inflated = {"bytes": 0}  # compressed bodies' inflated size, held until answered

    def inflate_and_parse(body: bytes, encoding: str, header_length: str | None,
                          sm: ServedModel) -> tuple[Any, int]:
        """On the parse thread, one at a time: a compressed body inflated (up to the
        model's largest valid request) and parsed; the inflated size, which the request
        then holds of the in-flight budget (its compressed size was all the body limits
        saw)."""
        raw = decompressed(body, encoding, sm.max_request_bytes)
        return parse_request(raw, header_length, sm.model.name, sm.inputs,
                             sm.policy.max_batch_size), len(raw)

    async def infer(name: str, body: bytes, header_length: str | None,
                    version: str | None = None, encoding: str | None = None
                    ) -> tuple[int, bytes, str, str | None]:
        """One inference: (status, body, content type, Inference-Header-Content-Length).
        `encoding`: the body's Content-Encoding, if any."""
        mv = by_name.get(name)
        if mv is None:
            return 404, error_body(unknown_model(name)), "application/json", None
        sm = mv.get(version)
        if sm is None:
            return 404, error_body(unknown_version(name, version or "")), "application/json", None
        t0 = time.monotonic_ns()
        held = 0  # inflated bytes this request holds of the in-flight budget
        try:
            if encoding is not None:  # inflated and parsed on the parse thread
                req, held = await asyncio.get_running_loop().run_in_executor(
                    parse_pool, inflate_and_parse, body, encoding, header_length, sm)
                if inflated["bytes"] + held > max_inflight_bytes:
                    return 503, error_body(
                        "the gateway holds too many request bytes now; fix: try again "
                        "shortly"), "application/json", None
                inflated["bytes"] += held
            elif len(body) <= INLINE_PARSE_BYTES:
                req = parse_request(body, header_length, name, sm.inputs,
                                    sm.policy.max_batch_size)
            else:
                req = await asyncio.get_running_loop().run_in_executor(
                    parse_pool, parse_request, body, header_length, name, sm.inputs,
                    sm.policy.max_batch_size)
        except BodyTooLargeError as exc:
            return 413, error_body(str(exc)), "application/json", None
        except UnsupportedEncodingError as exc:
            return 415, error_body(str(exc)), "application/json", None
        except InputError as exc:  # refused before it reached the model: as Triton, no
            return 400, error_body(str(exc)), "application/json", None  # failure counted
        try:
            return await answer(sm, req, t0)
        finally:
            inflated["bytes"] -= held

    async def answer(sm: ServedModel, req: InferRequest, t0: int
                     ) -> tuple[int, bytes, str, str | None]:
        """A parsed request through the batcher to its HTTP answer."""
        out = await run_request(sm, req, t0, functools.partial(
            build_response, sm.model.name, sm.version, req, sm.model.outputs,
            labels=sm.class_labels))
        if isinstance(out, Failure):
            return out.status, error_body(out.message), "application/json", None
        payload, header_len = out
        if header_len is not None:
            return 200, payload, "application/octet-stream", str(header_len)
        return 200, payload, "application/json", None

    async def routed_infer(name: str, request: Request, version: str | None = None
                           ) -> Response:
        status, payload, ctype, hlen = await infer(
            name, await request.body(), request.headers.get("inference-header-content-length"),
            version)
        headers = {"Inference-Header-Content-Length": hlen} if hlen is not None else None
        return Response(payload, status_code=status, media_type=ctype, headers=headers)

    @app.post("/v2/models/{name}/infer")
    async def model_infer(name: str, request: Request) -> Response:
        return await routed_infer(name, request)

    @app.post("/v2/models/{name}/versions/{version}/infer")
    async def model_version_infer(name: str, version: str, request: Request) -> Response:
        return await routed_infer(name, request, version)

    # The hot path skips FastAPI's stack (GatewayApp): inference requests are answered by
    # `infer` directly, after the Host and body checks, which come first for every route.
    def body_limit(scope: Scope) -> int | None:
        m = _INFER_PATH.match(scope["path"]) if scope["method"] == "POST" else None
        scope[INFER_MATCH] = m
        mv = by_name.get(m.group(1)) if m is not None else None
        return mv.max_request_bytes if mv is not None else None

    app.front = GuardMiddleware(
        InferFastPath(app.stack, infer), allowed_hosts=allowed_hosts,
        max_body=OTHER_BODY_BYTES, server="the gateway",
        limits=BodyLimits(OTHER_BODY_BYTES, body_timeout_s=body_timeout_s,
                          max_inflight_bytes=max_inflight_bytes, per_route=body_limit))
    app.state.models = by_name
    app.state.parse_pool = parse_pool  # shut down when the gateway closes
    app.state.metrics_text = metrics_text  # for a metrics port of its own
    return app


def create_metrics_app(gateway: FastAPI, allowed_hosts: tuple[str, ...]) -> FastAPI:
    """/metrics alone, for `--metrics-port` (Triton serves its metrics on a port of its
    own, 8002 by default): the gateway's text, behind the same Host check."""
    app = FastAPI(title="servelab metrics", docs_url=None, redoc_url=None, openapi_url=None)
    text = gateway.state.metrics_text

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(text(), media_type=CONTENT_TYPE_LATEST)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Response:
        return error_response(str(exc.detail), exc.status_code)

    app.add_middleware(GuardMiddleware, allowed_hosts=allowed_hosts, max_body=OTHER_BODY_BYTES,
                       server="the metrics port")
    return app
