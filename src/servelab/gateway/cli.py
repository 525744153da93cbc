"""`servelab serve`: start the gateway on loopback over one or more ONNX models."""

from __future__ import annotations

import gc
import signal
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from servelab.errors import InputError, cut
from servelab.scenario import BatchingPolicy

stderr = Console(stderr=True)
SWITCH_INTERVAL_S = 0.0005


def serve(
    model: Annotated[list[str] | None, typer.Option(
        "--model", "-m", help="NAME=PATH.onnx (repeat for several models).")] = None,
    model_repository: Annotated[Path | None, typer.Option(
        help="A Triton model repository: DIR/<model>/config.pbtxt and DIR/<model>/1/"
             "model.onnx (each model's batching from its config.pbtxt).")] = None,
    demo: Annotated[bool, typer.Option(
        help="Newcomer's demo: create the example fraud feature repo, materialize it, train "
             "a model on point-in-time features and serve it as 'fraud' with features "
             "joined online.")] = False,
    demo_dir: Annotated[Path | None, typer.Option(
        help="Where --demo builds its repo (default: a new temporary folder).")] = None,
    feature_repo: Annotated[Path | None, typer.Option(
        help="A servelab feature repo: requests carry entity keys, features are read "
             "from its online store.")] = None,
    feature_service: Annotated[str | None, typer.Option(
        help="The feature service whose values make the model's input.")] = None,
    store: Annotated[str | None, typer.Option(help="sqlite or redis (default: the repo's).")
                     ] = None,
    missing: Annotated[str, typer.Option(
        help="A missing or expired feature: 'default' (0, counted) or 'reject' (400).")
                       ] = "default",
    log_dir: Annotated[Path | None, typer.Option(
        help="Append every served row (keys, features, prediction) to Parquet files here.")
                       ] = None,
    trace_file: Annotated[Path | None, typer.Option(
        help="Record each request's queue entry and its batch's start and end in "
             "Triton's trace format, to PATH.0, PATH.1, ... (500 requests each): "
             "`servelab replay-trace PATH.*` reads them.")] = None,
    trace_requests: Annotated[int, typer.Option(
        help="Stop tracing after this many requests.")] = 1_000_000,
    drift_reference: Annotated[Path | None, typer.Option(
        help="Watch drift: PSI of the served features against this Parquet (the training "
             "set; --demo uses its own), at /metrics and /v2/models/{m}/drift.")] = None,
    drift_window: Annotated[int, typer.Option(
        help="Served rows in the drift window (the latest ones).")] = 10_000,
    drift_interval: Annotated[float, typer.Option(
        help="Seconds between drift computations (off the request path).")] = 10.0,
    scenario: Annotated[str, typer.Option(
        "--scenario", "-s", help="Take [batching] from this scenario TOML (or 'seed').")
                        ] = "seed",
    max_batch_size: Annotated[int | None, typer.Option(help="Triton max_batch_size.")] = None,
    max_queue_delay_us: Annotated[int | None, typer.Option(
        help="Triton max_queue_delay_microseconds.")] = None,
    preferred_batch_size: Annotated[list[int] | None, typer.Option(
        help="Triton preferred_batch_size (repeat).")] = None,
    max_queue_size: Annotated[int | None, typer.Option(
        help="Triton max_queue_size (0: unbounded).")] = None,
    timeout_us: Annotated[int | None, typer.Option(
        help="Triton default_timeout_microseconds (0: none).")] = None,
    instances: Annotated[int | None, typer.Option(
        help="Model instances (Triton instance_group count).")] = None,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")
                    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.", min=1, max=65535)] = 8000,
    allow_host: Annotated[list[str] | None, typer.Option(
        help="Another host name to answer to (repeat); loopback names always.")] = None,
    max_connections: Annotated[int, typer.Option(
        help="Open connections kept; past it a new one closes the one idle longest "
             "(503 if none is idle).", min=1, max=100_000)] = 1000,
    header_timeout_s: Annotated[float, typer.Option(
        help="Seconds a connection may take to send a request's headers.", min=0.1,
        max=3600)] = 10.0,
    body_timeout_s: Annotated[float, typer.Option(
        help="Seconds a request's body may take to arrive (408 past it).", min=0.1,
        max=3600)] = 30.0,
    max_inflight_mb: Annotated[float, typer.Option(
        help="MiB of request bodies all requests together may hold (503 past it).",
        min=1, max=65536)] = 256.0,
) -> None:
    """Serve ONNX models over the Open Inference Protocol v2, batched with Triton's rules."""
    import uvicorn

    from servelab.api import load
    from servelab.features.definitions import load_repo
    from servelab.gateway.app import Metrics, ServedModel, create_gateway
    from servelab.gateway.join import FeatureJoin, MissingPolicy
    from servelab.gateway.log import ServedLog
    from servelab.gateway.repository import load_repository
    from servelab.gateway.runner import OnnxModel
    from servelab.http import (
        ConnectionLimits,
        allowed_hosts,
        check_can_listen,
        guarded_http_protocol,
    )

    given: dict[str, Any] = {
        "batching.max_batch_size": max_batch_size,
        "batching.max_queue_delay_microseconds": max_queue_delay_us,
        "batching.preferred_batch_size": preferred_batch_size or None,
        "batching.max_queue_size": max_queue_size,
        "batching.default_timeout_microseconds": timeout_us,
        "batching.instances_per_gpu": instances,
    }
    policy = load(scenario, given).batching
    specs: list[tuple[str, str, BatchingPolicy]] = []
    for spec in model or []:
        name, sep, path = spec.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise InputError(f"--model = {cut(spec)!r}: expected NAME=PATH.onnx; "
                             "fix: e.g. --model fraud=model.onnx")
        if not Path(path).is_file():
            raise InputError(f"--model = {cut(spec)!r}: no such file {cut(path)!r}; "
                             "fix: check the path")
        specs.append((name.strip(), path.strip(), policy))
    if model_repository is not None:
        specs += [(m.name, str(m.path), m.policy) for m in load_repository(model_repository)]
    if demo:
        feature_repo, feature_service, demo_model = build_demo(demo_dir)
        specs.append(("fraud", str(demo_model), policy))
        log_dir = log_dir or feature_repo / "served_log"
        drift_reference = drift_reference or feature_repo / "training_set.parquet"
    if not specs:
        raise InputError("--model: none given; fix: --model NAME=PATH.onnx, "
                         "--model-repository DIR, or --demo")
    if len({n for n, _, _ in specs}) != len(specs):
        raise InputError("--model: a name is given twice; fix: one NAME per model")
    if missing not in ("default", "reject"):
        raise InputError(f"--missing = {cut(missing)!r}: expected default or reject")
    join = None
    if feature_repo is not None or feature_service is not None:
        if feature_repo is None or feature_service is None:
            raise InputError("--feature-repo/--feature-service: give both, to join a feature "
                             "service's online values into the model's input")
        join = FeatureJoin(load_repo(feature_repo), feature_service, store,
                           MissingPolicy(missing))
        join.store()  # reach the store now: a wrong URL fails here, not on the first request
    reference = None
    if drift_reference is not None:
        from servelab.drift_cli import read_side

        if join is None:
            raise InputError("--drift-reference: drift is watched on joined features; fix: "
                             "serve with --feature-repo and --feature-service (or --demo)")
        reference = read_side(drift_reference, "--drift-reference", list(join.feature_names))
    trace = None
    if trace_file is not None:
        from servelab.trace_file import TraceWriter

        trace = TraceWriter(trace_file, limit=trace_requests)
    metrics = Metrics()
    served = []
    for name, path, pol in specs:
        monitor = None
        if reference is not None and join is not None:
            from servelab.gateway.drift_monitor import DriftMonitor

            monitor = DriftMonitor(name, join.feature_names, reference, window=drift_window,
                                   interval_s=drift_interval)
        served.append(ServedModel(OnnxModel(path, name), pol, pol.instances_per_gpu, metrics,
                                  join=join, log=(ServedLog(log_dir, name) if log_dir else None),
                                  drift=monitor, trace=trace))
    app = create_gateway(served, allowed_hosts=allowed_hosts(host, allow_host),
                         metrics=metrics, body_timeout_s=body_timeout_s,
                         max_inflight_bytes=int(max_inflight_mb * 1024 * 1024))
    limits = ConnectionLimits(max_connections, header_timeout_s).fitted_to_file_limit()
    if limits.max_connections < max_connections:
        stderr.print(f"--max-connections: {limits.max_connections} (the open-file limit "
                     "allows no more)", highlight=False)
    check_can_listen(host, port)
    for name, _, pol in specs:
        stderr.print(f"  {name}: max_batch_size {pol.max_batch_size}, max_queue_delay "
                     f"{pol.max_queue_delay_microseconds} us, {pol.instances_per_gpu} "
                     "instance(s)", highlight=False)
    stderr.print(f"servelab serve on http://{host}:{port} (Ctrl+C to stop)", highlight=False)
    # SIGTERM / Ctrl+C: stop accepting, answer what was accepted (up to 30 s), then exit.
    if demo:
        stderr.print(f"demo repo: {feature_repo}; try:\n  curl -s -X POST http://{host}:{port}"
                     "/v2/models/fraud/infer -d '{\"inputs\": [{\"name\": \"user_id\", "
                     "\"datatype\": \"INT64\", \"shape\": [1, 1], \"data\": [7]}, "
                     "{\"name\": \"merchant_id\", \"datatype\": \"INT64\", \"shape\": "
                     "[1, 1], \"data\": [3]}]}'", highlight=False, markup=False)
    # uvicorn drains on SIGTERM/SIGINT, then re-raises the signal to the handler that was
    # there before it: make that one leave through `finally`, so the served log is
    # flushed and the stores closed.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_cleanly)
    # The instance and batcher threads need the GIL back the moment their wait or the
    # model's run ends; Python's default 5 ms switch interval would let a busy event loop
    # hold them off for that long (Triton's threads have no such lock).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # What startup made (models, stores, the app) lives as long as the process: freeze it
    # out of the collector, so a full collection under load scans only what serving made.
    gc.collect()
    gc.freeze()
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False,
                    proxy_headers=False, timeout_graceful_shutdown=30,
                    http=guarded_http_protocol(limits), backlog=4096)
    finally:
        for sm in served:
            if sm.log is not None:
                sm.log.close()
            if sm.drift is not None:
                sm.drift.close()
        if join is not None:
            join.close()
        if trace is not None:
            trace.flush()
        sys.stderr.flush()


def _exit_cleanly(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def build_demo(directory: Path | None) -> tuple[Path, str, Path]:
    """init -> apply -> materialize -> train: the example fraud repo with data up to today."""
    import numpy as np

    from servelab.features.definitions import load_repo
    from servelab.features.example import generate
    from servelab.features.materialization import materialize
    from servelab.features.online import open_store
    from servelab.features.train import train

    root = directory or Path(tempfile.mkdtemp(prefix="servelab-demo-"))
    days = 30
    today = np.datetime64("today", "D").astype("datetime64[us]")
    if not (root / "feature_repo.toml").exists():
        stderr.print(f"demo: creating the example fraud repo in {root}", highlight=False)
        generate(root, users=2000, merchants=200, days=days, labels=20_000,
                 start=today - np.timedelta64(days, "D"))
    repo = load_repo(root)
    s = open_store(repo)
    s.apply(list(repo.views.values()))
    materialize(repo, s)
    s.close()
    model = root / "fraud_model_v1.onnx"
    report = train(repo, "fraud_model_v1", root / "data" / "labels.parquet", "is_fraud", model,
                   training_set_out=root / "training_set.parquet")
    stderr.print(f"demo: trained on {report.rows:,} labelled transactions, training AUC "
                 f"{report.train_auc:.3f}", highlight=False)
    return root, "fraud_model_v1", model
