"""`servelab load`: open-loop load against a v2 server, perf_analyzer-style output."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from servelab.errors import invalid
from servelab.files import prepare_out_dir

stdout = Console()
stderr = Console(stderr=True)
MAX_RATES = 100


def load(
    model: Annotated[str, typer.Option("--model", "-m", help="Model name on the server.")],
    url: Annotated[str, typer.Option(help="The server, e.g. http://127.0.0.1:8000.")
                   ] = "http://127.0.0.1:8000",
    qps: Annotated[float | None, typer.Option(help="Offered requests per second.")] = None,
    rates: Annotated[str | None, typer.Option(
        help="Rates for a sweep: 100,200,400, or START:STOP:STEPS (e.g. 100:1000:4).")
                     ] = None,
    concurrency: Annotated[str | None, typer.Option(
        help="Closed loop instead: comma-separated client counts, e.g. 1,2,4,8.")] = None,
    arrival: Annotated[str, typer.Option(
        help="Open-loop arrivals: poisson, constant, or trace (--trace).")] = "poisson",
    trace: Annotated[Path | None, typer.Option(
        help="With --arrival trace: a CSV of arrival times (arrival_s, arrival_ms, "
             "arrival_us or timestamp, or one column of seconds), replayed as recorded.")
                     ] = None,
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
    stability_percentage: Annotated[float | None, typer.Option(
        "--stability-percentage", "-s",
        help="As perf_analyzer: run each step in windows of --duration until the last "
             "three agree within this percentage (throughput and latency), and report "
             "the three together. Off by default: one window a step.")] = None,
    max_trials: Annotated[int, typer.Option(
        help="With --stability-percentage: the most windows a step runs.")] = 10,
    percentile: Annotated[int | None, typer.Option(
        help="With --stability-percentage: judge the windows by this latency percentile "
             "(e.g. 99) instead of the average.")] = None,
    csv_path: Annotated[Path | None, typer.Option(
        "--csv", help="Also write perf_analyzer's CSV columns here (microseconds).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON to stdout.")
                       ] = False,
) -> None:
    """Open-loop Poisson load at each rate: latency from intended send times, errors by
    reason, and the server's own mean batch, queue and compute time."""
    from servelab.files import check_writable_target
    from servelab.measure.load import LoadSpec, run_load

    trace_s = _trace_seconds(trace)
    if trace_s is not None and qps is None and rates is None and concurrency is None:
        qps = trace_s.size / max(float(trace_s[-1]), 1e-9)  # the trace's own rate
    if sum(x is not None for x in (qps, rates, concurrency)) != 1:
        raise invalid("--qps/--rates/--concurrency", (qps, rates, concurrency),
                      "exactly one of them", "give --qps 500, --rates 100,200,400 or "
                      "--concurrency 1,2,4")
    if qps is not None and not 0 < qps <= 1e6:
        raise invalid("--qps", qps, "a rate from above 0 to 1e6 per second", "e.g. --qps 500")
    spec = LoadSpec(rates=tuple([qps] if qps is not None else parse_rates(rates)
                                if rates is not None else []),
                    concurrency=tuple(_counts(concurrency)), trace_s=trace_s,
                    arrival=arrival, duration_s=duration, num_requests=num_requests,
                    connections=connections,
                    stability=_stability(stability_percentage, max_trials, percentile))
    if csv_path is not None:
        check_writable_target(csv_path, "--csv")
    report = run_load(url, model, spec, entities=None if entities is None else str(entities),
                      binary=binary, seed=seed, each_step=_step_bar, on_step=_warn_behind)
    if csv_path is not None:
        _write_perf_analyzer_csv(csv_path, report)
    if as_json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2, default=float) + "\n")
        return
    _print_load(report, closed=bool(spec.concurrency))


def _trace_seconds(trace: Path | None) -> Any:
    if trace is None:
        return None
    from servelab.batching.arrivals import load_trace

    return load_trace(trace, "--trace") / 1e9


def _counts(text: str | None) -> list[int]:
    if text is None:
        return []
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise invalid("--concurrency", text, "comma-separated whole numbers",
                      "e.g. --concurrency 1,2,4") from None


@contextlib.contextmanager
def _step_bar(what: str, n: int) -> Iterator[list[int]]:
    stderr.print(f"load: {what}, {n:,} requests...", highlight=False)
    with progress_bar(n) as counter:
        yield counter


def _warn_behind(step: Any) -> None:
    if step.behind_p99_ms > 1.0:
        stderr.print(f"warning: the client fell behind at {step.offered_per_s:g}/s (p99 "
                     f"{step.behind_p99_ms:.1f} ms late); latencies still count from the "
                     "intended send times", highlight=False)
    st = step.stability
    if st is not None:
        what = f"{step.concurrency} clients" if step.concurrency else f"{step.offered_per_s:g}/s"
        if st["stable"]:
            stderr.print(f"load: {what} stable after {st['windows']} windows",
                         highlight=False)
        else:
            stderr.print(f"warning: {what} did not settle in {st['windows']} windows "
                         f"(throughput {_spread(st['window_per_s'])}, latency "
                         f"{_spread(st['window_latency_ms'])} over the last three); its "
                         "figures are the last three together; fix: a longer --duration "
                         "or a quieter machine", highlight=False)


def _spread(xs: list[float]) -> str:
    """The largest of the last three over the smallest, as a percentage above it."""
    from servelab.measure.stability import last_spread

    s = last_spread(xs)
    return "n/a" if math.isnan(s) else f"+{s:.0%}"


def _stability(percentage: float | None, max_trials: int, percentile: int | None) -> Any:
    from servelab.measure.stability import Stability

    if percentage is None and (max_trials != Stability().max_trials
                               or percentile is not None):
        raise invalid("--max-trials/--percentile", (max_trials, percentile),
                      "--stability-percentage with them (they say how windows are judged)",
                      "add --stability-percentage 10, or leave them out")
    return Stability(percentage, max_trials, percentile)


def _write_perf_analyzer_csv(path: Path, report: Any) -> None:
    from servelab.measure.load import PA_COLUMNS, perf_analyzer_row

    closed = any(step.concurrency for step in report.steps)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(("Concurrency", *PA_COLUMNS[1:]) if closed else PA_COLUMNS)
        for step in report.steps:
            w.writerow(perf_analyzer_row(step.to_dict()))


def _print_load(report: Any, *, closed: bool) -> None:
    t = Table(title=f"servelab load: {report.model} at {report.base_url}",
              title_justify="left")
    cols = ["clients" if closed else "offered/s", "achieved/s", "errors", "batch", "p50 ms",
            "p90 ms", "p99 ms", "mean ms", "queue ms", "compute ms"]
    for col in cols:
        t.add_column(col, justify="right")
    nan = float("nan")
    for r in report.steps:
        first = str(r.concurrency) if closed else f"{r.offered_per_s:g}"
        t.add_row(first, f"{r.achieved_per_s:.1f}", str(r.errors),
                  f"{r.server.get('mean_batch', nan):.2f}", f"{r.p50_ms:.2f}",
                  f"{r.p90_ms:.2f}", f"{r.p99_ms:.2f}", f"{r.mean_ms:.2f}",
                  f"{r.server.get('server_queue_ms', nan):.3f}",
                  f"{r.server.get('server_compute_ms', nan):.3f}")
    stdout.print(t)
    for r in report.steps:
        if r.errors_by_reason:
            stdout.print(f"errors at {r.offered_per_s:g}/s: {r.errors_by_reason}",
                         highlight=False)


def parse_rates(text: str) -> list[float]:
    """100,200,400 or START:STOP:STEPS (evenly spaced, both ends included)."""
    fix = "e.g. --rates 100,200,400 or --rates 100:1000:4"
    try:
        if ":" in text:
            start, stop, steps = text.split(":")
            k = int(steps)
            if not 1 <= k <= MAX_RATES:
                raise invalid("--rates", text, f"1 to {MAX_RATES} steps", fix)
            a, b = float(start), float(stop)
            grid = [a] if k == 1 else [a + (b - a) * i / (k - 1) for i in range(k)]
        else:
            grid = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise invalid("--rates", text, "comma-separated numbers or START:STOP:STEPS",
                      fix) from None
    if not grid or len(grid) > MAX_RATES or not all(0 < r <= 1e6 for r in grid):
        raise invalid("--rates", text, f"1 to {MAX_RATES} rates from above 0 to 1e6 per second",
                      fix)
    return grid


@contextlib.contextmanager
def progress_bar(total: int) -> Iterator[list[int]]:
    """A progress bar on stderr (a terminal only) fed by a counter the run increments."""
    counter = [0]
    if not stderr.is_terminal:
        yield counter
        return
    from rich.progress import Progress

    stop = threading.Event()
    with Progress(console=stderr, transient=True) as bar:
        task = bar.add_task("requests answered", total=total)

        def follow() -> None:
            while not stop.wait(0.2):
                bar.update(task, completed=counter[0])

        t = threading.Thread(target=follow, daemon=True)
        t.start()
        try:
            yield counter
        finally:
            stop.set()
            t.join()


def validate(
    model: Annotated[str | None, typer.Option(
        "--model", "-m", help="Model name on the server (with --serve: the name to serve "
        "it under; default 'demo').")] = None,
    url: Annotated[str | None, typer.Option(
        help="The server, e.g. http://127.0.0.1:8000 (or --serve).")] = None,
    serve: Annotated[str | None, typer.Option(
        help="Start servelab's own gateway for the run: PATH.onnx, or 'demo' for a built-in "
             "MLP (3 x 2048 hidden).")] = None,
    rates: Annotated[str | None, typer.Option(
        help="Rates to measure: 200,500,800 or START:STOP:STEPS (default: 20%, 50% and "
             "80% of the measured open-loop saturation).")] = None,
    duration: Annotated[float, typer.Option(help="Seconds of load per rate.")] = 10.0,
    max_batch_size: Annotated[int | None, typer.Option(
        help="Replace (or, without a config endpoint, give) max_batch_size.")] = None,
    max_queue_delay_us: Annotated[int | None, typer.Option(
        help="Replace or give max_queue_delay_microseconds.")] = None,
    instances: Annotated[int | None, typer.Option(
        help="Replace or give the instance count.")] = None,
    batcher_first: Annotated[float | None, typer.Option(
        help="Share of completion races Triton's batcher thread wins, as `servelab "
             "replay-trace` measures it from the server's trace (0: the source's order). "
             "Default: read from the trace during each rate's warm-up where one is read "
             "(--serve, or --trace-file), else 0.")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Write scenario.toml (the fitted scenario), validation.json and "
             "validation.html (predicted vs measured against the rate) in this folder.")
                   ] = None,
    seed: Annotated[int, typer.Option(help="Seed for arrivals and inputs.")] = 0,
    calibrate: Annotated[bool, typer.Option(
        help="Recalibrate the closed-loop profile by the batch times the server showed "
             "under open-loop load (the saturation search's steps, run before any measured "
             "rate; with --rates the search runs for this alone). For a server whose speed "
             "differs between a closed loop and open-loop traffic; on a machine the client "
             "shares, the search's heavy steps can make it worse. Turns "
             "--calibrate-at-rate off.")] = False,
    calibrate_at_rate: Annotated[bool | None, typer.Option(
        "--calibrate-at-rate/--no-calibrate-at-rate",
        help="Before each rate, a warm-up run at that rate (half its requests, other "
             "arrivals); the server's batch times in it replace the profile's for that "
             "rate's prediction (the profile's own is kept beside it, as "
             "closed_loop_profile). Default: on, unless --calibrate; the server's speed "
             "under load often differs from its closed-loop profile's.")] = None,
    server_cpus: Annotated[str | None, typer.Option(
        help="With --serve: run the gateway on these CPUs alone (e.g. 0-3), as taskset -c "
             "would.")] = None,
    client_cpus: Annotated[str | None, typer.Option(
        help="Run validate itself (the load generator) on these CPUs alone (e.g. 8-15): "
             "apart from the server's, the two no longer compete.")] = None,
    frontend_workers: Annotated[int | None, typer.Option(
        help="The server's front end as a CPU station of this many workers before the "
             "batcher (0: none, the time outside stays a delay; default 1 with --serve, "
             "an interpreter-bound server, else 0).")] = None,
    frontend_cpu_ms: Annotated[float | None, typer.Option(
        help="A request's CPU time in a front-end worker (default: fitted, the server's own "
             "time per request beyond queue and compute at low load).")] = None,
    frontend_event_loop: Annotated[bool | None, typer.Option(
        "--frontend-event-loop/--no-frontend-event-loop",
        help="The front end is one event loop that hands each turn's requests to the "
             "batcher together (default: with --serve, servelab's gateway; else threads).")
                                   ] = None,
    frontend_answer_share: Annotated[float | None, typer.Option(
        help="With an event loop: the share of a request's cost in it that is its answer, "
             "written when its batch ends (default 0.4, as measured in servelab's gateway; "
             "0: all of it before the batcher).")] = None,
    stalls: Annotated[bool | None, typer.Option(
        "--stalls/--no-stalls",
        help="Read the whole server's stalls (a batch at least 1.5x its size's usual "
             "time and 0.5 ms more) from the trace of the gateway --serve starts, during "
             "each rate's warm-up (or Triton's, --trace-file), and simulate them (default: "
             "on wherever a trace is read).")] = None,
    trace_file: Annotated[Path | None, typer.Option(
        help="With --url: the server's trace, the PATH of Triton's --trace-config "
             "triton,file=PATH (level=TIMESTAMPS, rate=1, a log-frequency, on this "
             "machine). Read during each rate's warm-up as the gateway's is with --serve: "
             "its stalls, and how it hands one batch over to the next.")] = None,
    handoff: Annotated[bool | None, typer.Option(
        "--handoff/--no-handoff",
        help="Read from the trace during each rate's warm-up the instance's turnaround "
             "between batches (its end to the next start, which no statistic counts) and "
             "the share of completion races the batcher thread wins, and simulate them "
             "(default: on wherever a trace is read).")] = None,
    series: Annotated[bool | None, typer.Option(
        "--series/--no-series",
        help="Draw the batch times the trace showed during each rate's warm-up in their "
             "order, in runs of 50 batches, so the server's slow stretches come back as "
             "stretches (default: on wherever a trace is read; off: each size's mean "
             "time for every batch).")] = None,
    frontend_at_rate: Annotated[bool | None, typer.Option(
        "--frontend-at-rate/--no-frontend-at-rate",
        help="With a warm-up and a front-end station: scale the front end's fitted costs "
             "at each rate so that the simulator gives the warm-up's median latency "
             "(default: on with a warm-up).")] = None,
    stability_percentage: Annotated[float | None, typer.Option(
        "--stability-percentage",
        help="As perf_analyzer: measure each rate in windows of --duration until the last "
             "three agree within this percentage (throughput and latency), and hold the "
             "prediction to the three together. Off by default: one window a rate.")
                                    ] = None,
    max_trials: Annotated[int, typer.Option(
        help="With --stability-percentage: the most windows a rate runs.")] = 10,
    percentile: Annotated[int | None, typer.Option(
        help="With --stability-percentage: judge the windows by this latency percentile "
             "(e.g. 99) instead of the average.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON to stdout.")
                       ] = False,
) -> None:
    """Profile a v2 server, fit the simulator to it, load it at several rates and print
    the prediction beside the measurement, with % error and a verdict."""
    from servelab.measure.process import parse_cpus
    from servelab.measure.validate import ValidationSpec, run_validation, write_html
    from servelab.scenario import scenario_to_toml

    if out is not None:
        prepare_out_dir(out, "--out")
    spec = ValidationSpec(
        model=model, url=url, serve=serve,
        rates=tuple(parse_rates(rates)) if rates is not None else None,
        duration_s=duration, max_batch_size=max_batch_size,
        max_queue_delay_us=max_queue_delay_us, instances=instances,
        batcher_first=batcher_first, seed=seed, calibrate=calibrate,
        calibrate_at_rate=calibrate_at_rate,
        server_cpus=tuple(sorted(parse_cpus("--server-cpus", server_cpus)))
        if server_cpus is not None else None,
        client_cpus=tuple(sorted(parse_cpus("--client-cpus", client_cpus)))
        if client_cpus is not None else None,
        frontend_workers=frontend_workers, frontend_cpu_ms=frontend_cpu_ms,
        frontend_event_loop=frontend_event_loop, frontend_answer_share=frontend_answer_share,
        stalls=stalls, stability=_stability(stability_percentage, max_trials, percentile),
        frontend_at_rate=frontend_at_rate, trace_file=trace_file, handoff=handoff,
        series=series)

    def say(message: str) -> None:
        if not as_json:
            stderr.print(message, highlight=False, markup=False)

    report = run_validation(spec, say=say)
    d = report.to_dict()
    if out is not None:
        (out / "scenario.toml").write_text(scenario_to_toml(report.fit))
        (out / "validation.json").write_text(json.dumps(d, indent=2, default=float))
        write_html(d, out / "validation.html")
        say(f"validate: wrote {out}/scenario.toml, validation.json, validation.html")
    if as_json:
        sys.stdout.write(json.dumps(d, indent=2, default=float) + "\n")
        return
    _print_validation(d)


def _print_validation(report: dict[str, Any]) -> None:
    t = Table(title=f"servelab validate: {report['model']} at {report['url']} "
                    "(predicted / measured, error)", title_justify="left")
    figures = [("mean_batch", "batch", "{:.2f}"), ("p50_ms", "p50 ms", "{:.2f}"),
               ("p90_ms", "p90 ms", "{:.2f}"), ("p99_ms", "p99 ms", "{:.2f}"),
               ("queue_ms", "queue ms", "{:.2f}"), ("throughput_per_s", "served/s", "{:.0f}")]
    t.add_column("rate/s", justify="right")
    for _, label, _ in figures:
        t.add_column(label, justify="right")
    t.add_column("probe drift", justify="right")  # one-row batch now vs at profiling
    for r in report["rates"]:
        cells = [f"{r['rate_per_s']:g}"]
        for key, _, fmt in figures:
            c = r["compare"][key]
            if c["measured"] is None:
                cells.append("n/a")
                continue
            err = "" if c["error"] is None else f" {c['error']:+.0%}"
            mark = {True: "", False: " ✗", None: ""}[c["ok"]]
            cells.append(f"{fmt.format(c['predicted'])} / {fmt.format(c['measured'])}"
                         f"{err}{mark}")
        cells.append(f"{r.get('probe_drift', 1.0) - 1:+.0%}")
        t.add_row(*cells)
    stdout.print(t)
    tol = ", ".join(f"{k} ±{v:.0%}" for k, v in report["tolerance"].items())
    stdout.print(("within tolerance" if report["within_tolerance"] else "outside tolerance")
                 + f" ({tol})", highlight=False)
    for m in report["misses"]:
        stdout.print(f"  miss: {m}", highlight=False)
    for n in report["notes"]:
        stdout.print(f"  note: {n}", highlight=False)


def replay_trace(
    trace: Annotated[list[Path], typer.Argument(
        help="A Triton trace: tritonserver --trace-config level=TIMESTAMPS --trace-config "
             "rate=1 --trace-config triton,file=PATH, written while the load ran (or the "
             "numbered files PATH.0, PATH.1 ... that log_frequency > 0 writes).")],
    max_batch_size: Annotated[int, typer.Option(help="The model's max_batch_size.")],
    max_queue_delay_us: Annotated[int, typer.Option(
        help="The model's dynamic_batching max_queue_delay_microseconds.")],
    instances: Annotated[int, typer.Option(help="Instances of the model (instance_group).")
                         ] = 1,
    preferred_batch_size: Annotated[str | None, typer.Option(
        help="The model's preferred_batch_size, comma-separated.")] = None,
    model: Annotated[str | None, typer.Option(
        "--model", "-m", help="The model to replay, when the trace holds several.")] = None,
    scenario_out: Annotated[Path | None, typer.Option(
        help="Also write a scenario fitted to the trace (compute and turnaround per batch "
             "size, per-batch spread, the completion race, the trace's rate) for simulate "
             "/ plan / sweep.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON to stdout.")
                       ] = False,
) -> None:
    """Replay a real Triton's trace through the simulator's batcher: the trace's own
    queue-entry times, measured compute and turnaround, Triton's rule (as the source
    orders a completion, and with the completion race read from the trace) beside what
    Triton did (mean batch, queue, batches that left older requests behind)."""
    from servelab.files import check_writable_target
    from servelab.measure.replay import replay, trace_scenario
    from servelab.scenario import scenario_from_dict, scenario_to_toml
    from servelab.trace_file import read_trace

    prefs: list[int] = []
    if preferred_batch_size is not None:
        try:
            prefs = [int(x) for x in preferred_batch_size.split(",") if x.strip()]
        except ValueError:
            raise invalid("--preferred-batch-size", preferred_batch_size,
                          "whole numbers separated by commas", "e.g. 4,8") from None
    # The scenario's own checks give the policy its ranges and one-line errors.
    s = scenario_from_dict({"batching": {
        "max_batch_size": max_batch_size, "max_queue_delay_microseconds": max_queue_delay_us,
        "preferred_batch_size": prefs, "instances_per_gpu": instances}}, base_dir=None)
    if scenario_out is not None:
        check_writable_target(scenario_out, "--scenario-out")
    tr = read_trace(trace, model)
    report = replay(tr, s.batching, s.batching.instances_per_gpu)
    if scenario_out is not None:
        fitted = scenario_from_dict(trace_scenario(tr, report, s.batching,
                                                   s.batching.instances_per_gpu), base_dir=None)
        scenario_out.write_text(scenario_to_toml(fitted))
        report["scenario_out"] = str(scenario_out)
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        return
    _print_replay(report)


def _print_replay(report: dict[str, Any]) -> None:
    t = Table(title=f"servelab replay-trace: {report['model'] or 'the model'}, "
                    f"{report['requests']:,} requests over {report['span_s']:.1f} s "
                    f"({report['offered_per_s']:.0f}/s)", title_justify="left")
    cols = [("mean_batch", "mean batch", "{:.2f}"), ("queue_mean_ms", "queue ms", "{:.3f}"),
            ("queue_p50_ms", "p50", "{:.3f}"), ("queue_p90_ms", "p90", "{:.3f}"),
            ("queue_p99_ms", "p99", "{:.3f}"),
            ("left_behind_share", "left older behind", "{:.0%}")]
    t.add_column("")
    for _, label, _ in cols:
        t.add_column(label, justify="right")
    m = report["measured"]
    t.add_row("Triton", *[fmt.format(m[k]) for k, _, fmt in cols])
    for rule, got in report["rules"].items():
        cells = []
        for k, _, fmt in cols:
            err = got["error"].get(k)
            cells.append(fmt.format(got[k]) + ("" if err is None or k == "left_behind_share"
                                               else f" {err:+.0%}"))
        t.add_row(f"{rule} rule", *cells)
    stdout.print(t)
    stdout.print("compute ms by batch size (the trace's means): "
                 + ", ".join(f"{k}: {v:.2f}" for k, v in report["exec_ms_by_size"].items()),
                 highlight=False)
    stdout.print("turnaround ms after a batch of each size (its end to the next start, the "
                 "next payload waiting; given to the simulator with the compute): "
                 + ", ".join(f"{k}: {v:.3f}"
                             for k, v in report["turnaround_ms_by_size"].items()),
                 highlight=False)
    stdout.print(f"the batcher thread won {report['batcher_first']:.1%} of the races at a "
                 f"completion ({report['races_judged']:,} judged in the trace; 0 is the "
                 "source's order, and the share grows with how busy the CPUs are): set "
                 f"[batching] batcher_first = {report['batcher_first']:g} to simulate this "
                 "server", highlight=False, markup=False)
    sp = report["spread"]
    stdout.print(f"per-batch spread: cv {sp['cv']:.2f}, slowest batch {sp['max']:.1f}x its "
                 f"size's mean ({sp['batches']:,} batches)", highlight=False)
    for note in report["notes"]:
        stdout.print(f"note: {note}", highlight=False, markup=False)
    if "scenario_out" in report:
        stdout.print(f"wrote {report['scenario_out']}: servelab simulate --scenario "
                     f"{report['scenario_out']}", highlight=False)
    if report["skipped"]:
        stdout.print(f"note: {report['skipped']} traced requests lacked a queue or compute "
                     "timestamp (rejected or cancelled) and are not replayed", highlight=False)
