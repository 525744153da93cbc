"""The `servelab` command: one thin command per verb over the Python API.

One error boundary: a ServelabError becomes one line on stderr and exit code 1.
`--json` prints only JSON to stdout; progress goes to stderr.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import math
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, NoReturn

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from servelab.api import load, run_plan, run_simulate, run_sweep
from servelab.errors import InputError, ServelabError, StoreError, cut, invalid
from servelab.files import check_writable_target
from servelab.flags import option
from servelab.llm.from_scenario import llm_workload, serving_options, simulate_llm
from servelab.llm.pool import kv_report, pool_spec, run_paging
from servelab.render import kv_tables, paging_table, print_to, report_tables, seed_table
from servelab.scenario import LlmPool, Scenario, flag_keys, sweep_names
from servelab.seed import seed_comparison, seed_rows_dict

app = typer.Typer(
    help="servelab: plan, simulate and measure ML and LLM inference serving.",
    epilog="Docs, one page per part, in the source tree's docs/: scenario.md (every "
           "scenario field), simulator.md, llm.md, llm-measure.md (llm load, llm validate), "
           "gateway.md, load-and-validate.md, features.md, drift.md, lab.md, safety.md, "
           "performance.md.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

stdout = Console()
stderr = Console(stderr=True)

ScenarioOpt = Annotated[str, typer.Option("--scenario", "-s",
                                          help="A scenario TOML file, or 'seed'.")]

QpsOpt = Annotated[float | None, option("workload.qps")]
DelayOpt = Annotated[int | None, option("batching.max_queue_delay_microseconds")]
MbsOpt = Annotated[int | None, option("batching.max_batch_size")]
PrefOpt = Annotated[list[int] | None, option("batching.preferred_batch_size")]
QueueOpt = Annotated[int | None, option("batching.max_queue_size")]
TimeoutOpt = Annotated[int | None, option("batching.default_timeout_microseconds")]
InstOpt = Annotated[int | None, option("batching.instances_per_gpu")]
GpuOpt = Annotated[str | None, option("hardware.gpu")]
NGpuOpt = Annotated[int | None, option("hardware.num_gpus")]
PriceOpt = Annotated[float | None, option("hardware.price_per_gpu_hour")]
NReqOpt = Annotated[int | None, option("workload.num_requests")]
SeedOpt = Annotated[int | None, option("workload.seed")]
SloOpt = Annotated[float | None, option("latency.p99_slo_ms")]
FeWorkersOpt = Annotated[int | None, option("latency.frontend_workers")]
FeCpuOpt = Annotated[float | None, option("latency.frontend_cpu_ms")]
FeLoopOpt = Annotated[bool | None, option("latency.frontend_event_loop")]
FeTurnOpt = Annotated[float | None, option("latency.frontend_turn_ms")]
FeAnswerOpt = Annotated[float | None, option("latency.frontend_answer_ms")]
StallsOpt = Annotated[float | None, option("latency.stalls_per_s")]
StallMsOpt = Annotated[float | None, option("latency.stall_ms")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print only JSON to stdout.")]


# Each common flag's parameter name -> the scenario key it overrides.
_FLAG_KEYS = flag_keys("workload", "batching", "hardware", "latency")


def _load(params: dict[str, Any], keys: dict[str, str] = _FLAG_KEYS) -> Scenario:
    """The command's scenario with its flags applied (an unset flag is None).

    An error in a flag's value names the flag as typed and the scenario key it sets.
    """
    given = {key: params[name] for name, key in keys.items() if name in params}
    if "batching.preferred_batch_size" in given and not given["batching.preferred_batch_size"]:
        given["batching.preferred_batch_size"] = None  # Typer gives [] for "not given"
    if given.get("llm.num_gpus") is not None and given.get("llm.tp") is None:
        given["llm.tp"] = 0  # --num-gpus alone: one tensor-parallel group over all of them
    if given.get("llm.model") is not None:  # the scenario's dtypes belong to its own model
        for key in ("llm.weight_dtype", "llm.kv_dtype"):
            if key in given and given[key] is None:
                given[key] = "auto"
    if given.get("llm.tp") and given.get("llm.num_gpus") is None:
        # --tp alone (vLLM's -tp): one group of tp, times --pp stages where given
        given["llm.num_gpus"] = given["llm.tp"] * (given.get("llm.pp") or 1)
    try:
        return load(params["scenario"], given)
    except InputError as exc:
        # a flag's value: the message names the flag as typed and the key it sets
        for name, key in keys.items():
            if exc.key == key and given.get(key) is not None:
                flag = "--" + name.replace("_", "-")
                raise InputError(f"{flag} ({exc.field}){exc.detail}", field=flag,
                                 detail=exc.detail) from None
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
    slo_ms: SloOpt = None, frontend_workers: FeWorkersOpt = None,
    frontend_cpu_ms: FeCpuOpt = None, frontend_event_loop: FeLoopOpt = None,
    frontend_turn_ms: FeTurnOpt = None, frontend_answer_ms: FeAnswerOpt = None,
    stalls_per_s: StallsOpt = None, stall_ms: StallMsOpt = None, as_json: JsonOpt = False,
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
    slo_ms: SloOpt = None, frontend_workers: FeWorkersOpt = None,
    frontend_cpu_ms: FeCpuOpt = None, frontend_event_loop: FeLoopOpt = None,
    frontend_turn_ms: FeTurnOpt = None, frontend_answer_ms: FeAnswerOpt = None,
    stalls_per_s: StallsOpt = None, stall_ms: StallMsOpt = None, as_json: JsonOpt = False,
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
    param: Annotated[str, typer.Argument(
        help=f"One of: {', '.join(sweep_names())}; or any of those as section.key.")],
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
    slo_ms: SloOpt = None, frontend_workers: FeWorkersOpt = None,
    frontend_cpu_ms: FeCpuOpt = None, frontend_event_loop: FeLoopOpt = None,
    frontend_turn_ms: FeTurnOpt = None, frontend_answer_ms: FeAnswerOpt = None,
    stalls_per_s: StallsOpt = None, stall_ms: StallMsOpt = None, as_json: JsonOpt = False,
) -> None:
    """Vary one parameter over a range: a table (and a CSV) of the key figures."""
    s = _load(locals())
    grid = _grid(start, stop, steps, values)
    if csv_path is not None:
        check_writable_target(csv_path, "--csv")
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


kv_app = typer.Typer(help="LLM KV cache: sizing, pool capacity, paged vs contiguous.",
                     invoke_without_command=True, no_args_is_help=False)
app.add_typer(kv_app, name="kv")

from servelab.drift_cli import drift as drift_command  # noqa: E402
from servelab.features.cli import app as features_app  # noqa: E402
from servelab.gateway.cli import serve as serve_command  # noqa: E402
from servelab.measure.cli import load as load_command  # noqa: E402
from servelab.measure.cli import replay_trace as replay_trace_command  # noqa: E402
from servelab.measure.cli import validate as validate_command  # noqa: E402

app.add_typer(features_app, name="features")
app.command("serve")(serve_command)
app.command("load")(load_command)
app.command("validate")(validate_command)
app.command("replay-trace")(replay_trace_command)
app.command("drift")(drift_command)

ModelOpt = Annotated[str | None, option("llm.model")]
KvDtypeOpt = Annotated[str | None, option("llm.kv_dtype")]
WDtypeOpt = Annotated[str | None, option("llm.weight_dtype")]
CtxOpt = Annotated[int | None, option("llm.context_tokens")]
TpOpt = Annotated[int | None, option("llm.tp")]
UtilOpt = Annotated[float | None, option("llm.gpu_memory_utilization")]
BlockOpt = Annotated[int | None, option("llm.block_size")]
KvGpuOpt = Annotated[str | None, option("llm.gpu")]
KvNGpuOpt = Annotated[int | None, option("llm.num_gpus")]

# The llm commands' flags -> [llm] keys; kv's are the pool's alone (its --lengths is a
# replay's, not [llm] lengths_csv).
_LLM_KEYS = flag_keys("llm")
_KV_KEYS = {name: _LLM_KEYS[name] for name in (
    "model", "kv_dtype", "weight_dtype", "context", "tp", "pp", "gpu", "num_gpus",
    "gpu_memory_utilization", "block_size")}


@kv_app.callback()
def kv(
    ctx: typer.Context, scenario: ScenarioOpt = "seed", model: ModelOpt = None,
    kv_dtype: KvDtypeOpt = None, weight_dtype: WDtypeOpt = None, context: CtxOpt = None,
    gpu: KvGpuOpt = None, num_gpus: KvNGpuOpt = None, tp: TpOpt = None, pp: PpOpt = None,
    gpu_memory_utilization: UtilOpt = None, block_size: BlockOpt = None,
    sessions: Annotated[int | None, typer.Option(
        help="Also answer: the longest context at which this many sessions fit.")] = None,
    memory_gib: Annotated[float | None, typer.Option(
        help="Per-GPU memory as the runtime reports it (GiB).")] = None,
    weights_gib: Annotated[float | None, typer.Option(help="Weights, whole model (GiB).")
                           ] = None,
    activation_gib: Annotated[float | None, typer.Option(
        help="Activation peak per GPU (GiB); default: estimated.")] = None,
    non_torch_gib: Annotated[float | None, typer.Option(
        help="Non-torch memory per GPU (GiB); default 0.5, or 2.0 under tp.")] = None,
    cudagraph_gib: Annotated[float, typer.Option(help="CUDA-graph reserve per GPU (GiB).")
                             ] = 0.0,
    as_json: JsonOpt = False,
) -> None:
    """KV bytes per token and session, the pool vLLM would allocate, max sessions."""
    if ctx.invoked_subcommand is not None:
        return
    s = _load(locals(), _KV_KEYS)
    if sessions is not None and not 1 <= sessions <= 100_000_000:
        raise invalid("--sessions", sessions, "a whole number from 1 to 100,000,000",
                      "use e.g. --sessions 32, or leave it out")
    report = kv_report(pool_spec(s, memory_runtime_gib=memory_gib, weights_gib=weights_gib,
                                 activation_gib=activation_gib, non_torch_gib=non_torch_gib,
                                 cudagraph_gib=cudagraph_gib), sessions)
    if as_json:
        _emit_json(report.to_dict())
    else:
        print_to(stdout, kv_tables(report))


llm_app = typer.Typer(help="LLM serving under vLLM's scheduler: TTFT, TPOT, tokens/s, $.",
                      no_args_is_help=True)
app.add_typer(llm_app, name="llm")
from servelab.measure.llm_cli import load as llm_load_command  # noqa: E402
from servelab.measure.llm_cli import validate as llm_validate_command  # noqa: E402

llm_app.command("load")(llm_load_command)
llm_app.command("validate")(llm_validate_command)
RateOpt = Annotated[float | None, option("llm.request_rate")]
LlmNReqOpt = Annotated[int | None, option("llm.num_requests")]
PromptOpt = Annotated[float | None, option("llm.prompt_tokens")]
PromptP99Opt = Annotated[float | None, option("llm.prompt_tokens_p99")]
OutputOpt = Annotated[float | None, option("llm.output_tokens")]
OutputP99Opt = Annotated[float | None, option("llm.output_tokens_p99")]
BurstOpt = Annotated[float | None, option("llm.burstiness")]
StepProfileOpt = Annotated[Path | None, option("llm.step_profile_csv")]
LengthsOpt = Annotated[Path | None, option("llm.lengths_csv")]


def _llm_spec(params: dict[str, Any]) -> tuple[Scenario, LlmPool, Any]:
    """The scenario with an `llm` command's flags applied (--tp is one replica's GPUs), and
    one replica's vLLM deployment."""
    if not 0 <= params["seed"] <= 2**63 - 1:
        raise invalid("--seed", params["seed"], "a whole number >= 0", "e.g. --seed 0")
    # files named by flags are where the user is, not beside the scenario file
    files = {name: None if params.get(name) is None else str(Path(params[name]).absolute())
             for name in ("step_profile", "lengths")}
    tp, pp = params["tp"], params.get("pp")
    s = _load({**params, "num_gpus": tp * (pp or 1) if tp else None, "context": None,
               **files}, _LLM_KEYS)
    llm = s.llm if s.llm is not None else LlmPool()  # a scenario without [llm]: defaults
    if pp and not tp:  # --pp alone: the scenario's tensor-parallel group, pp stages of it
        group = llm.tp or llm.num_gpus
        s = s.with_overrides({"llm.tp": group, "llm.num_gpus": group * pp})
        llm = s.llm or llm
    s = replace(s, llm=llm)
    return s, llm, pool_spec(s)


SchedulerOpt = Annotated[str | None, option("llm.scheduler")]
CompEffOpt = Annotated[float | None, option("llm.compute_efficiency")]
RampOpt = Annotated[float | None, option("llm.compute_ramp_tokens")]
MemEffOpt = Annotated[float | None, option("llm.memory_efficiency")]
KvEffOpt = Annotated[float | None, option("llm.kv_memory_efficiency")]
OverheadOpt = Annotated[float | None, option("llm.overhead_ms")]
PfOverheadOpt = Annotated[float | None, option("llm.prefill_first_overhead_ms")]
PerSeqOpt = Annotated[float | None, option("llm.per_seq_ms")]
OverlapOpt = Annotated[float | None, option("llm.overlap")]
ArLatOpt = Annotated[float | None, option("llm.allreduce_latency_us")]
NcclLatOpt = Annotated[float | None, option("llm.nccl_allreduce_latency_us")]
FrontOpt = Annotated[float | None, option("llm.frontend_ms")]
IntakeOpt = Annotated[float | None, option("llm.intake_ms")]
IntakeTokOpt = Annotated[float | None, option("llm.intake_per_token_us")]
ReplicaTpOpt = Annotated[int | None, option("llm.tp", help="GPUs per replica "
                                                     "(tensor-parallel size).")]
ReplicasOpt = Annotated[int | None, option("llm.replicas")]
MaxSeqsOpt = Annotated[int | None, option("llm.max_num_seqs")]
MaxTokensOpt = Annotated[int | None, option("llm.max_num_batched_tokens")]
ArrivalOpt = Annotated[str | None, option("llm.arrival")]
ConcurrencyOpt = Annotated[int | None, option("llm.max_concurrency")]
ChunkedOpt = Annotated[bool | None, option("llm.enable_chunked_prefill")]
PrefixCachingOpt = Annotated[bool | None, option("llm.enable_prefix_caching")]
PrefixTokensOpt = Annotated[int | None, option("llm.prefix_tokens")]
PrefixShareOpt = Annotated[float | None, option("llm.prefix_hit_share")]
BlocksOverrideOpt = Annotated[int | None, option("llm.num_gpu_blocks_override")]
MaxModelLenOpt = Annotated[int | None, option("llm.max_model_len")]
SchedStepsOpt = Annotated[int | None, option("llm.num_scheduler_steps")]
PpOpt = Annotated[int | None, option("llm.pp")]
PpHopOpt = Annotated[float | None, option("llm.pp_hop_ms")]
LlmSeedOpt = Annotated[int, typer.Option(help="Seed for arrivals and lengths.")]
SaveResultOpt = Annotated[Path | None, typer.Option(
    "--save-result", help="Also write the run as `vllm bench serve --save-result` "
    "does (per-request lengths included), which `llm fit` reads.")]
GoodputOpt = Annotated[list[str] | None, typer.Option(
    help="SLOs for goodput as vLLM's bench takes them, e.g. --goodput ttft:500 "
         "--goodput tpot:50 (ms; ttft, tpot, e2el).")]


@llm_app.command("simulate")
def llm_simulate(
    scenario: ScenarioOpt = "seed", model: ModelOpt = None, kv_dtype: KvDtypeOpt = None,
    weight_dtype: WDtypeOpt = None, gpu: KvGpuOpt = None, tp: ReplicaTpOpt = None,
    pp: PpOpt = None, replicas: ReplicasOpt = None, gpu_memory_utilization: UtilOpt = None,
    block_size: BlockOpt = None, max_num_seqs: MaxSeqsOpt = None,
    max_num_batched_tokens: MaxTokensOpt = None, rate: RateOpt = None,
    num_requests: LlmNReqOpt = None, arrival: ArrivalOpt = None,
    max_concurrency: ConcurrencyOpt = None, burstiness: BurstOpt = None,
    prompt_tokens: PromptOpt = None, prompt_tokens_p99: PromptP99Opt = None,
    output_tokens: OutputOpt = None, output_tokens_p99: OutputP99Opt = None,
    lengths: LengthsOpt = None, chunked_prefill: ChunkedOpt = None,
    prefix_caching: PrefixCachingOpt = None, prefix_tokens: PrefixTokensOpt = None,
    prefix_hit_share: PrefixShareOpt = None, scheduler: SchedulerOpt = None,
    compute_efficiency: CompEffOpt = None, compute_ramp_tokens: RampOpt = None,
    memory_efficiency: MemEffOpt = None,
    kv_memory_efficiency: KvEffOpt = None, overhead_ms: OverheadOpt = None,
    prefill_first_overhead_ms: PfOverheadOpt = None,
    per_seq_ms: PerSeqOpt = None, overlap: OverlapOpt = None,
    allreduce_latency_us: ArLatOpt = None,
    nccl_allreduce_latency_us: NcclLatOpt = None, pp_hop_ms: PpHopOpt = None,
    frontend_ms: FrontOpt = None, intake_ms: IntakeOpt = None,
    intake_per_token_us: IntakeTokOpt = None,
    step_profile: StepProfileOpt = None, num_gpu_blocks_override: BlocksOverrideOpt = None,
    max_model_len: MaxModelLenOpt = None, num_scheduler_steps: SchedStepsOpt = None,
    seed: LlmSeedOpt = 0, save_result: SaveResultOpt = None, goodput: GoodputOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Continuous batching under vLLM v1's scheduler: TTFT, TPOT, end-to-end latency,
    tokens per second, preemptions and $ per 1M tokens (roofline or measured step times)."""
    from servelab.llm.fit import vllm_result, write_json
    from servelab.llm.serving import request_goodput
    from servelab.measure.llm_metrics import parse_goodput

    slo = parse_goodput(goodput or [])
    s, llm, _ = _llm_spec(dict(locals()))
    workload = llm_workload(s, llm, seed)
    report = simulate_llm(s, workload=workload)
    d = report.to_dict()
    if slo:
        d["request_goodput"] = request_goodput(report.per_request, slo)
    if save_result is not None:
        write_json(save_result, {**vllm_result(report, workload),
                                 **({"request_goodput": d["request_goodput"]} if slo else {})})
    if as_json:
        _emit_json(d)
    else:
        _print_llm_report(d, slo)


def _print_llm_report(d: dict[str, Any], slo: dict[str, float]) -> None:
    t = Table(title=f"{d['model']} on {d['replicas']} x {d['tp']}"
                    + (f" x {d['pp']} stages" if d.get("pp", 1) > 1 else "")
                    + f" {d['gpu']} "
                    f"({d['num_blocks_per_replica']:,} KV blocks a replica)",
              title_justify="left")
    for c in ("", "p50", "p90", "p99", "mean"):
        t.add_column(c, justify="right")
    for label, key in (("TTFT ms", "ttft_ms"), ("TPOT ms", "tpot_ms"), ("end to end ms",
                                                                        "e2e_ms")):
        t.add_row(label, *[_fmt_ms(d[key][q]) for q in ("p50", "p90", "p99", "mean")])
    stdout.print(t)
    r = d["requests"]
    stdout.print(f"served {r['served']:,} of {r['arrived']:,} (rejected {r['rejected']:,}"
                 + (f", {r['too_long']:,} of them past --max-model-len" if r["too_long"] else "")
                 + ", "
                 f"preempted {r['preempted']:,}); {d['output_tokens_per_s']:,.0f} output and "
                 f"{d['input_tokens_per_s']:,.0f} input tokens/s; mean running batch "
                 f"{d['mean_running']:.1f}; GPU busy {d['gpu_busy']:.0%}", highlight=False)
    cost = d["cost_per_million_output_usd"]
    stdout.print(f"${cost:,.2f} per 1M output tokens" if cost is not None else
                 "no output tokens served", highlight=False)
    if slo:
        stdout.print(f"goodput {d['request_goodput']:.2f} requests/s meeting "
                     + ", ".join(f"{k} <= {v:g} ms" for k, v in slo.items()), highlight=False)
    for n in d["notes"]:
        stdout.print(f"note: {n}", highlight=False)


@llm_app.command("fit")
def llm_fit(
    results: Annotated[list[Path], typer.Argument(
        help="`vllm bench serve --save-result` JSON files (or `llm simulate --save-result`'s) "
             "of one deployment at several loads.")],
    scenario: ScenarioOpt = "seed", model: ModelOpt = None, kv_dtype: KvDtypeOpt = None,
    weight_dtype: WDtypeOpt = None, gpu: KvGpuOpt = None,
    tp: Annotated[int | None, option("llm.tp", help="The server's tensor-parallel size.")
                  ] = None,
    pp: Annotated[int | None, option("llm.pp", help="The server's pipeline-parallel size.")
                  ] = None,
    gpu_memory_utilization: UtilOpt = None, block_size: BlockOpt = None,
    max_num_seqs: Annotated[int | None, option("llm.max_num_seqs",
                                               help="The server's max_num_seqs.")] = None,
    max_num_batched_tokens: Annotated[int | None, option(
        "llm.max_num_batched_tokens", help="The server's max_num_batched_tokens.")] = None,
    scheduler: SchedulerOpt = None, num_scheduler_steps: SchedStepsOpt = None,
    max_evals: Annotated[int, typer.Option(help="Simulations the fit may run.")] = 300,
    out: Annotated[Path | None, typer.Option(
        help="Write the scenario with the fitted constants, for `llm simulate --scenario`.")
                   ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Fit the step model's constants to your own measured runs (the server's settings
    from the flags or the scenario); the fitted model then predicts other loads."""
    from servelab.files import write_text
    from servelab.llm.fit import MAX_RUNS, fit, predict, run_from_vllm_result
    from servelab.scenario import scenario_to_toml

    params = dict(locals())
    s, llm, spec = _llm_spec({**params, "seed": 0, "step_profile": None, "lengths": None})
    opts = serving_options(s, llm)
    if len(results) > MAX_RUNS:
        raise invalid("RESULTS", f"{len(results)} files", f"at most {MAX_RUNS} runs",
                      "fit on fewer loads")
    runs = [run_from_vllm_result(p, spec, opts["prefill_first"],
                                 num_scheduler_steps=opts["num_scheduler_steps"],
                                 sglang=opts["sglang"])
            for p in results]
    res = fit(runs, opts["step_params"], max_evals=max_evals)
    rows: list[dict[str, Any]] = [{"run": r.label, "figure": f, "measured": v, "fitted": pred[f],
             "error": pred[f] / v - 1}
            for r in runs for pred in [predict(r, res.params)] for f, v in r.measured.items()]
    fitted = {n: getattr(res.params, n) for n in res.fitted}
    if out is not None:
        write_text(out, scenario_to_toml(replace(s, llm=replace(llm, **fitted))), "--out")
    if as_json:
        _emit_json({"fitted": fitted, "rms_log_error": res.rms_log_error,
                    "evaluations": res.evaluations, "runs": rows})
        return
    t = Table(title=f"fitted to {len(runs)} run(s) in {res.evaluations} simulations "
                    f"(rms log error {res.rms_log_error:.3f})", title_justify="left")
    for c in ("run", "figure", "measured", "fitted", "error"):
        t.add_column(c, justify="left" if c in ("run", "figure") else "right")
    for r in rows:
        t.add_row(r["run"], r["figure"], f"{r['measured']:,.2f}", f"{r['fitted']:,.2f}",
                  f"{r['error']:+.1%}")
    stdout.print(t)
    stdout.print(", ".join(f"{k} = {v:.4g}" for k, v in fitted.items()), highlight=False)
    if out is not None:
        stdout.print(f"wrote {out}: `servelab llm simulate --scenario {out}` runs the fit",
                     highlight=False)


@llm_app.command("published")
def llm_published(as_json: JsonOpt = False) -> None:
    """The simulator beside published vLLM and SGLang measurements: every case the step
    model's defaults were fitted on or are held to, with its source and the error."""
    from servelab.llm.published import compare
    from servelab.llm.serving import StepParams

    rows = compare(StepParams())
    out: list[dict[str, Any]] = [{"case": r.case.id, "engine": r.case.engine, "use": r.use,
            "figure": r.figure, "measured": r.measured, "predicted": r.predicted,
            "error": r.error, "modelled": r.modelled,
            "why_not": r.case.not_modelled.get(r.figure), "source": r.case.source}
           for r in rows]
    if as_json:
        _emit_json(out)
        return
    t = Table(title="published measurements beside `llm simulate` (servelab/data/"
                    "published_llm.toml)", title_justify="left")
    for c in ("case", "engine", "use", "figure", "measured", "predicted", "error"):
        t.add_column(c, justify="right" if c in ("measured", "predicted", "error") else "left")
    for r in out:
        t.add_row(r["case"], r["engine"], r["use"], r["figure"], f"{r['measured']:,.2f}",
                  f"{r['predicted']:,.2f}",
                  f"{r['error']:+.1%}" + ("" if r["modelled"] else " (not modelled)"))
    stdout.print(t)


@llm_app.command("plan")
def llm_plan(
    scenario: ScenarioOpt = "seed", model: ModelOpt = None, kv_dtype: KvDtypeOpt = None,
    weight_dtype: WDtypeOpt = None, gpu: KvGpuOpt = None,
    tp: ReplicaTpOpt = None, pp: PpOpt = None, gpu_memory_utilization: UtilOpt = None,
    block_size: BlockOpt = None, max_num_seqs: MaxSeqsOpt = None,
    max_num_batched_tokens: MaxTokensOpt = None,
    rate: RateOpt = None, num_requests: LlmNReqOpt = None,
    prompt_tokens: PromptOpt = None, prompt_tokens_p99: PromptP99Opt = None,
    output_tokens: OutputOpt = None, output_tokens_p99: OutputP99Opt = None,
    lengths: LengthsOpt = None,
    ttft_p99_ms: Annotated[float | None, option("llm.ttft_p99_slo_ms")] = None,
    tpot_p99_ms: Annotated[float | None, option("llm.tpot_p99_slo_ms")] = None,
    max_replicas: Annotated[int, typer.Option(help="Largest replica count to try.")] = 256,
    max_model_len: MaxModelLenOpt = None, num_scheduler_steps: SchedStepsOpt = None,
    scheduler: SchedulerOpt = None,
    step_profile: StepProfileOpt = None, seed: LlmSeedOpt = 0, as_json: JsonOpt = False,
) -> None:
    """The fewest replicas meeting p99 TTFT and TPOT SLOs, and $ per 1M tokens there."""
    from servelab.llm.serving import plan_llm

    s, llm, spec = _llm_spec(dict(locals()))
    ttft_p99_ms, tpot_p99_ms = llm.ttft_p99_slo_ms, llm.tpot_p99_slo_ms
    result = plan_llm(spec, llm_workload(s, llm, seed), ttft_p99_ms=ttft_p99_ms,
                      tpot_p99_ms=tpot_p99_ms, max_replicas=max_replicas,
                      **serving_options(s, llm))
    d = result.to_dict()
    if as_json:
        _emit_json(d)
        return
    t = Table(title=f"replicas tried (SLO: TTFT p99 <= {ttft_p99_ms:g} ms, TPOT p99 <= "
                    f"{tpot_p99_ms:g} ms)", title_justify="left")
    for c in ("replicas", "TTFT p99 ms", "TPOT p99 ms", "$/1M output", "meets"):
        t.add_column(c, justify="right")
    for row in d["search"]:
        cost = row["cost_per_million_output_usd"]
        t.add_row(str(row["replicas"]), _fmt_ms(row["ttft_p99_ms"]),
                  _fmt_ms(row["tpot_p99_ms"]), "n/a" if cost is None else f"{cost:,.2f}",
                  "yes" if row["meets"] else "no")
    stdout.print(t)
    if d["replicas"] is None:
        stdout.print(f"no replica count up to {max_replicas} meets the SLOs; fix: relax them, "
                     "or a faster GPU / smaller model", highlight=False)
        return
    rep = d["report"]
    stdout.print(f"{d['replicas']} replicas ({d['gpus']} GPUs): TTFT p99 "
                 f"{rep['ttft_ms']['p99']:,.1f} ms, TPOT p99 {rep['tpot_ms']['p99']:,.1f} ms; "
                 f"${rep['cost_per_million_output_usd']:,.2f} per 1M output tokens, "
                 f"${rep['cost_per_million_input_usd']:,.2f} per 1M input tokens",
                 highlight=False)


def _fmt_ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.1f}"


@kv_app.command("paging")
def kv_paging(
    scenario: ScenarioOpt = "seed", model: ModelOpt = None, kv_dtype: KvDtypeOpt = None,
    weight_dtype: WDtypeOpt = None, context: CtxOpt = None, gpu: KvGpuOpt = None,
    num_gpus: KvNGpuOpt = None, tp: TpOpt = None, gpu_memory_utilization: UtilOpt = None,
    block_size: BlockOpt = None,
    lengths: Annotated[str, typer.Option(
        help="sharegpt, alpaca, or a CSV with prompt_tokens,output_tokens.")] = "sharegpt",
    requests: Annotated[int, typer.Option(help="Requests to replay.")] = 2000,
    qps: Annotated[float | None, typer.Option(
        help="Arrivals per second; default: twice what paging can serve.")] = None,
    iteration_ms: Annotated[float, typer.Option(help="One decode iteration (ms).")] = 20.0,
    pool_tokens: Annotated[int | None, typer.Option(
        help="KV pool in tokens; default: the [llm] pool of one replica.")] = None,
    max_len: Annotated[int | None, typer.Option(
        help="Longest sequence (contiguous-max reserves it); default: --context.")] = None,
    prefix_tokens: Annotated[int, typer.Option(
        help="A prompt prefix every request shares (a system prompt).")] = 0,
    seed: SeedOpt = None, as_json: JsonOpt = False,
) -> None:
    """Replay one request stream against the pool: contiguous (max, pow2, oracle) vs paged."""
    s = _load(locals(), _KV_KEYS)
    with Progress(TextColumn("replaying"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  console=stderr, transient=True) as bar:
        n_strat = 5 if prefix_tokens else 4
        task = bar.add_task("paging", total=requests * n_strat)
        report = run_paging(s, lengths=lengths, num_requests=requests, qps=qps,
                            iteration_ms=iteration_ms, pool_tokens=pool_tokens,
                            max_len=max_len, prefix_tokens=prefix_tokens, seed=seed or 0,
                            on_progress=lambda done: bar.update(task, completed=done))
    if as_json:
        _emit_json(report.to_dict())
    else:
        print_to(stdout, paging_table(report))


@app.command()
def lab(
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")
                    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.", min=1, max=65535)] = 8000,
    data_dir: Annotated[Path | None, typer.Option(
        help="A folder whose files (traces, profiles, config.json) a loaded scenario may "
             "name; without it the lab opens no file a page names.")] = None,
    allow_host: Annotated[list[str] | None, typer.Option(
        help="Another host name the lab answers to (repeat); loopback names always.")
                          ] = None,
) -> None:
    """Start the interactive lab in your browser (no server to install)."""
    from servelab.http import allowed_hosts
    from servelab.lab.server import LabConfig, run_lab

    if data_dir is not None and not data_dir.is_dir():
        raise InputError(f"--data-dir = {cut(str(data_dir))!r}: not a folder; "
                         "fix: give an existing folder, or leave it out")
    config = LabConfig(data_dir=str(data_dir.resolve()) if data_dir is not None else None,
                       allowed_hosts=allowed_hosts(host, allow_host))
    run_lab(config, host, port, lambda line: stderr.print(line, highlight=False))


MAX_SWEEP_POINTS = 1_000


def _grid(start: float | None, stop: float | None, steps: int, values: str | None
          ) -> list[float]:
    if values is not None:
        parts = [v for v in values.split(",") if v.strip()]
        if not parts or len(parts) > MAX_SWEEP_POINTS:
            raise invalid("--values", values, f"1 to {MAX_SWEEP_POINTS:,} comma-separated numbers",
                          "write e.g. --values 500,1000,2000")
        try:
            grid = [float(v) for v in parts]
        except ValueError:
            raise invalid("--values", values, "comma-separated numbers",
                          "write e.g. --values 500,1000,2000") from None
    else:
        if start is None or stop is None:
            raise invalid("--start/--stop", (start, stop), "both, or --values",
                          "give e.g. --start 500 --stop 4000 --steps 8")
        if not 1 <= steps <= MAX_SWEEP_POINTS:
            raise invalid("--steps", steps, f"a whole number from 1 to {MAX_SWEEP_POINTS:,}",
                          "use --steps 8")
        grid = [float(x) for x in np.linspace(start, stop, steps)]
    bad = [v for v in grid if not math.isfinite(v)]
    if bad:
        raise invalid("--values" if values is not None else "--start/--stop", bad[0],
                      "finite numbers", "give numbers like 500 or 2.5")
    return grid


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:,.4g}" if abs(x) < 1e5 else f"{x:,.0f}"
    return str(x)


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    try:
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else [])
            w.writeheader()
            w.writerows(rows)
    except OSError as exc:
        raise StoreError(f"--csv = {str(path)!r}: cannot write ({exc.strerror}); "
                         "fix: choose a writable path") from exc


def _say(message: str) -> None:
    """One line on stderr, whatever the message carries (newlines, rich markup, length)."""
    stderr.print(f"[bold red]error:[/] {escape(cut(message, 480))}", highlight=False,
                 soft_wrap=True)


def main() -> None:
    """The `servelab` command: `run_cli`, then a quick exit (see `_leave`)."""
    if len(sys.argv) > 1 and sys.argv[1] in _SIMULATING:
        _load_compiled_code()
    try:
        run_cli()
    except SystemExit as exc:
        _leave(exc.code)
    _leave(0)


_SIMULATING = frozenset({"simulate", "plan", "sweep"})  # commands that run the simulator


def _load_compiled_code() -> None:
    """Load the simulator's compiled code on a thread of its own while the command line is
    parsed and the scenario read: a run of 1,000 requests of the seed calls each of its
    compiled functions once, with the types a run of the user's scenario gives them (a
    scenario that takes other paths loads those when it gets there). Loading from Numba's
    cache starts LLVM (outside the GIL) and then each function; a thread that reaches one
    while it loads waits for it (Numba's own lock). Any error is left for the command's
    own run to meet. The time saved is in docs/performance.md."""
    import threading

    def load() -> None:
        with contextlib.suppress(Exception):
            from servelab.scenario import load_scenario

            run_simulate(load_scenario("seed").with_overrides({"workload.num_requests": 1000}))

    threading.Thread(target=load, name="servelab-load", daemon=True).start()


def _leave(code: object) -> None:
    """Exit without the interpreter's teardown of its modules, which, once Numba's compiled
    code is loaded, takes longer than some commands' own work (docs/performance.md has
    the figures). What an orderly exit does that matters is done first: non-daemon threads are
    joined, exit handlers run (multiprocessing joins its children, Spark stops its JVM),
    and the standard streams are flushed."""
    import atexit
    import contextlib
    import os
    import threading

    if code is None or isinstance(code, int):
        status = code or 0
    else:  # sys.exit("message"): printed, status 1, as the interpreter does
        print(code, file=sys.stderr)
        status = 1
    me = threading.current_thread()
    for t in threading.enumerate():
        if t is not me and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`| head`)
            stream.flush()
    os._exit(status)


def run_cli() -> None:
    """Entry point: the one place a user's mistake becomes a message instead of a traceback.

    Typer reports its own usage errors (unknown flag, a word where a number goes)
    and exits 2; a ServelabError from the scenario or a file exits 1. Anything else
    is servelab's bug: one line that says so and exit 3 (SERVELAB_DEBUG=1 shows the
    traceback). Ctrl+C exits 130 without a traceback.
    """

    from typer import _click as click

    try:
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except click.exceptions.NoArgsIsHelpError:  # `servelab` alone: Typer printed the help
        sys.exit(0)
    except click.exceptions.UsageError as exc:  # a flag Typer could not parse: one line too
        where = exc.ctx.command_path if exc.ctx is not None else "servelab"
        _say(f"{exc.format_message()}; fix: see '{where} --help'")
        sys.exit(2)
    except click.exceptions.ClickException as exc:
        _say(exc.format_message())
        sys.exit(exc.exit_code)
    except typer.Abort:
        stderr.print("interrupted", highlight=False)
        sys.exit(130)
    except ServelabError as exc:
        _say(str(exc))
        sys.exit(1)
    except KeyboardInterrupt:
        stderr.print("interrupted", highlight=False)
        sys.exit(130)
    except RecursionError:
        _say("input nested too deeply; fix: flatten the file's tables or lists")
        sys.exit(1)
    except MemoryError:
        _say("out of memory; fix: fewer requests (--num-requests) or a smaller input")
        sys.exit(1)
    except OSError as exc:
        # A path the user named that the system refuses (too long, a file where a
        # folder should be, no permission): checked at each flag where it is written;
        # a path only read is stat'ed in many places, and this is the one line for them.
        if exc.filename is None or exc.errno not in _PATH_ERRNOS:
            _internal_error(exc)
        _say(f"path {cut(str(exc.filename), 100)!r}: {exc.strerror}; fix: give a shorter, "
             "existing or permitted path")
        sys.exit(1)
    except Exception as exc:  # a bug: say so in one line, never a traceback by default
        _internal_error(exc)


_PATH_ERRNOS = {errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM,
                errno.ELOOP, errno.EROFS, errno.ENOSPC, errno.ENOENT, errno.EEXIST}


def _internal_error(exc: BaseException) -> NoReturn:
    if os.environ.get("SERVELAB_DEBUG"):
        raise exc
    _say(f"internal error ({type(exc).__name__}: {exc}); this is a servelab bug: "
         "rerun with SERVELAB_DEBUG=1 for the traceback and report it")
    sys.exit(3)
