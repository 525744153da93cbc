"""`servelab serve`: start the gateway on loopback over one or more ONNX models."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from servelab.errors import InputError, cut
from servelab.flags import option
from servelab.scenario import flag_keys

stderr = Console(stderr=True)


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
    max_batch_size: Annotated[int | None, option("batching.max_batch_size")] = None,
    max_queue_delay_us: Annotated[int | None, option(
        "batching.max_queue_delay_microseconds")] = None,
    preferred_batch_size: Annotated[list[int] | None, option(
        "batching.preferred_batch_size")] = None,
    max_queue_size: Annotated[int | None, option("batching.max_queue_size")] = None,
    timeout_us: Annotated[int | None, option("batching.default_timeout_microseconds")] = None,
    instances: Annotated[int | None, option(
        "batching.instances_per_gpu", names=("--instances",),
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
    metrics_port: Annotated[int | None, typer.Option(
        help="Also serve /metrics on this port, as Triton's --metrics-port (8002); "
             "/metrics stays on --port.", min=1, max=65535)] = None,
    grpc_port: Annotated[int | None, typer.Option(
        help="Also serve the KServe v2 gRPC service on this port, as Triton's --grpc-port "
             "(8001): tritonclient.grpc works unchanged.", min=1, max=65535)] = None,
    summary_latencies: Annotated[bool, typer.Option(
        help="Triton's latency summaries in /metrics (request, queue, compute; quantiles "
             "over the last 60 s), as Triton's --metrics-config summary_latencies=true.")
    ] = False,
) -> None:
    """Serve ONNX models over the Open Inference Protocol v2, batched with Triton's rules."""
    from servelab.api import load
    from servelab.gateway.repository import load_repository
    from servelab.gateway.server import GatewaySpec, ModelSpec, build, run

    given = {**locals(), "instances_per_gpu": instances,
             "preferred_batch_size": preferred_batch_size or None}
    policy = load(scenario, {key: given[name] for name, key in flag_keys("batching").items()
                             if name in given}).batching
    models = [ModelSpec(*_model_flag(m), policy) for m in model or []]
    if model_repository is not None:
        models += [ModelSpec(m.name, str(m.path), m.policy, m.dynamic_batching, m.version,
                             m.declared, m.labels, m.version_policy)
                   for m in load_repository(model_repository)]
    if demo:
        feature_repo, feature_service, demo_model = build_demo(demo_dir)
        models.append(ModelSpec("fraud", str(demo_model), policy))
        log_dir = log_dir or feature_repo / "served_log"
        drift_reference = drift_reference or feature_repo / "training_set.parquet"
    gw = build(GatewaySpec(
        tuple(models), feature_repo, feature_service, store, missing, log_dir, trace_file,
        trace_requests, drift_reference, drift_window, drift_interval, host, port,
        tuple(allow_host or ()), max_connections, header_timeout_s, body_timeout_s,
        max_inflight_mb, metrics_port, summary_latencies, grpc_port))

    def say(line: str) -> None:
        stderr.print(line, highlight=False, markup=False)

    if demo:
        say(f"demo repo: {feature_repo}; try:\n  curl -s -X POST http://{host}:{port}"
            "/v2/models/fraud/infer -d '{\"inputs\": [{\"name\": \"user_id\", "
            "\"datatype\": \"INT64\", \"shape\": [1, 1], \"data\": [7]}, "
            "{\"name\": \"merchant_id\", \"datatype\": \"INT64\", \"shape\": "
            "[1, 1], \"data\": [3]}]}'")
    run(gw, say)


def _model_flag(spec: str) -> tuple[str, str]:
    """--model NAME=PATH.onnx, checked."""
    name, sep, path = spec.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise InputError(f"--model = {cut(spec)!r}: expected NAME=PATH.onnx; "
                         "fix: e.g. --model fraud=model.onnx")
    if not Path(path).is_file():
        raise InputError(f"--model = {cut(spec)!r}: no such file {cut(path)!r}; "
                         "fix: check the path")
    return name.strip(), path.strip()


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
