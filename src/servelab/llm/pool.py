"""The KV report: a scenario's [llm] pool sized the vLLM way, as JSON-able figures."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from servelab.catalog import GpuSpec, get_gpu, resolve_gpu_name
from servelab.errors import invalid
from servelab.llm.kv import KV_DTYPES, PoolReport, PoolSpec, longest_context, size_pool
from servelab.llm.models import get_model, model_from_config
from servelab.llm.paging import (
    PagingResult,
    Strategy,
    Workload,
    simulate_paging,
    synthetic_workload,
    trace_workload,
)
from servelab.scenario import LlmPool, Scenario

# Bounded work: the replay is a Python loop over decode steps, about 3 us a token.
MAX_PAGING_REQUESTS = 100_000
MAX_DECODE_TOKENS = 10_000_000  # generated tokens per strategy (~30 s each at worst)
MAX_POOL_TOKENS = 100_000_000  # the block pool's books are Python lists


def _gpu(s: Scenario, p: LlmPool) -> GpuSpec:
    """[llm] gpu, or [hardware] gpu when unset; [hardware]'s figure overrides (bandwidth,
    interconnect, price...) apply when both name the same GPU."""
    if p.gpu is None or resolve_gpu_name(p.gpu, "[llm] gpu") == resolve_gpu_name(
            s.hardware.gpu):
        return s.hardware.spec()
    return get_gpu(p.gpu)


def vllm_serve_defaults(gpu: GpuSpec) -> tuple[int, int]:
    """vLLM V1's max_num_batched_tokens and max_num_seqs for `vllm serve` on this GPU
    (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults): the larger pair on GPUs of
    70 GiB or more, except the A100 (a larger budget lowered its throughput, vLLM PR
    #17885)."""
    if gpu.runtime_memory_gib() >= 70 and not gpu.key.upper().startswith("A100"):
        return 8192, 1024
    return 2048, 256


def pool_spec(s: Scenario, *, memory_runtime_gib: float | None = None,
              weights_gib: float | None = None, activation_gib: float | None = None,
              non_torch_gib: float | None = None, cudagraph_gib: float = 0.0) -> PoolSpec:
    """The scenario's [llm] section as a vLLM deployment (its gpu defaults to [hardware])."""
    p = s.llm or LlmPool()
    if p.config is not None:
        model = model_from_config(json.loads(p.config), "[llm] config", "config")
    else:
        model = get_model(p.model, "[llm] model", resolve=s.resolve_path if s.sandbox else None)
    for name, v, lo, hi in (("--memory-gib", memory_runtime_gib, 0.0, 1e6),
                            ("--weights-gib", weights_gib, 0.0, 1e7),
                            ("--activation-gib", activation_gib, 0.0, 1e6),
                            ("--non-torch-gib", non_torch_gib, 0.0, 1e6),
                            ("--cudagraph-gib", cudagraph_gib, 0.0, 1e6)):
        if v is not None and not (math.isfinite(v) and lo <= v <= hi and (
                v > 0 or name != "--memory-gib")):
            raise invalid(name, v, f"a number of GiB {'>' if name == '--memory-gib' else '>='} "
                          f"{lo:g} and <= {hi:g}", f"give {name} as a positive size in GiB")
    gpu = _gpu(s, p)
    tokens, seqs = vllm_serve_defaults(gpu)
    defaults = tuple(f"{name} {v:,}" for name, v, given in (
        ("max_num_batched_tokens", tokens, p.max_num_batched_tokens),
        ("max_num_seqs", seqs, p.max_num_seqs)) if given is None)
    return PoolSpec(
        model=model,
        gpu=gpu,
        defaults=defaults,
        kv_dtype=p.kv_dtype,
        weight_dtype=p.weight_dtype,
        context_tokens=p.context_tokens,
        num_gpus=p.num_gpus,
        tp=p.tensor_parallel,
        pp=p.pp,
        gpu_memory_utilization=p.gpu_memory_utilization,
        block_size=p.block_size,
        max_num_batched_tokens=p.max_num_batched_tokens or tokens,
        max_num_seqs=p.max_num_seqs or seqs,
        memory_runtime_gib=memory_runtime_gib,
        weights_gib=weights_gib,
        activation_gib=activation_gib,
        non_torch_gib=non_torch_gib,
        cudagraph_gib=cudagraph_gib,
        num_gpu_blocks_override=p.num_gpu_blocks_override,
    )


@dataclass(frozen=True, slots=True)
class KvReport:
    """What `servelab kv` prints: the model, the KV figures, each GPU's memory."""

    spec: PoolSpec
    pool: PoolReport
    sessions: int | None  # the inverse question, when asked
    longest_context_tokens: int | None

    def to_dict(self) -> dict[str, Any]:
        p, m, g = self.pool, self.spec.model, self.pool.per_gpu
        gpus = self.spec.num_gpus
        return {
            "model": {
                "key": m.key, "name": m.name, "num_layers": m.num_layers,
                "num_kv_heads": m.num_kv_heads, "head_dim": m.head_dim,
                "attention": "mla" if m.is_mla else ("gqa" if m.num_kv_heads <
                                                     m.num_attention_heads else "mha"),
                "kv_lora_rank": m.kv_lora_rank, "qk_rope_head_dim": m.qk_rope_head_dim,
                "sliding_window": m.sliding_window,
                "sliding_layers": sum(k == "sliding_attention" for k in m.layer_kinds()),
                "num_parameters": m.num_parameters, "source": m.source,
                "params_source": m.params_source,
            },
            "deployment": {
                "gpu": self.spec.gpu.key, "num_gpus": gpus, "tp": p.tp, "pp": p.pp,
                "replicas": p.replicas,
                "kv_dtype": p.kv_dtype, "weight_dtype": p.weight_dtype,
                "context_tokens": p.context_tokens,
                "gpu_memory_utilization": self.spec.gpu_memory_utilization,
                "block_size": p.block_size,
                "max_num_batched_tokens": self.spec.max_num_batched_tokens,
                "max_num_seqs": self.spec.max_num_seqs,
                "vllm_defaults_used": list(self.spec.defaults),
            },
            "kv": {
                "element_bytes": KV_DTYPES[p.kv_dtype][0],
                "bytes_per_token": p.bytes_per_token,
                "bytes_per_token_per_gpu": p.bytes_per_token_per_gpu,
                "bytes_per_session": p.bytes_per_session,
                "bytes_per_session_per_gpu": p.bytes_per_session_per_gpu,
                "block_bytes_per_gpu": p.block_bytes_per_gpu,
                "blocks_per_session": p.blocks_per_session,
                "num_blocks": p.num_blocks,
                "tokens_capacity": p.tokens_capacity,
                "max_concurrency": p.max_concurrency,
                "max_sessions": p.max_sessions,
                "longest_context_tokens": self.longest_context_tokens,
                "for_sessions": self.sessions,
            },
            "memory": {
                "weights_bytes": p.weights_bytes,
                "kv_pool_bytes": g.kv_pool_bytes * gpus,
                "per_gpu": asdict(g),
                "runtime_memory_source": ("override" if self.spec.memory_runtime_gib
                                          else "catalog" if self.spec.gpu.memory_runtime_gib
                                          else "estimate: 0.99 x datasheet GB, in GiB"),
            },
            "fits": p.fits,
            "notes": list(p.notes),
        }


def kv_report(spec: PoolSpec, sessions: int | None = None) -> KvReport:
    return KvReport(spec, size_pool(spec), sessions,
                    longest_context(spec, sessions) if sessions is not None else None)




@dataclass(frozen=True, slots=True)
class PagingReport:
    """The allocation simulator's answer: one result per strategy, on one workload."""

    lengths: str
    num_requests: int
    qps: float
    iteration_ms: float
    pool_tokens: int
    max_len: int
    block_size: int
    prefix_tokens: int
    mean_prompt_tokens: float
    mean_output_tokens: float
    results: tuple[PagingResult, ...]
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["results"] = [asdict(r) for r in self.results]
        return out


def run_paging(s: Scenario, *, lengths: str = "sharegpt", num_requests: int = 2000,
               qps: float | None = None, iteration_ms: float = 20.0,
               pool_tokens: int | None = None, max_len: int | None = None,
               prefix_tokens: int = 0, strategies: list[Strategy] | None = None,
               seed: int = 0, on_progress: Callable[[int], object] | None = None,
               max_steps: int = 1_000_000) -> PagingReport:
    """Replay one request stream against the scenario's KV pool under each strategy.

    The pool defaults to the [llm] pool's token capacity (one replica); max_len to
    its context length. With no `qps`, requests arrive at twice the rate the paged
    pool can serve, so memory is the bottleneck for every strategy.
    """
    spec = pool_spec(s)
    given_pool = pool_tokens is not None
    if pool_tokens is None:
        pool_tokens = size_pool(spec).tokens_capacity
    if max_len is None:
        max_len = spec.context_tokens
    for name, v, lo, hi in (("--requests", num_requests, 1, MAX_PAGING_REQUESTS),
                            ("--pool-tokens", pool_tokens, 1, MAX_POOL_TOKENS),
                            ("--max-len", max_len, 2, 10_000_000),
                            ("--prefix-tokens", prefix_tokens, 0, 10_000_000)):
        if not lo <= v <= hi:
            fix = (f"use {name} {max(lo, 1)} or more" if v < lo else f"use {name} {hi:,} or less")
            if name == "--pool-tokens" and v < lo and not given_pool:
                fix = "the [llm] pool holds nothing: check `servelab kv`"
            elif name == "--pool-tokens" and not given_pool:
                fix = (f"the [llm] pool holds {v:,} tokens; replay a part of it with "
                       f"--pool-tokens {hi:,}")
            raise invalid(name, v, f"a whole number from {lo:,} to {hi:,}", fix)
    if pool_tokens // spec.block_size < 1:
        raise invalid("--pool-tokens", pool_tokens, f"at least one block ({spec.block_size} "
                      "tokens)", f"use --pool-tokens {spec.block_size} or more")
    if not (math.isfinite(iteration_ms) and 0 < iteration_ms <= 1e6):
        raise invalid("--iteration-ms", iteration_ms, "a time > 0 and <= 1e6 ms", "use e.g. 20")
    if not 0 <= seed <= 2**63 - 1:
        raise invalid("--seed", seed, "a whole number >= 0", "use e.g. --seed 0")
    if qps is not None and not (math.isfinite(qps) and 1e-6 <= qps <= 1e9):
        raise invalid("--qps", qps, "a rate from 1e-6 to 1e9 per second", "use e.g. --qps 20")
    rng = np.random.default_rng(seed)
    path = Path(lengths)
    if lengths.endswith(".csv") or path.is_file():
        probe = trace_workload(path, num_requests, 1.0, max_len, prefix_tokens, rng)
    else:
        probe = synthetic_workload(lengths, num_requests, 1.0, max_len, prefix_tokens, rng)
    p_mean, o_mean = float(probe.prompt.mean()), float(probe.output.mean())
    decode_steps = int(probe.output.sum())
    if decode_steps > MAX_DECODE_TOKENS:
        raise invalid("--requests", num_requests,
                      f"a replay of at most {MAX_DECODE_TOKENS:,} generated tokens per strategy "
                      f"(these requests generate {decode_steps:,})",
                      "replay fewer requests, or lower --max-len")
    if qps is None:
        in_flight = p_mean + o_mean / 2
        concurrent = min(pool_tokens / in_flight, spec.max_num_seqs)
        per_step = 2 * concurrent / o_mean
        qps = per_step * 1000.0 / iteration_ms
    if qps <= 0:
        raise invalid("--qps", qps, "a rate > 0", "use e.g. --qps 20")
    per_step = qps * iteration_ms / 1000.0
    steps = np.floor(np.cumsum(np.random.default_rng(seed + 1).exponential(
        1.0 / per_step, probe.prompt.size))).astype(np.int64)
    work = Workload(steps, probe.prompt, probe.output, prefix_tokens)
    chosen = strategies or [st for st in Strategy
                            if st is not Strategy.PAGED_PREFIX or prefix_tokens > 0]
    notes = []
    if prefix_tokens == 0 and strategies is None:
        notes.append("paged_prefix left out: no shared prefix (give --prefix-tokens)")
    results = []
    for k, st in enumerate(chosen):
        offset = k * probe.prompt.size

        def progress(done: int, offset: int = offset) -> None:
            if on_progress is not None:
                on_progress(offset + done)

        results.append(simulate_paging(
            work, st, pool_tokens, block_size=spec.block_size, max_len=max_len,
            max_num_seqs=spec.max_num_seqs, max_steps=max_steps, on_progress=progress))
    cut_short = [r.strategy for r in results if r.steps >= max_steps]
    if cut_short:
        notes.append(f"the replay stopped after {max_steps:,} decode steps before every "
                     f"request finished ({', '.join(cut_short)}): its figures cover those steps")
    if any(r.max_concurrency >= spec.max_num_seqs for r in results):
        notes.append(f"max_num_seqs ({spec.max_num_seqs}) capped concurrency: some memory "
                     "stays free because the scheduler, not the pool, is the limit")
    return PagingReport(lengths, int(probe.prompt.size), float(qps), iteration_ms,
                        int(pool_tokens), int(max_len), spec.block_size, prefix_tokens, p_mean,
                        o_mean, tuple(results), tuple(notes))
