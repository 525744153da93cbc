"""A scenario: one serving setup, described once, validated once at the edge.

A scenario is read from TOML (or built in Python), overridden by CLI flags or
lab sliders as a flat ``{"section.key": value}`` mapping, and validated into
frozen dataclasses. Keys use the names users know: Triton's for batching
(``max_batch_size``, ``max_queue_delay_microseconds``, ...).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from importlib import resources
from pathlib import Path
from typing import Any

import tomli_w

from servelab.catalog import FIGURES, GpuSpec, get_gpu, resolve_gpu_name
from servelab.errors import InputError, closest, cut, invalid, unknown_key
from servelab.files import MAX_CONFIG_BYTES, parse_toml, read_text

# Ranges every value is held to at the edge, so nothing the engine cannot represent
# exactly (int64 nanoseconds, float64) gets past validation.
MAX_QPS = 1e9
MAX_REQUESTS = 5_000_000  # about 115 MB at peak (23 bytes a request); enough for a p99.99
MAX_BATCH = 1 << 16
MAX_GPUS = 100_000
MAX_MS = 3_600_000.0  # one hour, for any single latency or batch time
MAX_TIMEOUT_US = 86_400_000_000  # one day
MAX_CV = 100.0
MIN_CV = 1e-3  # gamma's shape is 1/cv^2: below this it is a constant process
MAX_SPAN_S = 1e8  # simulated seconds a run may span (int64 ns hold ~292 years)
MAX_INLINE_ARRIVALS = 1_000_000


class Arrival(Enum):
    POISSON = "poisson"
    CONSTANT = "constant"
    GAMMA = "gamma"
    TRACE = "trace"


class ServiceKind(Enum):
    CONSTANT = "constant"
    AFFINE = "affine"
    PROFILE = "profile"
    ROOFLINE = "roofline"


class Closing(Enum):
    """When a batch stops taking arrivals while every instance is busy."""

    TRITON = "triton"  # Triton's batcher thread: payloads close and wait (see triton_engine)
    ABSORB = "absorb"  # the batch keeps absorbing arrivals until an instance starts it


class Variability(Enum):
    """How one batch's execution time varies around the model's mean."""

    DETERMINISTIC = "deterministic"
    EXPONENTIAL = "exponential"
    GAMMA = "gamma"
    EMPIRICAL = "empirical"  # measured multipliers, resampled


@dataclass(frozen=True, slots=True)
class Workload:
    qps: float = 1000.0
    arrival: Arrival = Arrival.POISSON
    cv: float = 1.0  # coefficient of variation of inter-arrival gaps (gamma only)
    trace_csv: str | None = None  # arrival times, one per row (trace only)
    arrivals_s: tuple[float, ...] = ()  # or the trace inline, in seconds (trace only)
    num_requests: int = 100_000
    seed: int = 0


@dataclass(frozen=True, slots=True)
class BatchingPolicy:
    """Triton's dynamic_batching settings, by Triton's names.

    ``max_queue_size`` and ``default_timeout_microseconds`` use 0 for "none",
    as Triton does. With no ``preferred_batch_size`` Triton behaves as if it
    were ``[max_batch_size]`` (its model-config normaliser adds it).
    """

    max_batch_size: int = 32
    max_queue_delay_microseconds: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_size: int = 0
    default_timeout_microseconds: int = 0
    instances_per_gpu: int = 1
    closing: Closing = Closing.TRITON
    # Share of completions at which Triton's woken batcher thread looks at the queue
    # before the freed instance takes the next waiting payload (`servelab replay-trace`
    # measures it from a Triton trace); 0 is the order the source implies.
    batcher_first: float = 0.0
    # Share of completions whose wake-up Triton 2.51's batcher thread misses when it runs
    # without prefetching (a queue policy set): the instance idles until an arrival wakes
    # the thread or its 500 ms wait ends (triton_engine, rule 6). 0: off, the default.
    lost_wakeup: float = 0.0

    @property
    def effective_preferred(self) -> tuple[int, ...]:
        return self.preferred_batch_size or (self.max_batch_size,)


@dataclass(frozen=True, slots=True)
class Hardware:
    gpu: str = "H100-SXM"
    num_gpus: int = 1
    price_per_gpu_hour: float | None = None  # None: the catalog's default
    overrides: tuple[tuple[str, float], ...] = ()  # catalog figures replaced by the user

    def spec(self) -> GpuSpec:
        over = dict(self.overrides)
        if self.price_per_gpu_hour is not None:
            over["price_per_gpu_hour_usd"] = self.price_per_gpu_hour
        return get_gpu(self.gpu, over)


@dataclass(frozen=True, slots=True)
class ServiceModelSpec:
    """What one batch costs on one instance. Which fields apply depends on ``kind``."""

    kind: ServiceKind = ServiceKind.AFFINE
    name: str = ""
    # constant
    latency_ms: float | None = None
    # affine
    base_ms: float | None = 1.0
    per_row_ms: float | None = 0.1
    # profile
    points: tuple[tuple[int, float], ...] = ()
    csv: str | None = None
    perf_analyzer_csv: tuple[tuple[int, str], ...] = ()
    # roofline
    flops_per_row: float | None = None
    bytes_per_row: float | None = None
    bytes_per_batch: float | None = None
    overhead_us: float = 0.0
    efficiency: float = 0.6
    precision: str = "bf16"
    # affine and profile: the cost of each request in a batch beyond its rows (one row per
    # request here, so a batch of b requests takes curve(b) + per_request_ms x b)
    per_request_ms: float = 0.0
    # all kinds
    variability: Variability = Variability.DETERMINISTIC
    cv: float = 0.0
    multipliers: tuple[float, ...] = ()  # empirical: measured batch time / the model's mean


@dataclass(frozen=True, slots=True)
class Latency:
    """Latency outside the GPU, and the end-to-end objective.

    A component given by its median alone is constant; with a p99 as well it
    is log-normal through those two points; with measured samples it is those
    samples, resampled (so measured stalls reach the tail).
    """

    feature_fetch_ms: float = 0.0
    feature_fetch_p99_ms: float | None = None
    network_ms: float = 0.0
    network_p99_ms: float | None = None
    p99_slo_ms: float = 100.0
    feature_fetch_samples_ms: tuple[float, ...] = ()
    network_samples_ms: tuple[float, ...] = ()

    def median_p99_ms(self, part: str) -> tuple[float, float]:
        """A component's median and p99 (ms): from its samples when it has them."""
        samples = getattr(self, f"{part}_samples_ms")
        if samples:
            return quantile(samples, 0.5), quantile(samples, 0.99)
        median = getattr(self, f"{part}_ms")
        return median, getattr(self, f"{part}_p99_ms") or median

    def is_constant(self, part: str) -> bool:
        """No spread: a median alone (or a p99 equal to it), and no samples."""
        if getattr(self, f"{part}_samples_ms"):
            return False
        median, p99 = getattr(self, f"{part}_ms"), getattr(self, f"{part}_p99_ms")
        return p99 is None or p99 == median or median == 0


def quantile(values: tuple[float, ...] | list[float], q: float) -> float:
    """The q-quantile with linear interpolation (numpy's default), without numpy."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class PlanLimits:
    max_busy_fraction: float = 1.0
    max_gpus: int = 512


@dataclass(frozen=True, slots=True)
class LlmPool:
    """An LLM deployment's KV-cache pool, by vLLM's knobs.

    ``gpu`` defaults to [hardware] gpu; ``tp`` 0 means all ``num_gpus`` in one
    tensor-parallel group. ``gpu_memory_gb`` and ``weights_gb`` are the seed
    dashboard's simpler assumptions (all memory but the weights is KV), kept so
    its figures can be checked on their own terms.
    """

    model: str = "llama-3.1-8b"
    config: str | None = None  # a config.json inline (canonical JSON text), instead of model
    kv_dtype: str = "auto"
    weight_dtype: str = "auto"
    context_tokens: int = 4096
    gpu: str | None = None
    num_gpus: int = 1
    tp: int = 0
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    # None: vLLM V1's `vllm serve` default for the GPU (EngineArgs.get_batch_defaults):
    # 8,192 tokens and 1,024 sequences on a GPU of 70 GiB or more other than the A100,
    # else 2,048 and 256
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    gpu_memory_gb: float | None = None
    weights_gb: float | None = None
    # Serving (`servelab llm simulate|plan`): the workload, the scheduler's switches, SLOs.
    request_rate: float = 5.0  # requests per second over all replicas (inf: all at once)
    num_requests: int = 2000
    arrival: str = "poisson"  # poisson or constant
    max_concurrency: int = 0  # > 0: at most this many requests out (vLLM bench's closed loop)
    burstiness: float = 1.0  # vLLM bench's: gamma-shaped gaps (1: Poisson)
    prompt_tokens: float = 512.0  # mean; with a p99 the lengths are log-normal
    prompt_tokens_p99: float | None = None
    output_tokens: float = 256.0
    output_tokens_p99: float | None = None
    lengths_csv: str | None = None  # prompt_tokens,output_tokens per request instead
    replicas: int = 1
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True  # vLLM V1's default (with no shared prefix it does nothing)
    prefix_tokens: int = 0
    prefix_hit_share: float = 0.0
    ttft_p99_slo_ms: float = 1000.0
    tpot_p99_slo_ms: float = 50.0
    step_profile_csv: str | None = None  # a measured step profile instead of the roofline
    num_gpu_blocks_override: int | None = None  # vLLM's: KV blocks per replica, as measured
    # The engine's step loop: "v1" (vLLM V1: decodes and prompt chunks in one step) or
    # "prefill-first" (vLLM V0 without chunked prefill, SGLang: prompts run alone)
    scheduler: str = "v1"
    # The roofline's constants (None: the defaults fitted to published measurements;
    # `servelab llm fit` writes a user's own)
    compute_efficiency: float | None = None
    memory_efficiency: float | None = None
    overhead_ms: float | None = None
    prefill_first_overhead_ms: float | None = None
    per_seq_ms: float | None = None
    overlap: float | None = None
    allreduce_latency_us: float | None = None
    frontend_ms: float | None = None

    @property
    def tensor_parallel(self) -> int:
        return self.tp or self.num_gpus


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str = "scenario"
    description: str = ""
    workload: Workload = field(default_factory=Workload)
    batching: BatchingPolicy = field(default_factory=BatchingPolicy)
    hardware: Hardware = field(default_factory=Hardware)
    model: ServiceModelSpec = field(default_factory=ServiceModelSpec)
    latency: Latency = field(default_factory=Latency)
    plan: PlanLimits = field(default_factory=PlanLimits)
    llm: LlmPool | None = None
    # Where relative file paths in the scenario are resolved. With `sandbox` (the lab),
    # only files inside base_dir may be named, and with base_dir None none at all.
    base_dir: str | None = "."
    sandbox: bool = False

    def with_overrides(self, overrides: Mapping[str, Any]) -> Scenario:
        """A copy with flat ``section.key`` overrides applied, validated like a file."""
        raw = scenario_to_dict(self)
        apply_overrides(raw, overrides)
        return scenario_from_dict(raw, base_dir=self.base_dir, sandbox=self.sandbox)

    def resolve_path(self, path: str, field: str = "file") -> Path:
        """The file a scenario names, checked against the sandbox before anything reads it."""
        if not self.sandbox:
            p = Path(path)
            return p if p.is_absolute() or self.base_dir is None else Path(self.base_dir) / p
        inline = {"[workload] trace_csv": "arrivals_s = [...] (seconds)",
                  "[model] csv": "points = [[batch, ms], ...]",
                  "[model] perf_analyzer_csv": "points = [[batch, ms], ...]",
                  "[llm] model": "a [llm.config] table with the config.json's keys"}.get(
                      field, "the data inline")
        if self.base_dir is None:
            raise InputError(f"{field} = {cut(repr(path))}: the lab does not open files named "
                             f"by a page; fix: give {inline}, or start the lab with "
                             "--data-dir DIR and name a file inside DIR")
        root = Path(self.base_dir).resolve()
        p = Path(path)
        if p.is_absolute() or ".." in p.parts or "\0" in path:
            raise InputError(f"{field} = {cut(repr(path))}: expected a path inside the lab's "
                             f"--data-dir, relative to it; fix: name a file inside "
                             f"{cut(str(root))}, or give {inline}")
        real = (root / p).resolve()
        if not real.is_relative_to(root):  # a link that leads out of the folder
            raise InputError(f"{field} = {cut(repr(path))}: leads outside the lab's "
                             f"--data-dir; fix: copy the file into {cut(str(root))}")
        return real


# ---------------------------------------------------------------------------
# Validation: a small table per section, one rule per key.


def _num(lo: float | None = None, hi: float | None = None, *, strict_lo: bool = False,
         fix: str = "") -> Callable[[str, Any], float]:
    def conv(name: str, v: Any) -> float:
        bounds = []
        if lo is not None:
            bounds.append(f"{'>' if strict_lo else '>='} {lo:g}")
        if hi is not None:
            bounds.append(f"<= {hi:g}")
        expected = "a number" + (f" {' and '.join(bounds)}" if bounds else "")
        if isinstance(v, bool) or not isinstance(v, int | float) or not _finite(v):
            raise invalid(name, v, expected, fix or f"set {name} to {expected}")
        if lo is not None and (v <= lo if strict_lo else v < lo):
            raise invalid(name, v, expected, fix or f"set {name} to {expected}")
        if hi is not None and v > hi:
            raise invalid(name, v, expected, fix or f"set {name} to {expected}")
        return float(v)

    return conv


def _finite(v: int | float) -> bool:
    """A number servelab can hold: finite, and an int no larger than a float can carry."""
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def _rate(name: str, v: Any) -> float:
    """Requests per second: above 0 and at most 1e6, or inf (every request at once, which
    only a closed loop, max_concurrency > 0, can pace)."""
    if isinstance(v, float) and v == math.inf:
        return v
    return _num(0, 1e6, strict_lo=True, fix=f"set {name} to a number > 0 and <= 1e6, or "
                "inf with max_concurrency")(name, v)


def _int(lo: int, hi: int, fix: str = "") -> Callable[[str, Any], int]:
    def conv(name: str, v: Any) -> int:
        expected = f"a whole number >= {lo:,} and <= {hi:,}"
        if isinstance(v, float) and math.isfinite(v) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or v > hi:
            raise invalid(name, v, expected, fix or f"set {name} to {expected}")
        return v

    return conv


def _opt(conv: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    return lambda name, v: None if v is None else conv(name, v)


MAX_STR = 10_000  # characters in a name, description or path


def _str(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise invalid(name, v, "a string", f"quote the value: {name} = \"...\"")
    if len(v) > MAX_STR:
        raise invalid(name, v, f"at most {MAX_STR:,} characters", "shorten it")
    return v


def _enum(cls: type[Enum]) -> Callable[[str, Any], Any]:
    def conv(name: str, v: Any) -> Any:
        if isinstance(v, cls):
            return v
        choices = [m.value for m in cls]
        if isinstance(v, str) and v.lower() in choices:
            return cls(v.lower())
        guess = closest(str(v).lower(), choices)
        fix = f"did you mean {guess!r}?" if guess else f"use one of {', '.join(choices)}"
        raise invalid(name, v, f"one of {', '.join(choices)}", fix)

    return conv


def _bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise invalid(name, v, "true or false", f"write {name.split()[-1]} = true (or false)")
    return v


def _choice(*choices: str) -> Callable[[str, Any], str]:
    def conv(name: str, v: Any) -> str:
        if isinstance(v, str) and v.lower() in choices:
            return v.lower()
        raise invalid(name, v, f"one of {', '.join(choices)}", f"use one of {', '.join(choices)}")

    return conv


_WEIGHT_DTYPES = _choice("auto", "fp32", "bf16", "fp16", "fp8", "int8", "int4")
# vLLM's --quantization methods by the width they store weights at
_QUANT_METHODS = {"awq": "int4", "gptq": "int4", "awq_marlin": "int4", "gptq_marlin": "int4",
                  "marlin": "int4", "bitsandbytes": "int4", "fbgemm_fp8": "fp8",
                  "compressed-tensors": "auto"}


def _weight_dtype(name: str, v: Any) -> str:
    if isinstance(v, str) and v.lower() in _QUANT_METHODS:
        return _QUANT_METHODS[v.lower()]
    return str(_WEIGHT_DTYPES(name, v))


def _int_list(name: str, v: Any) -> tuple[int, ...]:
    if isinstance(v, int) and not isinstance(v, bool):
        v = [v]
    if isinstance(v, list | tuple) and len(v) > MAX_BATCH:
        raise invalid(name, f"a list of {len(v):,} entries", f"at most {MAX_BATCH:,} sizes",
                      "list only the batch sizes the model prefers")
    if not isinstance(v, list | tuple) or not all(
        isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= MAX_BATCH for x in v
    ):
        raise invalid(name, v, f"a list of whole numbers from 1 to {MAX_BATCH:,}",
                      f"write e.g. {name} = [4, 8]")
    return tuple(sorted(set(v)))


MAX_SAMPLES = 1_000_000


def _samples(lo: float, hi: float, what: str) -> Callable[[str, Any], tuple[float, ...]]:
    def conv(name: str, v: Any) -> tuple[float, ...]:
        expected = f"a list of at most {MAX_SAMPLES:,} {what} from {lo:g} to {hi:g}"
        if not isinstance(v, list | tuple) or len(v) > MAX_SAMPLES:
            what_ = f"a list of {len(v):,} entries" if isinstance(v, list | tuple) else v
            raise invalid(name, what_, expected, f"write e.g. {name} = [1.0, 0.98, 1.4]")
        for x in v:
            if isinstance(x, bool) or not isinstance(x, int | float) or not _finite(x) or not (
                    lo <= x <= hi):
                raise invalid(name, x, f"each value a number in {expected}", "fix that value")
        return tuple(float(x) for x in v)

    return conv


def _seconds_list(name: str, v: Any) -> tuple[float, ...]:
    expected = f"a list of at most {MAX_INLINE_ARRIVALS:,} arrival times in seconds >= 0"
    if not isinstance(v, list | tuple) or not v or len(v) > MAX_INLINE_ARRIVALS:
        what = f"a list of {len(v):,} entries" if isinstance(v, list | tuple) else v
        raise invalid(name, what, expected, f"write e.g. {name} = [0.0, 0.0012, 0.0031]")
    for x in v:
        if isinstance(x, bool) or not isinstance(x, int | float) or not _finite(x) or not (
                0 <= x <= MAX_SPAN_S):
            raise invalid(name, x, f"each time a number from 0 to {MAX_SPAN_S:g} s in {expected}",
                          "remove it, or convert the times to seconds")
    return tuple(sorted(float(x) for x in v))


def _config_table(name: str, v: Any) -> str:
    if not isinstance(v, Mapping):
        raise invalid(name, v, "a table with a config.json's fields (num_hidden_layers, ...)",
                      f"write [{name.strip('[]').split(']')[0]}.config] with the config's keys")
    try:
        text = json.dumps(v, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        raise invalid(name, "a table", "numbers, strings, booleans, lists and tables as in a "
                      "config.json", "copy the values from the model's config.json") from None
    if len(text) > MAX_CONFIG_BYTES:
        raise invalid(name, f"{len(text):,} bytes", f"at most {MAX_CONFIG_BYTES:,} bytes",
                      "keep only the config.json's own keys")
    return text


def _points(name: str, v: Any) -> tuple[tuple[int, float], ...]:
    expected = "a list of [batch_size, latency_ms] pairs"
    if isinstance(v, list | tuple) and len(v) > MAX_BATCH:
        raise invalid(name, f"a list of {len(v):,} entries", f"at most {MAX_BATCH:,} points",
                      "keep one point per measured batch size")
    if not isinstance(v, list | tuple):
        raise invalid(name, v, expected, f"write e.g. {name} = [[1, 0.9], [8, 1.6]]")
    out: list[tuple[int, float]] = []
    for p in v:
        if (
            not isinstance(p, list | tuple)
            or len(p) != 2
            or isinstance(p[0], bool)
            or not isinstance(p[0], int)
            or not 1 <= p[0] <= MAX_BATCH
            or isinstance(p[1], bool)
            or not isinstance(p[1], int | float)
            or not _finite(p[1])
            or not 0 < p[1] <= MAX_MS
        ):
            raise invalid(name, p, f"each entry [batch_size 1..{MAX_BATCH}, "
                          f"0 < latency_ms <= {MAX_MS:g}] in {expected}",
                          f"write e.g. {name} = [[1, 0.9], [8, 1.6]]")
        out.append((int(p[0]), float(p[1])))
    sizes = [b for b, _ in out]
    if len(set(sizes)) != len(sizes):
        raise invalid(name, v, "each batch size at most once", "remove the repeated batch size")
    return tuple(sorted(out))


def _pa_files(name: str, v: Any) -> tuple[tuple[int, str], ...]:
    expected = 'a table of batch size -> perf_analyzer CSV path, e.g. { "1" = "b1.csv" }'
    if not isinstance(v, Mapping):
        raise invalid(name, v, expected, f'write {name} = {{ "1" = "b1.csv", "8" = "b8.csv" }}')
    if len(v) > MAX_BATCH:
        raise invalid(name, f"a table of {len(v):,} entries", expected, "one file per batch size")
    out = []
    for k, path in v.items():
        if not (str(k).isdigit() and len(str(k)) < 7 and 1 <= int(k) <= MAX_BATCH) or not (
                isinstance(path, str) and len(path) <= MAX_STR):
            raise invalid(f"{name}.{k}", path, expected, "use the -b batch size as the key")
        out.append((int(k), path))
    return tuple(sorted(out))


_SECTIONS: dict[str, tuple[type, dict[str, Callable[[str, Any], Any]]]] = {
    "workload": (Workload, {
        "qps": _num(0, MAX_QPS, strict_lo=True),
        "arrival": _enum(Arrival),
        "cv": _num(MIN_CV, MAX_CV),
        "trace_csv": _opt(_str),
        "arrivals_s": _seconds_list,
        "num_requests": _int(1, MAX_REQUESTS),
        "seed": _int(0, 2**63 - 1),
    }),
    "batching": (BatchingPolicy, {
        "max_batch_size": _int(1, MAX_BATCH),
        "max_queue_delay_microseconds": _int(0, 60_000_000),
        "preferred_batch_size": _int_list,
        "max_queue_size": _int(0, 2**31 - 1),
        "default_timeout_microseconds": _int(0, MAX_TIMEOUT_US),
        "instances_per_gpu": _int(1, 64),
        "closing": _enum(Closing),
        "batcher_first": _num(0, 1),
        "lost_wakeup": _num(0, 1),
    }),
    "hardware": (Hardware, {
        "gpu": _str,
        "num_gpus": _int(1, MAX_GPUS),
        "price_per_gpu_hour": _opt(_num(0, 1e6)),
        **{fig: _num(0, 1e9, strict_lo=True) for fig in FIGURES
           if fig != "price_per_gpu_hour_usd"},
    }),
    "model": (ServiceModelSpec, {
        "kind": _enum(ServiceKind),
        "name": _str,
        "latency_ms": _opt(_num(0, MAX_MS, strict_lo=True)),
        "base_ms": _opt(_num(0, MAX_MS)),
        "per_row_ms": _opt(_num(0, MAX_MS)),
        "points": _points,
        "csv": _opt(_str),
        "perf_analyzer_csv": _pa_files,
        "flops_per_row": _opt(_num(0, 1e21)),
        "bytes_per_row": _opt(_num(0, 1e18)),
        "bytes_per_batch": _opt(_num(0, 1e18)),
        "overhead_us": _num(0, MAX_MS * 1e3),
        "efficiency": _num(0, 1, strict_lo=True),
        "precision": _choice("bf16", "fp8"),
        "variability": _enum(Variability),
        "cv": _num(0, MAX_CV),
        "per_request_ms": _num(0, MAX_MS),
        "multipliers": _samples(0.0, 1000.0, "multipliers (batch time / mean)"),
    }),
    "latency": (Latency, {
        "feature_fetch_ms": _num(0, MAX_MS),
        "feature_fetch_p99_ms": _opt(_num(0, MAX_MS)),
        "network_ms": _num(0, MAX_MS),
        "network_p99_ms": _opt(_num(0, MAX_MS)),
        "p99_slo_ms": _num(0, MAX_MS, strict_lo=True),
        "feature_fetch_samples_ms": _samples(0.0, MAX_MS, "latencies in ms"),
        "network_samples_ms": _samples(0.0, MAX_MS, "latencies in ms"),
    }),
    "plan": (PlanLimits, {
        "max_busy_fraction": _num(0, 1, strict_lo=True),
        "max_gpus": _int(1, MAX_GPUS),
    }),
    "llm": (LlmPool, {
        "model": _str,
        "config": _config_table,
        "kv_dtype": _choice("auto", "fp32", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2",
                            "int8", "int4"),
        "weight_dtype": _weight_dtype,
        "context_tokens": _int(1, 10_000_000),
        "gpu": _opt(_str),
        "num_gpus": _int(1, MAX_GPUS),
        "tp": _int(0, 1024),
        "gpu_memory_utilization": _num(0, 1, strict_lo=True),
        "block_size": _int(1, 1024),
        "max_num_batched_tokens": _opt(_int(1, 10_000_000)),
        "max_num_seqs": _opt(_int(1, 1_000_000)),
        "gpu_memory_gb": _opt(_num(0, 1e6, strict_lo=True)),
        "weights_gb": _opt(_num(0, 1e9)),
        "request_rate": _rate,
        "max_concurrency": _int(0, 100_000),
        "burstiness": _num(0.01, 100),
        "num_requests": _int(1, 1_000_000),
        "arrival": _choice("poisson", "constant"),
        "prompt_tokens": _num(1, 10_000_000),
        "prompt_tokens_p99": _opt(_num(1, 10_000_000)),
        "output_tokens": _num(1, 10_000_000),
        "output_tokens_p99": _opt(_num(1, 10_000_000)),
        "lengths_csv": _opt(_str),
        "replicas": _int(1, 10_000),
        "enable_chunked_prefill": _bool,
        "enable_prefix_caching": _bool,
        "prefix_tokens": _int(0, 10_000_000),
        "prefix_hit_share": _num(0, 1),
        "ttft_p99_slo_ms": _num(0, 3_600_000, strict_lo=True),
        "tpot_p99_slo_ms": _num(0, 3_600_000, strict_lo=True),
        "step_profile_csv": _opt(_str),
        "num_gpu_blocks_override": _opt(_int(1, 100_000_000)),
        "scheduler": _choice("v1", "prefill-first"),
        "compute_efficiency": _opt(_num(0.001, 1)),
        "memory_efficiency": _opt(_num(0.001, 1)),
        "overhead_ms": _opt(_num(0, 1000)),
        "prefill_first_overhead_ms": _opt(_num(0, 1000)),
        "per_seq_ms": _opt(_num(0, 100)),
        "overlap": _opt(_num(1, 1000)),
        "allreduce_latency_us": _opt(_num(0, 100_000)),
        "frontend_ms": _opt(_num(0, 60_000)),
    }),
}

# [lab.drift]: the lab's "Features and drift" view (the feature shown and the what-if applied
# to its sample), so Export/Load TOML keep it. Not part of the deployment: every command but
# the lab checks it and goes on without it. Ranges are the page's sliders'.
LAB_DRIFT: dict[str, Callable[[str, Any], Any]] = {
    "feature": _str,
    "mean_shift": _num(-2, 2),
    "spread": _num(0.25, 3),
    "missing": _num(0, 0.5),
    "new_category": _num(0, 0.5),
    "rows": _int(50, 20_000),
}
# [lab.paging]: the paged-vs-contiguous replay's settings (`servelab kv paging`'s, in the
# lab's bounds; max_len 0 is the context length).
LAB_PAGING_MAX_REQUESTS = 5000
LAB_PAGING_MAX_LEN = 131_072
LAB_PAGING: dict[str, Callable[[str, Any], Any]] = {
    "requests": _int(1, LAB_PAGING_MAX_REQUESTS),
    "max_len": _int(0, LAB_PAGING_MAX_LEN),
    "prefix_tokens": _int(0, LAB_PAGING_MAX_LEN - 1),
}
_LAB = {"drift": LAB_DRIFT, "paging": LAB_PAGING}
_TOP = {"name", "description", "lab", *_SECTIONS}


def lab_view(raw: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The scenario file's [lab] tables, checked: {"drift": {key: value}} (empty if none)."""
    lab = raw.get("lab", {})
    if not isinstance(lab, Mapping):
        raise invalid("[lab]", lab, "a table of lab views, e.g. [lab.drift]",
                      "write [lab.drift] on its own line, keys below")
    out: dict[str, dict[str, Any]] = {}
    for view, table in lab.items():
        if view not in _LAB:
            raise unknown_key("[lab]", view, _LAB)
        if not isinstance(table, Mapping):
            raise invalid(f"[lab.{view}]", table, "a table of keys",
                          f"write [lab.{view}] on its own line, keys below")
        rules = _LAB[view]
        out[view] = {}
        for key, v in table.items():
            if key not in rules:
                raise unknown_key(f"[lab.{view}]", key, rules)
            out[view][key] = rules[key](f"[lab.{view}] {key}", v)
    return out

# Which [model] keys each service-time kind takes (beyond kind/name/variability/cv).
_MODEL_KEYS = {
    ServiceKind.CONSTANT: {"latency_ms", "flops_per_row"},
    ServiceKind.AFFINE: {"base_ms", "per_row_ms", "per_request_ms", "flops_per_row"},
    ServiceKind.PROFILE: {"points", "csv", "perf_analyzer_csv", "per_request_ms", "flops_per_row"},
    ServiceKind.ROOFLINE: {"flops_per_row", "bytes_per_row", "bytes_per_batch", "overhead_us",
                           "efficiency", "precision"},
}
_MODEL_COMMON = {"kind", "name", "variability", "cv", "multipliers"}


def _section(name: str, raw: Any) -> Any:
    cls, rules = _SECTIONS[name]
    if not isinstance(raw, Mapping):
        raise invalid(f"[{name}]", raw, "a table of keys",
                      f"write [{name}] on its own line, keys below")
    values: dict[str, Any] = {}
    for key, v in raw.items():
        if key not in rules:
            raise unknown_key(f"[{name}]", key, rules)
        values[key] = rules[key](f"[{name}] {key}", v)
    if name == "llm" and values.get("gpu"):
        values["gpu"] = resolve_gpu_name(values["gpu"], "[llm] gpu")
    if name == "llm" and values.get("tp") and values.get("num_gpus", 1) % values["tp"]:
        n, tp = values.get("num_gpus", 1), values["tp"]
        raise invalid("[llm] num_gpus", n, f"a multiple of [llm] tp = {tp} (each replica "
                      f"spans tp GPUs)", f"set [llm] num_gpus to {tp * max(1, n // tp)}, or "
                      "[llm] tp to a divisor of it (0: all GPUs in one replica)")
    if name == "hardware":
        overrides = tuple((f, values.pop(f)) for f in FIGURES if f in values)
        if "gpu" in values:
            values["gpu"] = resolve_gpu_name(values["gpu"])
        return cls(overrides=overrides, **values)
    return cls(**values)


def _check_model(m: ServiceModelSpec, given: set[str]) -> ServiceModelSpec:
    allowed = _MODEL_KEYS[m.kind] | _MODEL_COMMON
    for key in sorted(given - allowed):
        owners = [k.value for k, keys in _MODEL_KEYS.items() if key in keys]
        raise invalid(
            f"[model] {key}", getattr(m, key), f"only keys of kind {m.kind.value!r} "
            f"({', '.join(sorted(allowed))})", f"remove {key} or set kind to {' or '.join(owners)}",
        )
    if m.kind is ServiceKind.CONSTANT and m.latency_ms is None:
        raise invalid("[model] latency_ms", None, "a number > 0 for kind 'constant'",
                      "set latency_ms to the time of one batch")
    if m.kind is ServiceKind.AFFINE and (m.base_ms is None or m.per_row_ms is None):
        raise invalid("[model] base_ms/per_row_ms", None, "both set for kind 'affine'",
                      "set base_ms (per batch) and per_row_ms (per row)")
    if m.kind is ServiceKind.AFFINE and m.base_ms == 0 and m.per_row_ms == 0:
        raise invalid("[model] base_ms/per_row_ms", 0, "a batch that takes some time",
                      "set base_ms or per_row_ms above 0")
    if m.kind is ServiceKind.PROFILE:
        n_sources = sum(bool(x) for x in (m.points, m.csv, m.perf_analyzer_csv))
        if n_sources != 1:
            raise invalid("[model] points/csv/perf_analyzer_csv", n_sources,
                          "exactly one source of measured latencies for kind 'profile'",
                          "give points = [[batch, ms], ...], or csv = FILE, or perf_analyzer_csv")
    if m.kind is ServiceKind.ROOFLINE and (
        m.flops_per_row is None and m.bytes_per_row is None and m.bytes_per_batch is None
    ):
        raise invalid("[model] flops_per_row/bytes_per_row/bytes_per_batch", None,
                      "at least one of them for kind 'roofline'",
                      "set flops_per_row (e.g. 2 x parameters x tokens) and bytes_per_batch")
    if (m.variability is Variability.EMPIRICAL) != bool(m.multipliers):
        raise invalid("[model] variability/multipliers", m.variability.value,
                      "multipliers exactly when variability = 'empirical'",
                      "give measured multipliers = [...] with variability = 'empirical', "
                      "or neither")
    if m.multipliers and sum(m.multipliers) <= 0:
        raise invalid("[model] multipliers", "all zero", "some multiplier > 0",
                      "give measured batch times divided by the model's mean")
    if m.variability is Variability.GAMMA and m.cv < MIN_CV:
        raise invalid("[model] cv", m.cv, f"a number >= {MIN_CV:g} with variability = 'gamma'",
                      "set cv, e.g. 0.2 for a 20% spread")
    return m


def _check(s: Scenario) -> Scenario:
    b = s.batching
    too_big = [p for p in b.preferred_batch_size if p > b.max_batch_size]
    if too_big:
        raise invalid("[batching] preferred_batch_size", list(b.preferred_batch_size),
                      f"sizes no larger than max_batch_size ({b.max_batch_size}) as Triton needs",
                      f"drop {too_big} or raise max_batch_size")
    w = s.workload
    if w.arrival is Arrival.TRACE and bool(w.trace_csv) == bool(w.arrivals_s):
        raise invalid("[workload] trace_csv/arrivals_s", None,
                      "exactly one of them with arrival = 'trace'",
                      "set trace_csv = \"arrivals.csv\" (one time in seconds per row), "
                      "or arrivals_s = [...] inline")
    if (w.trace_csv or w.arrivals_s) and w.arrival is not Arrival.TRACE:
        raise invalid("[workload] arrival", w.arrival.value,
                      "'trace' when trace_csv or arrivals_s is set",
                      "set arrival = \"trace\" or remove trace_csv/arrivals_s")
    if w.arrival is not Arrival.TRACE and w.num_requests / w.qps > MAX_SPAN_S:
        raise invalid("[workload] qps", w.qps,
                      f"a rate at which {w.num_requests:,} requests span at most "
                      f"{MAX_SPAN_S:g} s of simulated time (they would span "
                      f"{w.num_requests / w.qps:.3g} s)",
                      f"raise qps to at least {w.num_requests / MAX_SPAN_S:.3g} "
                      "or lower num_requests")

    lat = s.latency
    for name, med, p99 in (("feature_fetch", lat.feature_fetch_ms, lat.feature_fetch_p99_ms),
                           ("network", lat.network_ms, lat.network_p99_ms)):
        if p99 is not None and (med <= 0 or p99 < med):
            raise invalid(f"[latency] {name}_p99_ms", p99,
                          f"a p99 >= the median {name}_ms ({med:g}) and a median > 0",
                          f"raise {name}_p99_ms or remove it for a constant {name}")
    return s


def scenario_from_dict(raw: Mapping[str, Any], base_dir: str | Path | None = ".",
                       sandbox: bool = False) -> Scenario:
    """Validate a parsed TOML document (or equivalent dict) into a Scenario."""
    if not isinstance(raw, Mapping):
        raise invalid("scenario", raw, "a table of sections", "start from `servelab plan --help`")
    parts: dict[str, Any] = {}
    for key, v in raw.items():
        if key not in _TOP:
            raise unknown_key("scenario", key, _TOP)
        if key in ("name", "description"):
            parts[key] = _str(key, v)
        elif key == "lab":
            lab_view(raw)  # checked; the lab reads it, the scenario does not hold it
        else:
            parts[key] = _section(key, v)
    if "model" in parts:
        parts["model"] = _check_model(parts["model"], set(raw["model"]))
    return _check(Scenario(base_dir=None if base_dir is None else str(base_dir),
                           sandbox=sandbox, **parts))


def seed_path() -> Path:
    return Path(str(resources.files("servelab.data").joinpath("seed.toml")))


def load_scenario(source: str | Path) -> Scenario:
    """Load a scenario from a TOML file, or the built-in one named 'seed'."""
    path = seed_path() if str(source) == "seed" else Path(source)
    raw = parse_toml(read_text(path, "--scenario", max_bytes=MAX_CONFIG_BYTES,
                               what="scenario TOML file (or 'seed')"), cut(str(path)))
    try:
        return scenario_from_dict(raw, base_dir=path.parent)
    except InputError as exc:
        raise InputError(f"{cut(str(path))}: {exc}") from None


def apply_overrides(raw: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    """Set flat ``section.key`` values in a raw scenario dict (None values are skipped)."""
    for dotted, value in overrides.items():
        if value is None:
            continue
        section, _, key = dotted.partition(".")
        if not key:
            raw[section] = value
            continue
        if section not in _SECTIONS:
            raise unknown_key("override", section, _SECTIONS)
        table = raw.setdefault(section, {})
        if not isinstance(table, dict):
            raise invalid(f"[{section}]", table, "a table of keys",
                          f"set {section}.{cut(key, 40)} without also setting {section} itself")
        table[key] = value


def _plain(v: Any) -> Any:
    if isinstance(v, Enum):
        return v.value
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return v


def scenario_to_dict(s: Scenario) -> dict[str, Any]:
    """The scenario as the TOML document that would load back into it (None keys omitted)."""
    out: dict[str, Any] = {"name": s.name}
    if s.description:
        out["description"] = s.description
    for sec in _SECTIONS:
        obj = getattr(s, sec)
        if obj is None:
            continue
        d: dict[str, Any] = {}
        for f in fields(obj):
            v = getattr(obj, f.name)
            if f.name == "overrides":
                d.update(dict(v))
            elif f.name == "config":
                if v is not None:
                    d[f.name] = json.loads(v)
            elif f.name == "perf_analyzer_csv":
                if v:
                    d[f.name] = {str(b): p for b, p in v}
            elif v is None or (isinstance(v, tuple) and not v and f.name != "preferred_batch_size"):
                continue
            else:
                d[f.name] = _plain(v)
        if sec == "model":
            keep = _MODEL_KEYS[obj.kind] | _MODEL_COMMON
            d = {k: v for k, v in d.items() if k in keep}
        out[sec] = d
    return out


def flatten(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A scenario document as flat ``section.key`` values (the lab's page state)."""
    out: dict[str, Any] = {}
    for key, v in raw.items():
        if isinstance(v, Mapping):
            for k, x in v.items():
                out[f"{key}.{k}"] = x
        else:
            out[key] = v
    return out


def scenario_from_flat(flat: Mapping[str, Any], base_dir: str | Path | None = ".",
                       sandbox: bool = False) -> Scenario:
    """A scenario from flat ``section.key`` values, as a page sends them.

    [model] keys that the chosen kind does not take are dropped rather than
    refused, since a page keeps every field while the user switches kinds.
    """
    raw: dict[str, Any] = {}
    apply_overrides(raw, flat)
    model = raw.get("model")
    if isinstance(model, dict):
        kind = _enum(ServiceKind)("[model] kind", model.get("kind", ServiceKind.AFFINE.value))
        keep = _MODEL_KEYS[kind] | _MODEL_COMMON
        raw["model"] = {k: v for k, v in model.items() if k in keep}
    return scenario_from_dict(raw, base_dir=base_dir, sandbox=sandbox)


def scenario_to_toml(s: Scenario) -> str:
    return tomli_w.dumps(scenario_to_dict(s))
