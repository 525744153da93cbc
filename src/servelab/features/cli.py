"""`servelab features ...`: thin commands over the feature store's Python API."""

from __future__ import annotations

import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from servelab.errors import StoreError, closest, cut, invalid
from servelab.files import check_writable_target

# The commands import the store's modules when they run, so `servelab --help` and the
# serving commands start without loading DuckDB, PyArrow and Redis.

app = typer.Typer(help="Feature store: point-in-time training data, online serving, parity.",
                  no_args_is_help=True)
stdout = Console()
stderr = Console(stderr=True)

RepoOpt = Annotated[Path, typer.Option("--repo", "-r", help="The feature repo directory.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print only JSON to stdout.")]
FeaturesOpt = Annotated[list[str], typer.Option(
    "--features", "-f", help="view:feature refs or service:NAME (repeat, or comma-separate).")]
StoreOpt = Annotated[str | None, typer.Option("--store", help="sqlite or redis (default: repo's).")]


def _emit(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def _refs(features: list[str]) -> list[str]:
    return [r.strip() for f in features for r in f.split(",") if r.strip()]


@app.command()
def init(
    directory: Annotated[Path, typer.Argument(help="Where to create the example repo.")],
    users: int = 1000, merchants: int = 200, days: int = 30, labels: int = 5000, seed: int = 0,
    as_json: JsonOpt = False,
) -> None:
    """Create a ready example repo: definitions plus realistic synthetic data."""
    from servelab.features.example import generate

    for label, v, hi in (("--users", users, 1_000_000), ("--merchants", merchants, 1_000_000),
                         ("--days", days, 3_650), ("--labels", labels, 10_000_000),
                         ("--seed", seed, 2**63 - 1)):
        lo = 0 if label == "--seed" else 1
        if not lo <= v <= hi:
            raise invalid(label, v, f"a whole number from {lo} to {hi:,}",
                          f"use {label} within that range")
    if users * days > 20_000_000:
        raise invalid("--users x --days", users * days, "at most 20,000,000 daily snapshots",
                      "fewer users or fewer days")
    if directory.exists() and not directory.is_dir():
        raise invalid("features init", str(directory), "a directory (new or existing)",
                      "choose a path that is not a file")
    try:
        counts = generate(directory, users=users, merchants=merchants, days=days,
                          labels=labels, seed=seed)
    except OSError as exc:
        raise StoreError(f"features init {cut(str(directory))!r}: cannot write there "
                         f"({exc.strerror or exc}); fix: choose a writable directory") from None
    if as_json:
        _emit({"repo": str(directory), "rows": counts})
        return
    stdout.print(f"created {directory}/feature_repo.toml and data/ "
                 f"({', '.join(f'{k}: {v:,} rows' for k, v in counts.items())})")
    stdout.print(f"next: servelab features apply --repo {directory}")


@app.command()
def apply(repo: RepoOpt = Path("."), store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Validate the definitions and sources; create the online store's tables."""
    from servelab.features.definitions import load_repo
    from servelab.features.offline.duckdb import DuckDBEngine
    from servelab.features.online import open_store

    r = load_repo(repo)
    engine = DuckDBEngine(r)
    for v in r.views.values():
        engine.check_source(v)
    s = open_store(r, store)
    s.apply(list(r.views.values()))
    s.close()
    summary: list[dict[str, Any]] = [
        {"view": v.name, "entities": list(v.entities), "features": len(v.features),
         "ttl_s": v.ttl_s, "source": v.source.path} for v in r.views.values()]
    if as_json:
        _emit({"project": r.config.name, "views": summary,
               "services": sorted(r.services), "online": store or r.config.online})
        return
    t = Table(title=f"feature repo {r.config.name}: applied ({store or r.config.online} "
              "online store)", title_justify="left")
    for col in ("view", "entities", "features", "ttl_s", "source"):
        t.add_column(col)
    for row in summary:
        t.add_row(row["view"], ",".join(row["entities"]), str(row["features"]),
                  str(row["ttl_s"] or "none"), row["source"])
    stdout.print(t)


@app.command("materialize")
def materialize_cmd(
    repo: RepoOpt = Path("."),
    start: Annotated[str | None, typer.Option(help="Window start, exclusive (ISO-8601).")
                     ] = None,
    end: Annotated[str | None, typer.Option(help="Window end, inclusive; default now.")] = None,
    incremental: Annotated[bool, typer.Option(help="Start where the last run ended.")] = False,
    views: Annotated[str | None, typer.Option(help="Comma-separated views (default all).")
                     ] = None,
    store: StoreOpt = None, as_json: JsonOpt = False,
) -> None:
    """Copy the latest offline rows of a window into the online store (idempotent)."""
    from servelab.features.definitions import load_repo
    from servelab.features.materialization import materialize, parse_time
    from servelab.features.online import open_store
    r = load_repo(repo)
    chosen = [name.strip() for name in views.split(",")] if views else None
    for name in chosen or []:
        if name not in r.views:
            raise invalid("--views", name, f"one of {', '.join(r.views)}",
                          "check the view name")
    s = open_store(r, store)
    with Progress(TextColumn("materializing {task.description}"), BarColumn(),
                  TextColumn("{task.completed:,}/{task.total:,}"), console=stderr,
                  transient=True) as bar:
        tasks: dict[str, Any] = {}

        def progress(view: str, done: int, total: int) -> None:
            if view not in tasks:
                tasks[view] = bar.add_task(view, total=total)
            bar.update(tasks[view], completed=done)

        t0 = time.perf_counter()
        summary = materialize(r, s, start=parse_time(start, "--start"),
                              end=parse_time(end, "--end"), incremental=incremental,
                              views=chosen, progress=progress)
        elapsed = time.perf_counter() - t0
    s.close()
    out = {**summary.to_dict(), "seconds": elapsed,
           "rows_read_per_s": summary.rows_read / elapsed if elapsed else None}
    if as_json:
        _emit(out)
        return
    t = Table(title="materialized", title_justify="left")
    for col in ("view", "window", "rows read", "written", "skipped (stale)"):
        t.add_column(col, justify="right")
    for v in summary.views:
        t.add_row(v.view, f"({v.start or 'beginning'}, {v.end}]", f"{v.rows_read:,}",
                  f"{v.written:,}", f"{v.skipped_stale:,}")
    stdout.print(t)
    stdout.print(f"{summary.rows_read:,} rows read in {elapsed:.2f} s")


def _parse_entities(specs: list[str]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for spec in specs:
        key, sep, values = spec.partition("=")
        if not sep or not values:
            raise invalid("--entity", spec, "key=value[,value...]",
                          "write e.g. --entity user_id=1,2")
        out[key.strip()] = [v.strip() for v in values.split(",")]
    if not out:
        raise invalid("--entity", None, "at least one key=values", "add --entity user_id=1,2")
    return out


@app.command("get-online")
def get_online(
    features: FeaturesOpt,
    entity: Annotated[list[str], typer.Option(help="join_key=v1,v2,... (repeat per key).")],
    repo: RepoOpt = Path("."),
    at: Annotated[str | None, typer.Option(help="Serve as of this time (TTL); default now.")
                  ] = None,
    full_names: Annotated[bool, typer.Option("--full-names")] = False,
    store: StoreOpt = None, as_json: JsonOpt = False,
) -> None:
    """Read features for entities from the online store, each value marked
    present, missing or expired."""
    from servelab.features.definitions import load_repo
    from servelab.features.materialization import parse_time, to_us
    from servelab.features.online import get_online_features, open_store
    r = load_repo(repo)
    s = open_store(r, store)
    now = parse_time(at, "--at") or datetime.now(UTC)
    cols = get_online_features(r, s, _refs(features), _parse_entities(entity), to_us(now),
                               full_feature_names=full_names)
    s.close()
    if as_json:
        _emit(cols)
        return
    t = Table(title=f"online features as of {now.isoformat()}", title_justify="left")
    names = list(cols)
    for c in names:
        t.add_column(c)
    for i in range(len(next(iter(cols.values())))):
        t.add_row(*(str(cols[c][i]) for c in names))
    stdout.print(t)


@app.command()
def historical(
    features: FeaturesOpt,
    entities: Annotated[Path, typer.Option(help="Entity rows: Parquet or CSV with the join "
                                                "keys and event_timestamp.")],
    repo: RepoOpt = Path("."),
    out: Annotated[Path | None, typer.Option(help="Write the result (.parquet or .csv).")
                   ] = None,
    engine: Annotated[str | None, typer.Option(help="duckdb or spark (default: repo's).")
                      ] = None,
    full_names: Annotated[bool, typer.Option("--full-names")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Point-in-time-correct training data for entity rows."""
    from servelab.features.definitions import load_repo
    from servelab.features.offline import get_historical_features
    if out is not None:  # before the join runs, not after
        check_writable_target(out, "--out")
        if out.suffix.lower() not in (".csv", ".parquet"):
            raise invalid("--out", str(out), "a .parquet or .csv file name",
                          "end the name with .parquet or .csv")
    r = load_repo(repo)
    t0 = time.perf_counter()
    table = get_historical_features(r, entities, _refs(features), engine=engine,
                                    full_feature_names=full_names)
    elapsed = time.perf_counter() - t0
    if out is not None:
        try:
            if out.suffix.lower() == ".csv":
                import pyarrow.csv as pacsv

                pacsv.write_csv(table, out)
            else:
                import pyarrow.parquet as pq

                pq.write_table(table, out)
        except OSError as exc:
            raise StoreError(f"--out = {cut(str(out))!r}: cannot write ({exc}); "
                             "fix: choose a writable path") from None
    if as_json:
        _emit({"rows": table.num_rows, "columns": table.column_names, "seconds": elapsed,
               "out": str(out) if out else None,
               "data": None if out else table.to_pylist()})
        return
    stdout.print(f"{table.num_rows:,} rows x {table.num_columns} columns in {elapsed:.2f} s"
                 + (f", written to {out}" if out else ""))
    head = Table(title="first rows", title_justify="left")
    for c in table.column_names:
        head.add_column(c)
    for row in table.slice(0, 8).to_pylist():
        head.add_row(*(str(v) for v in row.values()))
    stdout.print(head)


@app.command("parity")
def parity_cmd(
    repo: RepoOpt = Path("."),
    at: Annotated[str | None, typer.Option(help="Time to compare at; default: where "
                                                "materialization last ended.")] = None,
    sample: Annotated[int, typer.Option(help="Entity keys per view.")] = 200,
    fail_on_mismatch: Annotated[bool, typer.Option(help="Exit 1 if any value differs.")
                                ] = False,
    store: StoreOpt = None, as_json: JsonOpt = False,
) -> None:
    """Online values served at a time against offline point-in-time values at that time."""
    from servelab.features.definitions import load_repo
    from servelab.features.materialization import parity, parse_time
    from servelab.features.online import open_store
    if not 1 <= sample <= 1_000_000:
        raise invalid("--sample", sample, "a whole number from 1 to 1,000,000",
                      "use e.g. --sample 200")
    r = load_repo(repo)
    s = open_store(r, store)
    report = parity(r, s, at=parse_time(at, "--at"), sample=sample)
    s.close()
    if as_json:
        _emit(report.to_dict())
    else:
        t = Table(title=f"parity at {report.at}: {report.rows_checked:,} entity keys, "
                  f"{'all equal' if report.ok else 'MISMATCHES'}", title_justify="left")
        t.add_column("feature")
        t.add_column("mismatches", justify="right")
        for ref, n in report.mismatches.items():
            t.add_row(ref, str(n))
        stdout.print(t)
        for ex in report.examples:
            stdout.print(f"  {ex}")
    if fail_on_mismatch and not report.ok:
        raise typer.Exit(1)


@app.command()
def bench(
    repo: RepoOpt = Path("."),
    reads: Annotated[int, typer.Option(help="Timed reads per batch size.")] = 1000,
    view: Annotated[str | None, typer.Option(help="View to read (default: the one with the "
                                                  "most features).")] = None,
    scenario: Annotated[str, typer.Option(help="Scenario to take the figures into.")] = "seed",
    scenario_out: Annotated[Path | None, typer.Option(
        help="Write that scenario with this store's feature fetch (p50, p99) to this file.")
    ] = None,
    store: StoreOpt = None, as_json: JsonOpt = False,
) -> None:
    """Online-read latency for 1 and 100 entities (p50, p99): a feature-fetch figure for a
    serving scenario's latency budget."""
    from servelab.features.definitions import load_repo
    from servelab.features.online import open_store
    if not 1 <= reads <= 1_000_000:
        raise invalid("--reads", reads, "a whole number from 1 to 1,000,000",
                      "use e.g. --reads 1000")
    if scenario_out is not None:
        check_writable_target(scenario_out, "--scenario-out")
    r = load_repo(repo)
    v, keys = _bench_view(r, view)
    feats = list(v.feature_names)
    s = open_store(r, store)
    results = _time_reads(s, v, keys, feats, reads)
    s.close()
    out = {"store": store or r.config.online, "view": v.name, "features": len(feats),
           "reads": reads, "entities_1": results[1], "entities_100": results[100],
           "scenario_latency": {"feature_fetch_ms": results[1]["p50_ms"],
                                "feature_fetch_p99_ms": results[1]["p99_ms"]}}
    if scenario_out is not None:
        from servelab.api import load
        from servelab.scenario import scenario_to_toml

        sc = load(scenario, {"latency.feature_fetch_ms": round(results[1]["p50_ms"], 4),
                             "latency.feature_fetch_p99_ms": round(
                                 max(results[1]["p99_ms"], results[1]["p50_ms"]), 4)})
        scenario_out.write_text(scenario_to_toml(sc))
        out["scenario_out"] = str(scenario_out)
    if as_json:
        _emit(out)
    else:
        _print_bench(out, results, scenario_out)


def _bench_view(r: Any, view: str | None) -> tuple[Any, list[tuple[Any, ...]]]:
    """The view `bench` reads (named, or the one with the most features) and its keys."""
    from servelab.features.offline.duckdb import DuckDBEngine, q, source_sql

    if view is not None and view not in r.views:
        guess = closest(view, r.views)
        raise invalid("--view", view, f"one of {', '.join(r.views)}",
                      f"did you mean {guess!r}?" if guess else "check the view name")
    v = r.views[view] if view else max(r.views.values(), key=lambda x: len(x.features))
    keys = [tuple(k) for k in DuckDBEngine(r).con.sql(
        f"SELECT DISTINCT {', '.join(q(k) for k in v.join_keys)} FROM {source_sql(v)}"
    ).fetchall()]
    if not keys:
        raise invalid("--view", v.name, "a view with rows", "materialize it first")
    return v, keys


def _print_bench(out: dict[str, Any], results: dict[int, dict[str, float]],
                 scenario_out: Path | None) -> None:
    t = Table(title=f"online reads of {out['features']} features from {out['store']} "
              f"({out['reads']} each)", title_justify="left")
    for col in ("entities per read", "p50 ms", "p99 ms"):
        t.add_column(col, justify="right")
    for b in (1, 100):
        t.add_row(str(b), f"{results[b]['p50_ms']:.3f}", f"{results[b]['p99_ms']:.3f}")
    stdout.print(t)
    stdout.print("for a serving scenario's latency budget (one entity per request):\n"
                 f"[latency]\nfeature_fetch_ms = {results[1]['p50_ms']:.3f}\n"
                 f"feature_fetch_p99_ms = {results[1]['p99_ms']:.3f}", highlight=False,
                 markup=False)
    if scenario_out is not None:
        stdout.print(f"wrote {scenario_out}: try `servelab plan --scenario {scenario_out}`",
                     highlight=False, markup=False)


def _time_reads(s: Any, v: Any, keys: list[tuple[Any, ...]], feats: list[str], reads: int
                ) -> dict[int, dict[str, float]]:
    """p50 and p99 of `reads` online reads of 1 and of 100 keys."""
    from servelab.features.materialization import to_us

    now = to_us(datetime.now(UTC))
    results = {}
    for batch in (1, 100):
        times = []
        for i in range(reads):
            pick = [keys[(i * batch + j) % len(keys)] for j in range(batch)]
            t0 = time.perf_counter()
            s.read(v, pick, feats, now)
            times.append(time.perf_counter() - t0)
        times.sort()
        results[batch] = {"p50_ms": statistics.median(times) * 1e3,
                          "p99_ms": times[min(len(times) - 1, int(0.99 * len(times)))] * 1e3}
    return results


@app.command("train")
def train_cmd(
    out: Annotated[Path, typer.Option(help="Where to write the model (.onnx).")],
    repo: RepoOpt = Path("."),
    service: Annotated[str, typer.Option(help="Feature service the model reads.")
                       ] = "fraud_model_v1",
    labels: Annotated[Path | None, typer.Option(
        help="Label rows (Parquet/CSV): join keys, event_timestamp, the label; default: "
             "the repo's data/labels.parquet.")] = None,
    label: Annotated[str, typer.Option(help="The 0/1 label column.")] = "is_fraud",
    engine: Annotated[str | None, typer.Option(help="duckdb or spark (default: repo's).")
                      ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Train a logistic-regression classifier on point-in-time features; export ONNX."""
    from servelab.features.definitions import load_repo
    from servelab.features.train import train

    check_writable_target(out, "--out")
    r = load_repo(repo)
    report = train(r, service, labels or (Path(r.config.root) / "data" / "labels.parquet"),
                   label, out,
                   engine=engine)
    if as_json:
        _emit(report.to_dict())
        return
    stdout.print(f"trained on {report.rows:,} rows ({report.positives:,} positive) over "
                 f"{', '.join(report.features)}; training AUC {report.train_auc:.3f}; "
                 f"wrote {report.out}", highlight=False)


@app.command("skew")
def skew_cmd(
    log: Annotated[Path, typer.Option(help="The gateway's served-feature log folder.")],
    repo: RepoOpt = Path("."),
    service: Annotated[str | None, typer.Option(help="Feature service (default: the one "
                                                     "the log's columns match).")] = None,
    engine: Annotated[str | None, typer.Option(help="duckdb or spark (default: repo's).")
                      ] = None,
    fail_on_mismatch: Annotated[bool, typer.Option(help="Exit 1 if any value differs.")
                                ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Training/serving skew: served values against offline point-in-time values."""
    from servelab.features.definitions import load_repo
    from servelab.features.skew import skew

    report = skew(load_repo(repo), log, service, engine=engine)
    if as_json:
        _emit(report.to_dict())
    else:
        t = Table(title=f"skew of {report.service}: {report.rows:,} served rows, "
                  f"{'no skew' if report.ok else 'SKEW'}", title_justify="left")
        t.add_column("feature")
        t.add_column("mismatches", justify="right")
        t.add_column("share", justify="right")
        for f, n in report.mismatches.items():
            t.add_row(f, f"{n:,}", f"{n / report.rows:.2%}" if report.rows else "-")
        stdout.print(t)
        for ex in report.examples:
            stdout.print(f"  {ex}", highlight=False, markup=False)
    if fail_on_mismatch and not report.ok:
        raise typer.Exit(1)
