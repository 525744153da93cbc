"""Rich tables for a Report. Formatting only: every number comes from the Report."""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table

from servelab.llm.kv import GIB
from servelab.llm.pool import KvReport, PagingReport
from servelab.report import Report
from servelab.seed import SeedRow


def _ms(x: float) -> str:
    return f"{x:.3f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def report_tables(r: Report, *, title: str) -> Group:
    s = r.scenario
    b = s["batching"]
    head = Table(title=title, show_header=False, title_justify="left", box=None)
    head.add_column(style="bold")
    head.add_column()
    pref = b.get("preferred_batch_size") or []
    head.add_row("scenario", f"{s['name']}: {s['workload']['qps']:g} QPS "
                 f"({s['workload']['arrival']}), max_batch_size {b['max_batch_size']}, "
                 f"max_queue_delay {b['max_queue_delay_microseconds']} us"
                 + (f", preferred {pref}" if pref else ""))
    head.add_row("hardware", f"{r.gpu.num_gpus} x {r.gpu.gpu}, {r.gpu.num_instances} instance(s)"
                 f", ${r.plan.price_per_gpu_hour_usd:.2f}/GPU-hour")
    head.add_row("requests", f"{r.requests.arrivals:,} arrived: {r.requests.served:,} served, "
                 f"{r.requests.rejected:,} rejected, {r.requests.timed_out:,} timed out")
    head.add_row("batches", f"mean {r.batching.mean_batch_size:.2f} rows, p50 "
                 f"{r.batching.p50_batch_size:g}, p99 {r.batching.p99_batch_size:g}, "
                 f"{r.batching.num_batches:,} batches")
    head.add_row("GPU", f"busy {_pct(r.gpu.busy_fraction)}, fed {_pct(r.gpu.batch_efficiency)} "
                 f"while busy, effective {_pct(r.gpu.effective_utilization)}, "
                 f"MFU {_pct(r.gpu.mfu)}")
    head.add_row("throughput", f"{r.throughput.served_per_s:,.1f} inferences/s served "
                 f"(saturated: {r.gpu.saturated_rows_per_s_per_instance:,.0f} rows/s per instance)")

    lat = Table(title="latency budget (ms)", title_justify="left")
    lat.add_column("component")
    for col in ("mean", "p50", "p90", "p99"):
        lat.add_column(col, justify="right")
    for name, st in r.latency.components.items():
        style = "bold" if name == "end_to_end" else None
        lat.add_row(name.replace("_", " "), _ms(st.mean_ms), _ms(st.p50_ms), _ms(st.p90_ms),
                    _ms(st.p99_ms), style=style)

    plan = Table(title="plan", title_justify="left", show_header=False, box=None)
    plan.add_column(style="bold")
    plan.add_column()
    plan.add_row("GPUs", str(r.plan.num_gpus))
    plan.add_row("$ per 1M inferences", f"${r.plan.cost_per_million_usd:.4f}")
    plan.add_row("verdict", r.plan.verdict)
    parts: list[Table] = [head, lat, plan]
    cf = r.plan.closed_form
    if cf is not None:
        cmp = Table(title=f"closed-form first estimate vs simulated ({cf.num_gpus} GPUs)"
                    if not r.plan.search else "closed-form first estimate vs simulated",
                    title_justify="left")
        for col in ("", "closed form (estimate)", "simulated"):
            cmp.add_column(col, justify="right")
        if r.plan.search:  # from the planner: both answer "how many GPUs?"
            cmp.add_row("GPUs for the SLO", str(cf.num_gpus), str(r.plan.num_gpus))
        cmp.add_row("mean batch", f"{cf.mean_batch_size:.2f}", f"{r.batching.mean_batch_size:.2f}")
        cmp.add_row("busy", _pct(cf.busy_fraction), _pct(r.gpu.busy_fraction))
        cmp.add_row("mean queue ms", _ms(cf.mean_queue_ms), _ms(r.latency.mean_queue_ms))
        cmp.add_row("p99 ms", _ms(cf.p99_ms), _ms(r.latency.p99_ms))
        parts.append(cmp)
    if r.plan.search:
        srch = Table(title="GPU counts simulated", title_justify="left")
        for col in ("GPUs", "p99 ms", "busy", "dropped", "meets"):
            srch.add_column(col, justify="right")
        for step in r.plan.search:
            srch.add_row(str(step.num_gpus), _ms(step.p99_ms), _pct(step.busy_fraction),
                         str(step.dropped), "yes" if step.meets else "no")
        parts.append(srch)
    if r.notes:
        notes = Table(show_header=False, box=None)
        notes.add_column()
        for n in r.notes:
            notes.add_row(f"note: {n}")
        parts.append(notes)
    return Group(*parts)


def seed_table(rows: list[SeedRow]) -> Table:
    t = Table(title="the seed dashboard, stated vs servelab", title_justify="left")
    t.add_column("figure")
    t.add_column("stated")
    t.add_column("servelab")
    t.add_column("", justify="center")
    t.add_column("why")
    for r in rows:
        t.add_row(r.figure, r.stated, r.servelab, "ok" if r.agrees else "differs", r.reason)
    return t


def print_to(console: Console, *renderables: object) -> None:
    for x in renderables:
        console.print(x)



def kv_tables(r: KvReport) -> Group:
    d = r.to_dict()
    m, dep, kv, mem = d["model"], d["deployment"], d["kv"], d["memory"]
    g = mem["per_gpu"]
    head = Table(title=f"servelab kv: {m['name']}", title_justify="left", show_header=False,
                 box=None)
    head.add_column(style="bold")
    head.add_column()
    attn = m["attention"].upper()
    if m["kv_lora_rank"]:
        attn += f" (latent {m['kv_lora_rank']} + rope {m['qk_rope_head_dim']})"
    if m["sliding_layers"]:
        attn += (f", {m['sliding_layers']} of {m['num_layers']} layers sliding "
                 f"({m['sliding_window']})")
    heads = "" if m["kv_lora_rank"] else f"{m['num_kv_heads']} KV heads x {m['head_dim']}, "
    head.add_row("model", f"{m['num_layers']} layers, {heads}{attn}; "
                 f"{m['num_parameters'] / 1e9:.2f}B parameters")
    head.add_row("deployment", f"{dep['num_gpus']} x {dep['gpu']}, tp {dep['tp']} "
                 + (f"x pp {dep['pp']} " if dep.get("pp", 1) > 1 else "") +
                 f"({dep['replicas']} replica(s)), KV {dep['kv_dtype']}, weights "
                 f"{dep['weight_dtype']}, gpu_memory_utilization {dep['gpu_memory_utilization']}")
    head.add_row("KV per token", f"{kv['bytes_per_token']:,.0f} bytes "
                 f"({kv['bytes_per_token'] / 1024**2:.4g} MiB); per GPU "
                 f"{kv['bytes_per_token_per_gpu']:,.0f} bytes")
    head.add_row(f"KV per {dep['context_tokens']:,}-token session",
                 f"{kv['bytes_per_session']:,.0f} bytes ({kv['bytes_per_session'] / GIB:.4g} GiB, "
                 f"{kv['bytes_per_session'] / 1e9:.4g} GB)")
    head.add_row("pool", f"{kv['num_blocks']:,} blocks of {dep['block_size']} tokens = "
                 f"{kv['tokens_capacity']:,} tokens per replica")
    head.add_row("max sessions", f"{kv['max_sessions']:,} at {dep['context_tokens']:,} tokens "
                 f"(vLLM's maximum concurrency {kv['max_concurrency']:.2f}x per replica)")
    if kv["for_sessions"]:
        head.add_row("longest context", f"{kv['longest_context_tokens']:,} tokens for "
                     f"{kv['for_sessions']} concurrent sessions")
    vram = Table(title="each GPU's memory (GiB)", title_justify="left")
    for col in ("runtime total", "weights", "activation", "non-torch", "CUDA graphs",
                "KV pool", "left by utilization"):
        vram.add_column(col, justify="right")
    vram.add_row(*(f"{g[k] / GIB:.2f}" for k in (
        "runtime_total_bytes", "weights_bytes", "activation_bytes", "non_torch_bytes",
        "cudagraph_bytes", "kv_pool_bytes", "unused_bytes")))
    parts: list[Table] = [head, vram]
    notes = [*d["notes"], f"runtime memory: {mem['runtime_memory_source']}"]
    if d["deployment"]["vllm_defaults_used"]:
        notes.append(f"vLLM V1's defaults for {d['deployment']['gpu']} (vllm serve): "
                     + ", ".join(d["deployment"]["vllm_defaults_used"]))
    note_t = Table(show_header=False, box=None)
    note_t.add_column()
    for n in notes:
        note_t.add_row(f"note: {n}")
    parts.append(note_t)
    return Group(*parts)


def paging_table(r: PagingReport) -> Group:
    t = Table(title=f"KV allocation, {r.num_requests:,} {r.lengths} requests at {r.qps:.1f}/s "
              f"into {r.pool_tokens:,} tokens (share of the pool while requests wait)",
              title_justify="left")
    for col in ("strategy", "token states", "reserved", "internal frag", "external frag",
                "free", "mean seqs", "max seqs", "preempted", "done"):
        t.add_column(col, justify="right")
    for x in r.results:
        u = x.under_load
        t.add_row(x.strategy, _pct(u["token"]), _pct(u["reserved"]), _pct(u["internal"]),
                  _pct(u["external"]), _pct(u["free"]), f"{x.mean_concurrency:.1f}",
                  str(x.max_concurrency), str(x.preemptions), f"{x.completed:,}")
    info = Table(show_header=False, box=None)
    info.add_column()
    info.add_row(f"prompts average {r.mean_prompt_tokens:.1f} tokens, outputs "
                 f"{r.mean_output_tokens:.1f}; max_len {r.max_len:,}; block {r.block_size}; "
                 f"shared prefix {r.prefix_tokens} tokens")
    for n in r.notes:
        info.add_row(f"note: {n}")
    return Group(t, info)
