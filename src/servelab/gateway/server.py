"""The gateway assembled and run: a checked GatewaySpec (what `servelab serve`'s flags
say) -> Gateway (the loaded models, the feature join, the served log, drift and trace
writers, the app) -> run on uvicorn with the guarded protocol, closed in order."""

from __future__ import annotations

import contextlib
import gc
import signal
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from servelab.errors import InputError, cut
from servelab.gateway.repository import Declared, check_declared, policy_json
from servelab.scenario import BatchingPolicy

if TYPE_CHECKING:
    from servelab.http import ConnectionLimits

# The instance and batcher threads need the GIL back the moment their wait or the
# model's run ends; Python's default 5 ms switch interval would let a busy event loop
# hold them off for that long (Triton's threads have no such lock).
SWITCH_INTERVAL_S = 0.0005


class ModelSpec(NamedTuple):
    """One model to serve: its name, .onnx path and policy; without dynamic batching (a
    repository model whose config.pbtxt has no dynamic_batching) each request runs
    alone, as Triton runs it; `version` is its repository folder's number; the model's
    inputs and outputs must be those `declared` (as Triton's ONNX Runtime backend checks
    them at load)."""

    name: str
    path: str
    policy: BatchingPolicy
    dynamic_batching: bool = True
    version: str = "1"
    declared: tuple[Declared, ...] = ()  # its config.pbtxt's inputs and outputs, if any
    labels: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (output, its label file's lines)
    version_policy: tuple[str, tuple[int, ...]] = ("latest", (1,))  # repository.version_policy


@dataclass(frozen=True)
class GatewaySpec:
    """Everything the gateway is started with (each model with its own policy)."""

    models: tuple[ModelSpec, ...]
    feature_repo: Path | None = None
    feature_service: str | None = None
    store: str | None = None
    missing: str = "default"
    log_dir: Path | None = None
    trace_file: Path | None = None
    trace_requests: int = 1_000_000
    drift_reference: Path | None = None
    drift_window: int = 10_000
    drift_interval_s: float = 10.0
    host: str = "127.0.0.1"
    port: int = 8000
    allow_host: tuple[str, ...] = ()
    max_connections: int = 1000
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_inflight_mb: float = 256.0
    metrics_port: int | None = None  # /metrics on a port of its own too, as Triton's 8002
    summary_latencies: bool = False  # Triton's latency summaries in /metrics
    grpc_port: int | None = None  # the KServe v2 gRPC service too, as Triton's 8001

    def check(self) -> None:
        if not self.models:
            raise InputError("--model: none given; fix: --model NAME=PATH.onnx, "
                             "--model-repository DIR, or --demo")
        if len({(m.name, m.version) for m in self.models}) != len(self.models):
            raise InputError("--model: a name is given twice; fix: one NAME per model")
        if self.missing not in ("default", "reject"):
            raise InputError(f"--missing = {cut(self.missing)!r}: expected default or reject")
        if (self.feature_repo is None) != (self.feature_service is None):
            raise InputError("--feature-repo/--feature-service: give both, to join a feature "
                             "service's online values into the model's input")
        if self.drift_reference is not None and self.feature_repo is None:
            raise InputError("--drift-reference: drift is watched on joined features; fix: "
                             "serve with --feature-repo and --feature-service (or --demo)")
        if self.metrics_port is not None and self.metrics_port == self.port:
            raise InputError(f"--metrics-port = {self.metrics_port}: the same as --port; "
                             "fix: another port (Triton's is 8002), or leave it out: /metrics "
                             "is on --port too")
        if self.grpc_port is not None and self.grpc_port in (self.port, self.metrics_port):
            raise InputError(f"--grpc-port = {self.grpc_port}: the same as --port or "
                             "--metrics-port; fix: a port of its own (Triton's is 8001)")


@dataclass
class Gateway:
    """What a running gateway holds, to be closed in order when it stops."""

    spec: GatewaySpec
    app: Any
    served: list[Any]
    join: Any = None
    trace: Any = None
    notes: list[str] = field(default_factory=list)

    def close(self) -> None:
        # The parse thread is not a daemon: left running, the exit (cli._leave joins
        # such threads) waited for it for ever, and the server had to be killed.
        self.app.state.parse_pool.shutdown(wait=False, cancel_futures=True)
        for sm in self.served:
            if sm.log is not None:
                sm.log.close()
            if sm.drift is not None:
                sm.drift.close()
        if self.join is not None:
            self.join.close()
        if self.trace is not None:
            self.trace.flush()


def build(spec: GatewaySpec) -> Gateway:
    """Load every model and reach every store now: a wrong path or URL fails here, not
    on the first request."""
    from servelab.features.definitions import load_repo
    from servelab.gateway.app import Metrics, ServedModel, create_gateway
    from servelab.gateway.join import FeatureJoin, MissingPolicy
    from servelab.gateway.log import ServedLog
    from servelab.gateway.runner import OnnxModel
    from servelab.http import allowed_hosts

    spec.check()
    join = None
    if spec.feature_repo is not None and spec.feature_service is not None:
        join = FeatureJoin(load_repo(spec.feature_repo), spec.feature_service, spec.store,
                           MissingPolicy(spec.missing))
        join.store()
    reference = None
    if spec.drift_reference is not None and join is not None:
        from servelab.drift_cli import read_side

        reference = read_side(spec.drift_reference, "--drift-reference",
                              list(join.feature_names))
    trace = None
    if spec.trace_file is not None:
        from servelab.trace_file import TraceWriter

        trace = TraceWriter(spec.trace_file, limit=spec.trace_requests)
    metrics = Metrics(summary_latencies=spec.summary_latencies)
    served = []
    for ms in spec.models:
        name, pol = ms.name, ms.policy
        model = OnnxModel(ms.path, name)
        check_declared(ms.declared, model, f"model {name!r} config.pbtxt")
        monitor = None
        if reference is not None and join is not None:
            from servelab.gateway.drift_monitor import DriftMonitor

            monitor = DriftMonitor(name, join.feature_names, reference,
                                   window=spec.drift_window, interval_s=spec.drift_interval_s)
        log = ServedLog(spec.log_dir, name) if spec.log_dir else None
        served.append(ServedModel(model, pol, pol.instances_per_gpu, metrics,
                                  join=join, log=log, drift=monitor, trace=trace,
                                  dynamic_batching=ms.dynamic_batching, version=ms.version,
                                  version_policy=policy_json(ms.version_policy),
                                  class_labels=dict(ms.labels)))
    app = create_gateway(served, allowed_hosts=allowed_hosts(spec.host, list(spec.allow_host)),
                         metrics=metrics, body_timeout_s=spec.body_timeout_s,
                         max_inflight_bytes=int(spec.max_inflight_mb * 1024 * 1024))
    return Gateway(spec, app, served, join, trace)


def run(gw: Gateway, say: Callable[[str], None]) -> None:
    """Serve until SIGTERM or Ctrl+C: stop accepting, answer what was accepted (up to
    30 s), then close the logs, monitors, stores and trace."""
    import uvicorn

    from servelab.http import ConnectionLimits, check_can_listen, guarded_http_protocol

    spec = gw.spec
    limits = ConnectionLimits(spec.max_connections, spec.header_timeout_s
                              ).fitted_to_file_limit()
    if limits.max_connections < spec.max_connections:
        say(f"--max-connections: {limits.max_connections} (the open-file limit allows no "
            "more)")
    check_can_listen(spec.host, spec.port)
    if spec.metrics_port is not None:
        check_can_listen(spec.host, spec.metrics_port)
        _serve_metrics(gw, limits, spec.metrics_port)
        say(f"metrics on http://{spec.host}:{spec.metrics_port}/metrics")
    if spec.grpc_port is not None:
        check_can_listen(spec.host, spec.grpc_port)
        _with_grpc(gw, limits)
        say(f"gRPC (KServe v2) on {spec.host}:{spec.grpc_port}")
    for ms in spec.models:
        pol = ms.policy
        batching = (f"max_queue_delay {pol.max_queue_delay_microseconds} us"
                    if ms.dynamic_batching else "no dynamic batching (each request alone)")
        say(f"  {ms.name}: max_batch_size {pol.max_batch_size}, {batching}, "
            f"{pol.instances_per_gpu} instance(s)")
    say(f"servelab serve on http://{spec.host}:{spec.port} (Ctrl+C to stop)")
    # uvicorn drains on SIGTERM/SIGINT, then re-raises the signal to the handler that was
    # there before it: make that one leave through `finally`, so the served log is
    # flushed and the stores closed.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # What startup made (models, stores, the app) lives as long as the process: freeze it
    # out of the collector, so a full collection under load scans only what serving made.
    gc.collect()
    gc.freeze()
    try:
        uvicorn.run(gw.app, host=spec.host, port=spec.port, log_level="warning",
                    access_log=False, proxy_headers=False, timeout_graceful_shutdown=30,
                    http=guarded_http_protocol(limits), backlog=4096)
    finally:
        gw.close()
        sys.stderr.flush()


def _serve_metrics(gw: Gateway, limits: ConnectionLimits, port: int) -> None:
    """/metrics on --metrics-port, from a daemon thread with its own event loop (uvicorn
    takes no signals outside the main thread: the process's exit ends it)."""
    import threading

    import uvicorn

    from servelab.gateway.app import create_metrics_app
    from servelab.http import allowed_hosts, guarded_http_protocol

    spec = gw.spec
    app = create_metrics_app(gw.app, allowed_hosts(spec.host, list(spec.allow_host)))
    server = uvicorn.Server(uvicorn.Config(
        app, host=spec.host, port=port, log_level="warning", access_log=False,
        proxy_headers=False, http=guarded_http_protocol(limits)))
    threading.Thread(target=server.run, name="servelab-metrics", daemon=True).start()


def _with_grpc(gw: Gateway, limits: ConnectionLimits) -> None:
    """The gRPC service started and stopped with the HTTP app (in its lifespan), on the
    same event loop, which the batchers answer on: stopped, it finishes the calls it has
    (up to 30 s, as the HTTP side drains) and takes no new ones."""
    from servelab.gateway.grpc_service import create_grpc_server

    spec = gw.spec
    app = gw.app
    port = spec.grpc_port
    assert port is not None
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        server = create_grpc_server(app, spec.host, port, limits.max_connections,
                                    int(spec.max_inflight_mb * 1024 * 1024))
        await server.start()
        try:
            async with inner(a) as state:
                yield state
        finally:
            await server.stop(30)

    app.router.lifespan_context = lifespan


def _exit_cleanly(signum: int, frame: Any) -> None:
    raise SystemExit(0)
