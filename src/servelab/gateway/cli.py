"""`servelab serve`: start the gateway on loopback over one or more ONNX models."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from servelab.errors import ConfigError, InputError, cut
from servelab.scenario import BatchingPolicy

stderr = Console(stderr=True)


def serve(
    model: Annotated[list[str] | None, typer.Option(
        "--model", "-m", help="NAME=PATH.onnx (repeat for several models).")] = None,
    model_repository: Annotated[Path | None, typer.Option(
        help="A Triton model repository: DIR/<model>/config.pbtxt and DIR/<model>/1/"
             "model.onnx (each model's batching from its config.pbtxt).")] = None,
    demo: Annotated[bool, typer.Option(help="Serve a small built-in MLP as 'demo'.")] = False,
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
) -> None:
    """Serve ONNX models over the Open Inference Protocol v2, batched with Triton's rules."""
    import uvicorn

    from servelab.api import load
    from servelab.gateway.app import Metrics, ServedModel, create_gateway
    from servelab.gateway.demo import write_mlp
    from servelab.gateway.repository import load_repository
    from servelab.gateway.runner import OnnxModel
    from servelab.lab.server import LOOPBACK_HOSTS

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
        tmp = Path(tempfile.mkdtemp(prefix="servelab-demo-"))
        specs.append(("demo", str(write_mlp(tmp / "demo.onnx")), policy))
    if not specs:
        raise InputError("--model: none given; fix: --model NAME=PATH.onnx, "
                         "--model-repository DIR, or --demo")
    if len({n for n, _, _ in specs}) != len(specs):
        raise InputError("--model: a name is given twice; fix: one NAME per model")
    metrics = Metrics()
    served = [ServedModel(OnnxModel(path, name), pol, pol.instances_per_gpu, metrics)
              for name, path, pol in specs]
    hosts = [*LOOPBACK_HOSTS, *(h.strip().lower() for h in allow_host or [] if h.strip())]
    if host not in ("0.0.0.0", "::"):
        hosts.append(host.lower())
    app = create_gateway(served, allowed_hosts=tuple(dict.fromkeys(hosts)), metrics=metrics)
    try:
        with socket.create_server((host, port)):
            pass
    except (OSError, OverflowError) as exc:
        reason = (os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno
                  else str(exc))
        raise ConfigError(f"--port = {port}: cannot listen on {cut(host, 60)}:{port} "
                          f"({reason}); fix: choose another port, e.g. --port {port + 1}"
                          ) from exc
    for name, _, pol in specs:
        stderr.print(f"  {name}: max_batch_size {pol.max_batch_size}, max_queue_delay "
                     f"{pol.max_queue_delay_microseconds} us, {pol.instances_per_gpu} "
                     "instance(s)", highlight=False)
    stderr.print(f"servelab serve on http://{host}:{port} (Ctrl+C to stop)", highlight=False)
    # SIGTERM / Ctrl+C: stop accepting, answer what was accepted (up to 30 s), then exit.
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=30)
    sys.stderr.flush()
