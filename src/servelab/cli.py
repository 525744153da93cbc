"""The `servelab` command: one thin command per verb over the Python API.

One error boundary: a ServelabError becomes one line on stderr and exit code 1.
`--json` prints only JSON to stdout; progress goes to stderr.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from servelab.api import SWEEP_PARAMS, load, run_plan, run_simulate, run_sweep
from servelab.errors import InputError, ServelabError
from servelab.render import print_to, report_tables, seed_table
from servelab.scenario import Scenario
from servelab.seed import seed_comparison, seed_rows_dict

app = typer.Typer(
    help="servelab: plan, simulate and measure ML and LLM inference serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

stdout = Console()
stderr = Console(stderr=True)

ScenarioOpt = Annotated[str, typer.Option("--scenario", "-s",
                                          help="A scenario TOML file, or 'seed'.")]
QpsOpt = Annotated[float | None, typer.Option("--qps", help="Offered requests per second.")]
DelayOpt = Annotated[int | None, typer.Option("--max-queue-delay-us",
                                              help="Triton max_queue_delay_microseconds.")]
MbsOpt = Annotated[int | None, typer.Option("--max-batch-size", help="Triton max_batch_size.")]
PrefOpt = Annotated[list[int] | None, typer.Option(
    "--preferred-batch-size", help="Triton preferred_batch_size (repeat for several).")]
QueueOpt = Annotated[int | None, typer.Option("--max-queue-size",
                                              help="Triton max_queue_size (0: unbounded).")]
TimeoutOpt = Annotated[int | None, typer.Option(
    "--timeout-us", help="Triton default_timeout_microseconds (0: none).")]
InstOpt = Annotated[int | None, typer.Option("--instances-per-gpu",
                                             help="Model instances per GPU.")]
GpuOpt = Annotated[str | None, typer.Option("--gpu", help="GPU from the catalog, e.g. H100-SXM.")]
NGpuOpt = Annotated[int | None, typer.Option("--num-gpus", help="GPUs serving the model.")]
PriceOpt = Annotated[float | None, typer.Option("--price", help="$ per GPU-hour.")]
NReqOpt = Annotated[int | None, typer.Option("--num-requests", help="Requests to simulate.")]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Random seed.")]
SloOpt = Annotated[float | None, typer.Option("--slo-ms", help="p99 end-to-end SLO in ms.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print only JSON to stdout.")]


# Each common flag's parameter name -> the scenario key it overrides.
_FLAG_KEYS = {
    "qps": "workload.qps",
    "max_queue_delay_us": "batching.max_queue_delay_microseconds",
    "max_batch_size": "batching.max_batch_size",
    "preferred_batch_size": "batching.preferred_batch_size",
    "max_queue_size": "batching.max_queue_size",
    "timeout_us": "batching.default_timeout_microseconds",
    "instances_per_gpu": "batching.instances_per_gpu",
    "gpu": "hardware.gpu",
    "num_gpus": "hardware.num_gpus",
    "price": "hardware.price_per_gpu_hour",
    "num_requests": "workload.num_requests",
    "seed": "workload.seed",
    "slo_ms": "latency.p99_slo_ms",
}


def _load(params: dict[str, Any]) -> Scenario:
    """The command's scenario with its common flags applied (an unset flag is None).

    An error in a flag's value names the flag as typed and the scenario key it sets.
    """
    given = {key: params[name] for name, key in _FLAG_KEYS.items()}
    if not given["batching.preferred_batch_size"]:
        given["batching.preferred_batch_size"] = None  # Typer gives [] for "not given"
    try:
        return load(params["scenario"], given)
    except InputError as exc:
        msg = str(exc)
        for name, key in _FLAG_KEYS.items():
            section, _, field = key.partition(".")
            label = f"[{section}] {field}"
            if given[key] is not None and msg.startswith(label):
                flag = "--" + name.replace("_", "-")
                raise InputError(f"{flag} ({label}){msg[len(label):]}") from None
        raise


def _emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, allow_nan=False) + "\n")


@app.command()
def simulate(
    scenario: ScenarioOpt = "seed", qps: QpsOpt = None, max_queue_delay_us: DelayOpt = None,
    max_batch_size: MbsOpt = None, preferred_batch_size: PrefOpt = None,
    max_queue_size: QueueOpt = None, timeout_us: TimeoutOpt = None,
    instances_per_gpu: InstOpt = None, gpu: GpuOpt = None, num_gpus: NGpuOpt = None,
    price: PriceOpt = None, num_requests: NReqOpt = None, seed: SeedOpt = None,
    slo_ms: SloOpt = None, as_json: JsonOpt = False,
) -> None:
    """Simulate the scenario as given: batches, GPU, latency budget, cost."""
    s = _load(locals())
    report = run_simulate(s)
    if as_json:
        _emit_json(report.to_dict())
    else:
        print_to(stdout, report_tables(report, title=f"servelab simulate: {s.name}"))


@app.command()
def plan(
    scenario: ScenarioOpt = "seed", qps: QpsOpt = None, max_queue_delay_us: DelayOpt = None,
    max_batch_size: MbsOpt = None, preferred_batch_size: PrefOpt = None,
    max_queue_size: QueueOpt = None, timeout_us: TimeoutOpt = None,
    instances_per_gpu: InstOpt = None, gpu: GpuOpt = None, num_gpus: NGpuOpt = None,
    price: PriceOpt = None, num_requests: NReqOpt = None, seed: SeedOpt = None,
    slo_ms: SloOpt = None, as_json: JsonOpt = False,
) -> None:
    """The fewest GPUs that meet the p99 SLO, what 1M inferences cost, the latency budget.

    With --scenario seed, also the seed dashboard's stated figures next to servelab's.
    """
    s = _load(locals())
    report = run_plan(s)
    rows = seed_comparison(s, report) if scenario == "seed" else None
    if as_json:
        out = report.to_dict()
        if rows is not None:
            out["seed_comparison"] = seed_rows_dict(rows)
        _emit_json(out)
        return
    print_to(stdout, report_tables(report, title=f"servelab plan: {s.name}"))
    if rows is not None:
        print_to(stdout, seed_table(rows))


@app.command()
def sweep(
    param: Annotated[str, typer.Argument(help=f"One of: {', '.join(SWEEP_PARAMS)}.")],
    start: Annotated[float | None, typer.Option(help="First value.")] = None,
    stop: Annotated[float | None, typer.Option(help="Last value (included).")] = None,
    steps: Annotated[int, typer.Option(help="Number of values from start to stop.")] = 8,
    values: Annotated[str | None, typer.Option(help="Comma-separated values instead.")] = None,
    csv_path: Annotated[Path | None, typer.Option("--csv", help="Also write a CSV here.")] = None,
    with_plan: Annotated[bool, typer.Option("--plan", help="Run the planner at each value.")
                         ] = False,
    scenario: ScenarioOpt = "seed", qps: QpsOpt = None, max_queue_delay_us: DelayOpt = None,
    max_batch_size: MbsOpt = None, preferred_batch_size: PrefOpt = None,
    max_queue_size: QueueOpt = None, timeout_us: TimeoutOpt = None,
    instances_per_gpu: InstOpt = None, gpu: GpuOpt = None, num_gpus: NGpuOpt = None,
    price: PriceOpt = None, num_requests: NReqOpt = None, seed: SeedOpt = None,
    slo_ms: SloOpt = None, as_json: JsonOpt = False,
) -> None:
    """Vary one parameter over a range: a table (and a CSV) of the key figures."""
    s = _load(locals())
    grid = _grid(start, stop, steps, values)
    with Progress(TextColumn("sweep {task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn(),
                  console=stderr, transient=True, disable=len(grid) < 4) as bar:
        task = bar.add_task(param, total=len(grid))
        rows = run_sweep(s, param, grid, plan=with_plan,
                         on_step=lambda: bar.advance(task))
    if csv_path is not None:
        _write_csv(csv_path, rows)
    if as_json:
        _emit_json(rows)
        return
    t = Table(title=f"servelab sweep {param}: {s.name}", title_justify="left")
    cols = list(rows[0]) if rows else []
    for c in cols:
        t.add_column(c, justify="right")
    for row in rows:
        t.add_row(*(_fmt(row[c]) for c in cols))
    stdout.print(t)
    if csv_path is not None:
        stderr.print(f"wrote {csv_path}")


def _grid(start: float | None, stop: float | None, steps: int, values: str | None
          ) -> list[float]:
    from servelab.errors import invalid

    if values is not None:
        try:
            return [float(v) for v in values.split(",") if v.strip()]
        except ValueError:
            raise invalid("--values", values, "comma-separated numbers",
                          "write e.g. --values 500,1000,2000") from None
    if start is None or stop is None:
        raise invalid("--start/--stop", (start, stop), "both, or --values",
                      "give e.g. --start 500 --stop 4000 --steps 8")
    if steps < 1:
        raise invalid("--steps", steps, "a whole number >= 1", "use --steps 8")
    return [float(x) for x in np.linspace(start, stop, steps)]


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:,.4g}" if abs(x) < 1e5 else f"{x:,.0f}"
    return str(x)


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    from servelab.errors import StoreError

    try:
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else [])
            w.writeheader()
            w.writerows(rows)
    except OSError as exc:
        raise StoreError(f"--csv = {str(path)!r}: cannot write ({exc.strerror}); "
                         "fix: choose a writable path") from exc


def main() -> None:
    """Entry point: the one place a user's mistake becomes a message instead of a traceback.

    Typer reports its own usage errors (unknown flag, a word where a number goes)
    and exits 2; a ServelabError from the scenario or a file exits 1.
    """
    try:
        app()
    except ServelabError as exc:
        stderr.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(1)
