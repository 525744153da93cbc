"""`servelab llm load`: flags in vLLM's spelling, one call, the report rendered."""

from __future__ import annotations

import asyncio
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from servelab.errors import invalid
from servelab.files import prepare_out_dir

stdout = Console()
stderr = Console(stderr=True)
MAX_STEPS = 50


def parse_request_rates(text: str) -> list[float]:
    """`4`, `1,2,inf` (inf: all at once), or START:STOP:STEPS."""
    from servelab.measure.cli import parse_rates

    items = [x.strip().lower() for x in text.split(",") if x.strip()]
    try:
        if ":" in text or "inf" not in items:
            return parse_rates(text)
        finite = [x for x in items if x != "inf"]
        rates = parse_rates(",".join(finite)) if finite else []
    except ValueError as exc:
        raise invalid("--request-rate", text, "requests/s: 4, a list 1,2,inf, START:STOP:STEPS",
                      "e.g. --request-rate 2,4,8") from exc
    it = iter(rates)
    return [math.inf if x == "inf" else next(it) for x in items]


def _schedule(path: Path) -> tuple[float, ...]:
    from servelab.batching.arrivals import load_trace

    trace_s = load_trace(path, "--trace") / 1e9
    return tuple(float(x) for x in trace_s)


def load(
    url: Annotated[str, typer.Option(help="The server's base URL, e.g. http://127.0.0.1:8080.")
                   ] = "http://127.0.0.1:8000",
    endpoint: Annotated[str, typer.Option(
        help="/v1/completions or /v1/chat/completions.")] = "/v1/completions",
    model: Annotated[str, typer.Option(
        help="Model name to send (default: the first /v1/models lists).")] = "",
    request_rate: Annotated[str, typer.Option(
        help="Requests/s: 4, a list 1,2,4 (one step each), START:STOP:STEPS, or inf (all at "
             "once, vLLM's default).")] = "inf",
    burstiness: Annotated[float, typer.Option(
        help="Gamma shape of the gaps: 1 is Poisson, below 1 burstier, as vLLM's.")] = 1.0,
    max_concurrency: Annotated[int, typer.Option(
        help="At most this many requests out at once (0: no limit); with --request-rate inf "
             "a closed loop.")] = 0,
    trace: Annotated[Path | None, typer.Option(
        help="Send at recorded times instead: a CSV of arrival times (arrival_s, arrival_ms, "
             "arrival_us or timestamp).")] = None,
    num_prompts: Annotated[int, typer.Option(help="Requests per step.")] = 200,
    dataset_name: Annotated[str, typer.Option(help="random, sharegpt or jsonl.")] = "random",
    dataset_path: Annotated[Path | None, typer.Option(
        help="The sharegpt JSON or jsonl file.")] = None,
    random_input_len: Annotated[int, typer.Option(help="Prompt tokens (random).")] = 1024,
    random_output_len: Annotated[int, typer.Option(help="Output tokens (random).")] = 128,
    random_range_ratio: Annotated[float, typer.Option(
        help="Lengths uniform within ±this share (random).")] = 0.0,
    random_prefix_len: Annotated[int, typer.Option(
        help="Tokens of prefix every prompt shares (random).")] = 0,
    sharegpt_output_len: Annotated[int | None, typer.Option(
        help="Output tokens for every ShareGPT request, instead of its reply's length.")
                                   ] = None,
    ignore_eos: Annotated[bool, typer.Option(
        help="Ask the server to generate every requested token.")] = True,
    goodput: Annotated[list[str] | None, typer.Option(
        help="SLOs for goodput, e.g. --goodput ttft:500 --goodput tpot:50 (ms).")] = None,
    metric_percentiles: Annotated[str, typer.Option(help="Percentiles to report.")] = "90,99",
    request_timeout: Annotated[float, typer.Option(help="Seconds a request may take.")
                               ] = 600.0,
    seed: Annotated[int, typer.Option(help="Seed for arrivals and prompts.")] = 0,
    out: Annotated[Path | None, typer.Option(
        help="Folder for result.json and one vLLM-format JSON per step.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON to stdout.")] = False,
) -> None:
    """Measure an OpenAI-compatible streaming server (vLLM, SGLang, llama.cpp, ...) as
    `vllm bench serve` does, from intended send times, tokens from `usage`."""
    from servelab.measure.cli import progress_bar
    from servelab.measure.llm_load import Endpoint, LoadPlan, run_load
    from servelab.measure.llm_metrics import parse_goodput, parse_percentiles

    ep = Endpoint.parse(url, endpoint, model)
    if not 0 < request_timeout <= 86_400:
        raise invalid("--request-timeout", request_timeout, "0 to 86,400 s",
                      "e.g. --request-timeout 600")
    rates = [math.inf] if trace is not None else parse_request_rates(request_rate)
    if len(rates) > MAX_STEPS:
        raise invalid("--request-rate", request_rate, f"at most {MAX_STEPS} steps", "fewer")
    schedule = _schedule(trace) if trace is not None else None
    plans = [LoadPlan(r, burstiness, max_concurrency, schedule) for r in rates]
    for plan in plans:
        plan.check_span(num_prompts)
    make = _workload(dataset_name, dataset_path, num_prompts, random_input_len,
                     random_output_len, random_range_ratio, random_prefix_len,
                     sharegpt_output_len, seed, len(plans))
    pcts, slo = parse_percentiles(metric_percentiles), parse_goodput(goodput or [])
    if out is not None:
        prepare_out_dir(out, "--out")
    with progress_bar(num_prompts * len(plans)) as counter:
        report = asyncio.run(run_load(
            ep, make, plans, dataset=dataset_name, seed=seed, timeout_s=request_timeout,
            ignore_eos=ignore_eos, percentiles=pcts, goodput_ms=slo, counter=counter,
            on_step=None if as_json else _print_step))
    if out is not None:
        _write(out, report)
    if as_json:
        print(json.dumps(report.to_dict(), allow_nan=False, default=str))


def _workload(name: str, path: Path | None, n: int, in_len: int, out_len: int, ratio: float,
              prefix: int, sharegpt_out: int | None, seed: int, steps: int) -> Any:
    """The requests each step sends, as a function of the server's tokens per word and the
    step; settings and files are checked now, before the server is touched."""
    from servelab.measure import llm_workload as w

    if name == "random":
        if path is not None:
            raise invalid("--dataset-path", str(path), "no file with --dataset-name random",
                          "drop --dataset-path or use --dataset-name sharegpt/jsonl")
        w.check_random(n, input_len=in_len, output_len=out_len, range_ratio=ratio,
                       prefix_len=prefix, seed=seed, first_index=n * (steps - 1))
        return lambda tpw, step: w.random_requests(
            n, input_len=in_len, output_len=out_len, range_ratio=ratio, prefix_len=prefix,
            tokens_per_word=tpw, seed=seed, first_index=n * step)
    if name not in ("sharegpt", "jsonl"):
        raise invalid("--dataset-name", name, "random, sharegpt or jsonl",
                      "use --dataset-name random")
    if path is None:
        raise invalid("--dataset-path", None, f"a file with --dataset-name {name}",
                      "give --dataset-path FILE")
    if sharegpt_out is not None and not 1 <= sharegpt_out <= w.MAX_OUTPUT_TOKENS:
        raise invalid("--sharegpt-output-len", sharegpt_out, f"1 to {w.MAX_OUTPUT_TOKENS:,}",
                      "e.g. --sharegpt-output-len 256")
    read = (w.sharegpt_requests(path, n, output_len=sharegpt_out, seed=seed)
            if name == "sharegpt" else w.jsonl_requests(path, n))
    return lambda tpw, step: read  # read once; the server counts the prompt tokens itself


def _print_step(step: Any) -> None:
    m = step.metrics
    t = Table(title=f"{step.plan.label()}: {m.completed} of {step.num_prompts} completed "
                    f"in {m.duration_s:.2f} s", title_justify="left")
    t.add_column("metric")
    for col in ("mean", "median", *[f"p{p:g}" for p, _ in m.ttft.percentiles]):
        t.add_column(col, justify="right")
    for name in ("ttft", "tpot", "itl", "e2el"):
        d = getattr(m, name)
        t.add_row(f"{name.upper()} (ms)", f"{d.mean:.2f}", f"{d.median:.2f}",
                  *[f"{v:.2f}" for _, v in d.percentiles])
    stdout.print(t)
    line = (f"requests/s {m.request_throughput:.2f}, output tokens/s "
            f"{m.output_throughput:.1f}, total tokens/s {m.total_token_throughput:.1f}")
    if m.request_goodput is not None:
        line += f", goodput {m.request_goodput:.2f} requests/s"
    stdout.print(line, highlight=False)
    stdout.print(f"client sent late: p50 {m.send_late_p50_ms:.2f} ms, p99 "
                 f"{m.send_late_p99_ms:.2f} ms" + (
                     " — the client, not the server, limited this step" if step.client_limited
                     else ""), highlight=False)
    if m.cached_prompt_tokens is not None:
        stdout.print(f"prompt tokens served from the server's cache: {m.cached_prompt_tokens:,} "
                     f"of {m.total_input_tokens:,}", highlight=False)
    if m.errors_by_reason:
        stdout.print(f"failed: {m.errors_by_reason}", highlight=False)
    if step.server_counters:
        shown = {k: round(v, 3) for k, v in sorted(step.server_counters.items())
                 if k.endswith(("_total", "_sum", "_count")) and v}
        stdout.print(f"server counters over the step: {shown}", highlight=False)


def _write(out: Path, report: Any) -> None:
    """result.json (the whole run) and step-K.json in `vllm bench serve --save-result`'s
    shape, with its per-request lists, so scripts that read vLLM's files read these."""
    whole = report.to_dict()
    (out / "result.json").write_text(json.dumps(whole, indent=1, default=str))
    date = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    for k, (step, rec) in enumerate(zip(report.steps, report.records, strict=True)):
        d = {"date": date, "endpoint_type": whole["endpoint_type"],
             "label": None, "model_id": report.endpoint.model, "tokenizer_id": None,
             **step.to_dict(),
             "input_lens": [int(x) for x in rec.prompt_tokens],
             "output_lens": [max(int(x), 0) if not e else 0
                             for x, e in zip(rec.output_tokens, rec.errors, strict=True)],
             "ttfts": [float((c[0] - i) / 1e9) if c.size and not e else 0.0
                       for c, i, e in zip(rec.chunk_ns, rec.intended_ns, rec.errors,
                                          strict=True)],
             "itls": [[float(x) / 1e9 for x in (c[1:] - c[:-1])] for c in rec.chunk_ns],
             "errors": list(rec.errors)}
        (out / f"step-{k}.json").write_text(json.dumps(d, default=str))


def validate(
    url: Annotated[str, typer.Option(help="The server's base URL, e.g. http://127.0.0.1:8080.")
                   ] = "http://127.0.0.1:8000",
    endpoint: Annotated[str, typer.Option(
        help="/v1/completions or /v1/chat/completions.")] = "/v1/completions",
    model: Annotated[str, typer.Option(help="Model name (default: /v1/models' first).")] = "",
    rule: Annotated[str, typer.Option(
        help="The server's scheduling rule: llama.cpp or vllm-v1.")] = "llama.cpp",
    max_num_seqs: Annotated[int | None, typer.Option(
        help="Sequences at once (llama.cpp: slots; default from /props).")] = None,
    context_per_seq: Annotated[int | None, typer.Option(
        help="KV tokens per sequence (llama.cpp: n_ctx / slots; default from /props).")
                               ] = None,
    max_num_batched_tokens: Annotated[int | None, typer.Option(
        help="Tokens per step (llama.cpp: -b, default 2048).")] = None,
    random_input_len: Annotated[int, typer.Option(help="Prompt tokens of the load.")] = 256,
    random_output_len: Annotated[int, typer.Option(help="Output tokens of the load.")] = 64,
    num_prompts: Annotated[int, typer.Option(help="Requests per load step.")] = 60,
    shares: Annotated[str, typer.Option(help="Load steps as shares of saturation.")
                      ] = "0.3,0.6,0.85",
    seed: Annotated[int, typer.Option(help="Seed for arrivals and prompts.")] = 0,
    reprofile: Annotated[bool, typer.Option(
        "--reprofile/--no-reprofile",
        help="Profile the server again before each load step but the first (the first "
             "profile runs just before it) and once after the last, and predict each step "
             "from the profiles just before and after it, the first "
             "profile's figures beside (a server's speed can move for minutes at a time); "
             "--no-reprofile predicts every step from the first profile (20-30 s a step "
             "faster against the test's llama-server).")] = True,
    out: Annotated[Path | None, typer.Option(
        help="Folder for validation.json, validation.html (opens offline), each run's raw "
             "records (records-saturation.json, records-step-K.json), steps.csv (the "
             "profile) and scenario.toml (the fit, which `llm simulate --scenario` runs).")
                               ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON to stdout.")] = False,
) -> None:
    """Profile an LLM server, fit the simulator's step model and the server's scheduling
    rule, load it at shares of its saturation and print the prediction beside the
    measurement."""
    from servelab.llm.rules import SchedulingRule
    from servelab.measure.llm_load import Endpoint
    from servelab.measure.llm_validate import run_validation
    from servelab.measure.llm_workload import check_random

    ep = Endpoint.parse(url, endpoint, model)
    try:
        share_list = tuple(float(x) for x in shares.split(",") if x.strip())
    except ValueError:
        raise invalid("--shares", shares, "comma-separated shares of saturation",
                      "e.g. --shares 0.3,0.6,0.85") from None
    check_random(num_prompts, input_len=random_input_len, output_len=random_output_len,
                 seed=seed)
    for name, v in (("--max-num-seqs", max_num_seqs), ("--context-per-seq", context_per_seq),
                    ("--max-num-batched-tokens", max_num_batched_tokens)):
        if v is not None and not 1 <= v <= 10_000_000:
            raise invalid(name, v, "1 to 10,000,000", f"check {name}")
    if out is not None:
        prepare_out_dir(out, "--out")
    report = asyncio.run(run_validation(
        ep, rule=SchedulingRule.parse(rule), slots=max_num_seqs, ctx_per_slot=context_per_seq,
        n_batch=max_num_batched_tokens, input_len=random_input_len,
        output_len=random_output_len, num_prompts=num_prompts, shares=share_list, seed=seed,
        reprofile=reprofile,
        say=(lambda s: None) if as_json else (lambda s: stderr.print(s, highlight=False))))
    if out is not None:
        (out / "validation.json").write_text(json.dumps(report.to_dict(), indent=1))
        (out / "steps.csv").write_text(report.profile.csv())
        (out / "scenario.toml").write_text(report.fitted_scenario())
        for k, rec in enumerate(report.records):  # saturation, then each load step
            name = "saturation" if k == 0 else f"step-{k - 1}"
            (out / f"records-{name}.json").write_text(json.dumps(rec.to_dict()))
        from servelab.measure.llm_validate import write_html

        write_html(report, out / "validation.html")
    if as_json:
        print(json.dumps(report.to_dict(), allow_nan=False))
        return
    _print_validation(report)


def _print_validation(report: Any) -> None:
    from servelab.measure.llm_validate import SPEED_NOTE_PCT, SPEED_WINDOW_S

    t = Table(title=f"{report.model} at {report.endpoint}: predicted vs measured",
              title_justify="left")
    t.add_column("figure")
    for r in report.rates:
        t.add_column(f"{r.share_of_saturation:.0%} ({r.offered_per_s:.2f}/s)", justify="right")
    for k, f in enumerate(report.rates[0].figures if report.rates else ()):
        cells = []
        for r in report.rates:
            g = r.figures[k]
            mark = "" if g.ok else " ✗"
            cells.append(f"{g.predicted:.1f} / {g.measured:.1f} ({g.error_pct:+.1f}%){mark}")
        t.add_row(f.name, *cells)
    stdout.print(t)
    s = report.saturation
    stdout.print(f"saturation: predicted {s.predicted:.2f} / measured {s.measured:.2f} req/s "
                 f"({s.error_pct:+.1f}%)", highlight=False)
    spreads = [f"{r.share_of_saturation:.0%} {r.speed_spread_pct:+.0f}%" for r in report.rates
               if r.speed_spread_pct is not None]
    if spreads:  # the machine's own speed through each step: a lone stream's step
        stdout.print("server speed moved within each step (a lone stream's step, "
                     f"{SPEED_WINDOW_S:.0f} s windows; above {SPEED_NOTE_PCT:.0f}% the "
                     f"figures are the machine's as much as the model's): "
                     + ", ".join(spreads), highlight=False)
    for n in report.notes:
        stdout.print(n, highlight=False)
    for r in report.rates:
        for n in r.notes:
            stdout.print(f"{r.share_of_saturation:.0%}: {n}", highlight=False)
    stdout.print(f"verdict: {report.verdict}", highlight=False)
