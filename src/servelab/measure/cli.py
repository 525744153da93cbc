"""`servelab load`: open-loop load against a v2 server, perf_analyzer-style output."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from servelab.errors import invalid

stdout = Console()
stderr = Console(stderr=True)
MAX_RATES = 100


def load(
    model: Annotated[str, typer.Option("--model", "-m", help="Model name on the server.")],
    url: Annotated[str, typer.Option(help="The server, e.g. http://127.0.0.1:8000.")
                   ] = "http://127.0.0.1:8000",
    qps: Annotated[float | None, typer.Option(help="Offered requests per second.")] = None,
    rates: Annotated[str | None, typer.Option(
        help="Comma-separated rates for a sweep, e.g. 100,200,400.")] = None,
    concurrency: Annotated[str | None, typer.Option(
        help="Closed loop instead: comma-separated client counts, e.g. 1,2,4,8.")] = None,
    arrival: Annotated[str, typer.Option(help="Open-loop arrivals: poisson or constant.")
                       ] = "poisson",
    binary: Annotated[bool, typer.Option(
        help="Send random inputs with the binary tensor extension.")] = False,
    duration: Annotated[float, typer.Option(help="Seconds per rate.")] = 10.0,
    num_requests: Annotated[int | None, typer.Option(
        help="Requests per rate instead of --duration.")] = None,
    entities: Annotated[Path | None, typer.Option(
        help="Parquet file of input values (entity keys) to send, one column per input.")
                        ] = None,
    connections: Annotated[int, typer.Option(help="Most connections open at once.")] = 256,
    seed: Annotated[int, typer.Option(help="Seed for arrivals and random inputs.")] = 0,
    csv_path: Annotated[Path | None, typer.Option(
        "--csv", help="Also write perf_analyzer's CSV columns here (microseconds).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON to stdout.")
                       ] = False,
) -> None:
    """Open-loop Poisson load at each rate: latency from intended send times, errors by
    reason, and the server's own mean batch, queue and compute time."""
    from servelab.files import check_writable_target
    from servelab.measure.load import (
        PA_COLUMNS,
        entity_bodies,
        measure_rate,
        metadata,
        parse_url,
        perf_analyzer_row,
        random_bodies,
    )

    if sum(x is not None for x in (qps, rates, concurrency)) != 1:
        raise invalid("--qps/--rates/--concurrency", (qps, rates, concurrency),
                      "exactly one of them", "give --qps 500, --rates 100,200,400 or "
                      "--concurrency 1,2,4")
    if arrival not in ("poisson", "constant"):
        raise invalid("--arrival", arrival, "poisson or constant", "use --arrival poisson")
    clients: list[int] | None = None
    if concurrency is not None:
        try:
            clients = [int(x) for x in concurrency.split(",") if x.strip()]
        except ValueError:
            raise invalid("--concurrency", concurrency, "comma-separated whole numbers",
                          "e.g. --concurrency 1,2,4") from None
        if not clients or len(clients) > MAX_RATES or not all(1 <= c <= 1024 for c in clients):
            raise invalid("--concurrency", concurrency, f"1 to {MAX_RATES} counts from 1 to "
                          "1024", "e.g. --concurrency 1,2,4")
        grid = [0.0] * len(clients)
    else:
        try:
            grid = [qps] if qps is not None else [float(x) for x in str(rates).split(",")
                                                  if x.strip()]
        except ValueError:
            raise invalid("--rates", rates, "comma-separated numbers",
                          "e.g. --rates 100,200") from None
        if not grid or len(grid) > MAX_RATES or not all(0 < r <= 1e6 for r in grid):
            raise invalid("--rates" if rates else "--qps", rates or qps,
                          f"1 to {MAX_RATES} rates from above 0 to 1e6 per second",
                          "e.g. --rates 100,200,400")
    if not 0 < duration <= 3600:
        raise invalid("--duration", duration, "seconds from above 0 to 3600", "e.g. 10")
    if num_requests is not None and not 1 <= num_requests <= 2_000_000:
        raise invalid("--num-requests", num_requests, "1 to 2,000,000", "e.g. 5000")
    if not 1 <= connections <= 10_000:
        raise invalid("--connections", connections, "1 to 10,000", "e.g. 256")
    if csv_path is not None:
        check_writable_target(csv_path, "--csv")
    target = parse_url(url, model)
    meta = metadata(target)
    bodies: list[bytes | tuple[bytes, int]] = (
        list(entity_bodies(meta, str(entities), 4096)) if entities is not None
        else random_bodies(meta, 256, seed, binary=binary))
    rows: list[dict[str, Any]] = []
    for k, rate in enumerate(grid):
        c = clients[k] if clients is not None else None
        if c is not None and num_requests is None:
            raise invalid("--num-requests", None, "a count with --concurrency",
                          "e.g. --concurrency 4 --num-requests 2000")
        n = num_requests or max(1, int(rate * duration))
        if n > 2_000_000:
            raise invalid("--duration", duration, f"a run of at most 2,000,000 requests "
                          f"({n:,} at {rate:g}/s)", "shorten --duration")
        stderr.print(f"load: {f'{c} clients' if c else f'{rate:g}/s'}, {n:,} requests...",
                     highlight=False)
        row = measure_rate(target, bodies, rate, n, seed, connections, arrival, c)
        if row["behind_p99_ms"] > 1.0:
            stderr.print(f"warning: the client fell behind at {rate:g}/s (p99 "
                         f"{row['behind_p99_ms']:.1f} ms late); latencies still count from "
                         "the intended send times", highlight=False)
        rows.append(row)
    if csv_path is not None:
        with csv_path.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(PA_COLUMNS)
            for r in rows:
                w.writerow(perf_analyzer_row(r))
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2, default=float) + "\n")
        return
    t = Table(title=f"servelab load: {model} at {target.base}", title_justify="left")
    cols = ["clients" if clients else "offered/s", "achieved/s", "errors", "batch", "p50 ms",
            "p90 ms", "p99 ms", "mean ms", "queue ms", "compute ms"]
    for col in cols:
        t.add_column(col, justify="right")
    for r in rows:
        first = str(r["concurrency"]) if clients else f"{r['offered_per_s']:g}"
        t.add_row(first, f"{r['achieved_per_s']:.1f}", str(r["errors"]),
                  f"{r.get('mean_batch', float('nan')):.2f}", f"{r['p50_ms']:.2f}",
                  f"{r['p90_ms']:.2f}", f"{r['p99_ms']:.2f}", f"{r['mean_ms']:.2f}",
                  f"{r.get('server_queue_ms', float('nan')):.3f}",
                  f"{r.get('server_compute_ms', float('nan')):.3f}")
    stdout.print(t)
    for r in rows:
        if r["errors_by_reason"]:
            stdout.print(f"errors at {r['offered_per_s']:g}/s: {r['errors_by_reason']}",
                         highlight=False)
