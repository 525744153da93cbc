"""`servelab drift`: PSI per feature between a reference and a current Parquet side."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from servelab.errors import InputError, cut, invalid

stdout = Console()
stderr = Console(stderr=True)
MAX_ROWS = 100_000_000  # per side: about 800 MB a numeric column
EXIT_DRIFT = 4  # --fail-on: drift at or past the level was found
STYLE = {"ok": "green", "warn": "yellow", "alert": "bold red"}


def read_side(path: Path, what: str, columns: list[str] | None = None) -> Any:
    """A Parquet file, or a folder of them, as one pyarrow table (row count capped)."""
    import pyarrow.dataset as ds

    if not path.exists():
        raise InputError(f"{what} = {cut(str(path))!r}: no such file or folder; fix: give a "
                         "Parquet file or a folder of them")
    try:
        data = ds.dataset(str(path), format="parquet")
        rows = data.count_rows()
    except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
        raise InputError(f"{what} = {cut(str(path))!r}: not readable as Parquet "
                         f"({cut(str(exc), 150)}); fix: give a .parquet file or a folder of "
                         "them") from None
    if rows == 0:
        raise InputError(f"{what} = {cut(str(path))!r}: no rows")
    if rows > MAX_ROWS:
        raise InputError(f"{what} = {cut(str(path))!r}: {rows:,} rows; expected at most "
                         f"{MAX_ROWS:,}; fix: sample it, or pass a window of it")
    cols = None if columns is None else [c for c in columns if c in data.schema.names]
    return data.to_table(columns=cols)


def drift(
    reference: Annotated[Path, typer.Option(
        help="The reference: a Parquet file or folder (e.g. a training set from `features "
             "historical`).")],
    current: Annotated[Path, typer.Option(
        help="What is compared: a Parquet file or folder (e.g. the gateway's served log).")],
    features: Annotated[str | None, typer.Option(
        help="Comma-separated columns (default: every shared feature column).")] = None,
    timestamp: Annotated[str | None, typer.Option(
        help="With --window: the current side's time column (timestamp, or integer "
             "microseconds as the served log's request_time).")] = None,
    window: Annotated[str | None, typer.Option(
        help="Compute per window of the current side, e.g. 15m, 1h, 1d.")] = None,
    bins: Annotated[int, typer.Option(help="Quantile bins from the reference.")] = 10,
    epsilon: Annotated[float, typer.Option(
        help="Pseudo-count added to every occupied bin on both sides (empty bins).")] = 0.5,
    warn: Annotated[float, typer.Option(help="PSI at which a significant drift warns.")
                    ] = 0.1,
    alert: Annotated[float, typer.Option(help="PSI at which a significant drift alerts.")
                     ] = 0.25,
    fail_on: Annotated[str | None, typer.Option(
        help=f"warn or alert: exit {EXIT_DRIFT} when any feature reaches it (pipelines).")
                       ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON to stdout.")
                       ] = False,
) -> None:
    """Population stability index per feature, with the level expected by chance: a PSI
    that does not exceed it raises nothing."""
    from servelab import drift as d

    d.check_settings(bins, epsilon, warn, alert)
    if fail_on not in (None, "warn", "alert"):
        raise invalid("--fail-on", fail_on, "warn or alert", "e.g. --fail-on alert")
    if (window is None) != (timestamp is None):
        raise invalid("--window/--timestamp", (window, timestamp), "both or neither",
                      "e.g. --timestamp request_time --window 1h")
    every = d.parse_window(window) if window is not None else None
    names = [f.strip() for f in features.split(",") if f.strip()] if features else None
    ref = read_side(reference, "--reference")
    cur = read_side(current, "--current")
    if every is not None:
        assert timestamp is not None
        reports = [d.compare_tables(ref, part, names, bins=bins, epsilon=epsilon, warn=warn,
                                    alert=alert, timestamp=timestamp, window=label)
                   for label, part in d.windows(cur, timestamp, every)]
    else:
        reports = [d.compare_tables(ref, cur, names, bins=bins, epsilon=epsilon, warn=warn,
                                    alert=alert, timestamp=timestamp)]
    worst = max((d.STATUSES.index(r.status) for r in reports), default=0)
    if as_json:
        body: Any = [r.to_dict() for r in reports] if every is not None else reports[0].to_dict()
        sys.stdout.write(json.dumps(body, indent=2) + "\n")
    else:
        _print(reports, windowed=every is not None)
    if fail_on is not None and worst >= d.STATUSES.index(fail_on):
        raise typer.Exit(EXIT_DRIFT)


def _print(reports: list[Any], windowed: bool) -> None:
    r0 = reports[0]
    stdout.print(f"PSI per feature: {r0.bins} reference-quantile bins, epsilon {r0.epsilon:g} "
                 f"per bin, warn {r0.warn:g}, alert {r0.alert:g}", highlight=False)
    for r in reports:
        t = Table(title=f"window from {r.window}" if windowed else None, title_justify="left")
        for c in ("feature", "PSI", "chance p99", "rows ref/cur", "missing", "new", "status"):
            left = c in ("feature", "status")
            t.add_column(c, justify="left" if left else "right", no_wrap=not left,
                         overflow="fold")
        for f in r.features:
            status = f.status
            if not f.significant and f.psi >= r.warn:
                status = "ok (noise)"
            t.add_row(f.feature, f"{f.psi:.4f}", f"{f.chance_psi_p99:.4f}",
                      f"{f.n_reference:,}/{f.n_current:,}",
                      f"{f.missing_reference:,}/{f.missing_current:,}",
                      f"{f.new_categories:,}" if f.kind == "categorical" else "",
                      f"[{STYLE[f.status]}]{status}[/]")
        stdout.print(t)
    if r0.skipped:
        stdout.print("not compared: " + ", ".join(f"{k} ({v})" for k, v in r0.skipped.items()),
                     highlight=False)
    stdout.print("A PSI at or below 'chance p99' is what two samples of one distribution "
                 "give 1 time in 100 at these sizes: not significant, never an alert.",
                 highlight=False)
