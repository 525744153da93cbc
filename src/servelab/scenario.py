"""A scenario: one serving setup, described once, validated once at the edge.

A scenario is read from TOML (or built in Python), overridden by CLI flags or
lab sliders as a flat ``{"section.key": value}`` mapping, and validated into
frozen dataclasses. Keys use the names users know: Triton's for batching
(``max_batch_size``, ``max_queue_delay_microseconds``, ...).
"""

from __future__ import annotations

import functools
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
MAX_STALLS_PER_S = 1_000.0  # how often a server may stall, per second
MAX_STALL_MS = 60_000.0  # one stall's length
MAX_FRONTEND_WORKERS = 1024  # a front end's threads (Triton's HTTP default is 8)
MAX_SCHEDULER_STEPS = 1024  # vLLM 0.6's --num-scheduler-steps (8-16 in its docs)
MAX_PIPELINE_STAGES = 64  # vLLM's --pipeline-parallel-size (at most the model's layers)
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
    """When a batch stops taking arrivals while every instance is busy: the server whose
    rule the simulator follows. Only Triton's today. ("absorb": a batch that takes
    arrivals until an instance starts it, was removed in 0.2.0: it was 40-55% short on
    a real Triton's queue, and no server measured here batches that way.)"""

    TRITON = "triton"  # Triton's batcher thread: payloads close and wait (see triton_engine)


class Variability(Enum):
    """How one batch's execution time varies around the model's mean."""

    DETERMINISTIC = "deterministic"
    EXPONENTIAL = "exponential"
    GAMMA = "gamma"
    EMPIRICAL = "empirical"  # measured multipliers, resampled


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


def _closing(name: str, v: Any) -> Closing:
    if isinstance(v, str) and v.lower() == "absorb":
        raise invalid(name, v, "triton (the absorb rule was removed in 0.2.0)",
                      "remove the key: Triton's rule is the only one")
    return _enum(Closing)(name, v)  # type: ignore[no-any-return]


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
MAX_MULTIPLIER = 1000.0  # [model] multipliers: a batch's time over the model's mean
MAX_MULTIPLIER_BLOCK = 100_000  # [model] multiplier_block: consecutive multipliers a draw


def _samples(lo: float, hi: float, what: str, most: int = MAX_SAMPLES
             ) -> Callable[[str, Any], tuple[float, ...]]:
    def conv(name: str, v: Any) -> tuple[float, ...]:
        expected = f"a list of at most {most:,} {what} from {lo:g} to {hi:g}"
        if not isinstance(v, list | tuple) or len(v) > most:
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


# ---------------------------------------------------------------------------
# Each field is declared once, on its section's dataclass: default, rule (type and range),
# unit, help, CLI flags and the lab's control. The TOML key is "[section] name"; the rules
# table, every command's flags (cli.flag) and the lab's sidebar (/api/meta "controls")
# are built from these declarations (FIELDS).


@dataclass(frozen=True, slots=True)
class Control:
    """A field's control in the lab's sidebar: a slider from `lo` to `hi` by `step` with a
    typed box, a choice (`options`, or a list the lab's meta names in `options_from`), a
    typed number (`number`) or a typed list (`list`); `kinds` limits it to those model
    kinds; `numeric` sends a choice as a number."""

    group: str
    label: str
    lo: float | None = None
    hi: float | None = None
    step: float | None = None
    options: tuple[str, ...] = ()
    options_from: str = ""
    number: bool = False
    list: bool = False
    numeric: bool = False
    kinds: tuple[str, ...] = ()

    def to_dict(self, key: str) -> dict[str, Any]:
        d: dict[str, Any] = {"key": key, "label": self.label}
        if self.lo is not None:
            d.update(min=self.lo, max=self.hi, step=self.step)
        for name in ("options", "kinds"):
            if getattr(self, name):
                d[name] = list(getattr(self, name))
        if self.options_from:
            d["optionsFrom"] = self.options_from
        for name in ("number", "list", "numeric"):
            if getattr(self, name):
                d[name] = True
        return d


def spec(default: Any, rule: Callable[[str, Any], Any], help: str, *, unit: str = "",
         flags: tuple[str, ...] = (), control: Control | None = None) -> Any:
    """A scenario field's one declaration (see FIELDS)."""
    meta = {"rule": rule, "help": help, "unit": unit, "flags": flags, "control": control}
    if isinstance(default, tuple | list):
        return field(default=tuple(default), metadata=meta)
    return field(default=default, metadata=meta)


_TRAFFIC, _BATCHING, _HARDWARE = "Traffic", "Batching (Triton)", "Hardware"
_MODEL, _OUTSIDE, _POOL = "Model (GPU time per batch)", "Latency outside the GPU", \
    "LLM KV-cache pool (vLLM)"
_ROOF = ("roofline",)
_SERVING = "LLM serving"  # the lab's LLM serving section, not its sidebar


@dataclass(frozen=True, slots=True)
class Workload:
    qps: float = spec(1000.0, _num(0, MAX_QPS, strict_lo=True), "Offered requests per second.",
                      unit="requests/s", flags=("--qps",),
                      control=Control(_TRAFFIC, "QPS", 100, 50000, 100))
    arrival: Arrival = spec(Arrival.POISSON, _enum(Arrival),
                            "poisson, constant, gamma (with cv) or trace (with trace_csv).",
                            control=Control(_TRAFFIC, "Arrivals",
                                            options=("poisson", "constant", "gamma")))
    cv: float = spec(1.0, _num(MIN_CV, MAX_CV),
                     "Coefficient of variation of inter-arrival gaps (gamma only).")
    trace_csv: str | None = spec(None, _opt(_str), "A CSV of arrival times (trace only), "
                                 "relative to the scenario file.", unit="path")
    arrivals_s: tuple[float, ...] = spec((), _seconds_list, "The trace inline (trace only).",
                                         unit="s")
    num_requests: int = spec(100_000, _int(1, MAX_REQUESTS), "Requests to simulate.",
                             flags=("--num-requests",),
                             control=Control(_TRAFFIC, "Simulated requests", 10000, 1000000,
                                             10000))
    seed: int = spec(0, _int(0, 2**63 - 1), "Random seed.", flags=("--seed",))


@dataclass(frozen=True, slots=True)
class BatchingPolicy:
    """Triton's dynamic_batching settings, by Triton's names.

    ``max_queue_size`` and ``default_timeout_microseconds`` use 0 for "none",
    as Triton does. With no ``preferred_batch_size`` Triton behaves as if it
    were ``[max_batch_size]`` (its model-config normaliser adds it).
    """

    max_batch_size: int = spec(32, _int(1, MAX_BATCH), "Triton max_batch_size.", unit="rows",
                               flags=("--max-batch-size",),
                               control=Control(_BATCHING, "max_batch_size", 1, 256, 1))
    max_queue_delay_microseconds: int = spec(
        0, _int(0, 60_000_000), "Triton max_queue_delay_microseconds.", unit="µs",
        flags=("--max-queue-delay-us",),
        control=Control(_BATCHING, "Batch window (max_queue_delay, µs)", 0, 20000, 100))
    preferred_batch_size: tuple[int, ...] = spec(
        (), _int_list, "Triton preferred_batch_size (repeat for several).", unit="rows",
        flags=("--preferred-batch-size",),
        control=Control(_BATCHING, "preferred_batch_size (e.g. 4,8)", list=True))
    max_queue_size: int = spec(0, _int(0, 2**31 - 1), "Triton max_queue_size (0: unbounded).",
                               unit="requests", flags=("--max-queue-size",),
                               control=Control(_BATCHING, "max_queue_size (0: unbounded)", 0,
                                               5000, 10))
    default_timeout_microseconds: int = spec(
        0, _int(0, MAX_TIMEOUT_US), "Triton default_timeout_microseconds (0: none).",
        unit="µs", flags=("--timeout-us",),
        control=Control(_BATCHING, "Timeout (µs, 0: none)", 0, 100000, 500))
    instances_per_gpu: int = spec(1, _int(1, 64), "Model instances per GPU.",
                                  flags=("--instances-per-gpu",),
                                  control=Control(_BATCHING, "Instances per GPU", 1, 8, 1))
    closing: Closing = spec(Closing.TRITON, _closing,
                            "triton: Triton's batcher thread (the only rule).")
    # Share of completions at which Triton's woken batcher thread looks at the queue
    # before the freed instance takes the next waiting payload (`servelab replay-trace`
    # measures it from a Triton trace); 0 is the order the source implies.
    batcher_first: float = spec(0.0, _num(0, 1), "Share of completions at which Triton's "
                                "batcher thread looks first.")
    # Share of completions whose wake-up Triton 2.51's batcher thread misses when it runs
    # without prefetching (a queue policy set): the instance idles until an arrival wakes
    # the thread or its 500 ms wait ends (triton_engine, rule 6). 0: off, the default.
    lost_wakeup: float = spec(0.0, _num(0, 1), "Share of completions whose wake-up Triton "
                              "2.51's batcher thread misses.")

    @property
    def effective_preferred(self) -> tuple[int, ...]:
        return self.preferred_batch_size or (self.max_batch_size,)


@dataclass(frozen=True, slots=True)
class Hardware:
    gpu: str = spec("H100-SXM", _str, "GPU from the catalog, e.g. H100-SXM.",
                    flags=("--gpu",), control=Control(_HARDWARE, "GPU", options_from="gpus"))
    num_gpus: int = spec(1, _int(1, MAX_GPUS), "GPUs serving the model.", flags=("--num-gpus",),
                         control=Control(_HARDWARE, "GPUs", 1, 64, 1))
    price_per_gpu_hour: float | None = spec(None, _opt(_num(0, 1e6)), "$ per GPU-hour "
                                            "(default: the catalog's).", unit="$/h",
                                            flags=("--price",))
    # catalog figures replaced by the user (each [hardware] key of catalog.FIGURES)
    overrides: tuple[tuple[str, float], ...] = ()

    def spec(self) -> GpuSpec:
        over = dict(self.overrides)
        if self.price_per_gpu_hour is not None:
            over["price_per_gpu_hour_usd"] = self.price_per_gpu_hour
        return get_gpu(self.gpu, over)


@dataclass(frozen=True, slots=True)
class ServiceModelSpec:
    """What one batch costs on one instance. Which fields apply depends on ``kind``."""

    kind: ServiceKind = spec(ServiceKind.AFFINE, _enum(ServiceKind),
                             "constant, affine, profile or roofline.",
                             control=Control(_MODEL, "Service-time model",
                                             options=("roofline", "affine", "constant")))
    name: str = spec("", _str, "A label.")
    # constant
    latency_ms: float | None = spec(None, _opt(_num(0, MAX_MS, strict_lo=True)),
                                    "constant: every batch.", unit="ms",
                                    control=Control(_MODEL, "Batch time (ms)", 0.05, 50, 0.05,
                                                    kinds=("constant",)))
    # affine
    base_ms: float | None = spec(1.0, _opt(_num(0, MAX_MS)), "affine: per batch.", unit="ms",
                                 control=Control(_MODEL, "Per batch (ms)", 0, 20, 0.05,
                                                 kinds=("affine",)))
    per_row_ms: float | None = spec(0.1, _opt(_num(0, MAX_MS)), "affine: per row.", unit="ms",
                                    control=Control(_MODEL, "Per row (ms)", 0, 5, 0.01,
                                                    kinds=("affine",)))
    # profile
    points: tuple[tuple[int, float], ...] = spec((), _points, "profile: [[batch, ms], ...].")
    csv: str | None = spec(None, _opt(_str), "profile: a CSV of batch_size, latency_ms.",
                           unit="path")
    perf_analyzer_csv: tuple[tuple[int, str], ...] = spec(
        (), _pa_files, "profile: { \"1\" = \"b1.csv\" }, perf_analyzer -b N CSVs.")
    # roofline
    flops_per_row: float | None = spec(None, _opt(_num(0, 1e21)), "roofline: FLOPs per row.",
                                       unit="FLOP", control=Control(_MODEL, "FLOPs per row",
                                                                    number=True, kinds=_ROOF))
    bytes_per_row: float | None = spec(None, _opt(_num(0, 1e18)), "roofline: bytes per row.",
                                       unit="B", control=Control(_MODEL, "Bytes per row",
                                                                 number=True, kinds=_ROOF))
    bytes_per_batch: float | None = spec(None, _opt(_num(0, 1e18)),
                                         "roofline: bytes per batch (the weights).", unit="B",
                                         control=Control(_MODEL, "Bytes per batch (weights)",
                                                         number=True, kinds=_ROOF))
    overhead_us: float = spec(0.0, _num(0, MAX_MS * 1e3), "roofline: fixed time per batch.",
                              unit="µs", control=Control(_MODEL, "Overhead per batch (µs)", 0,
                                                         3000, 10, kinds=_ROOF))
    efficiency: float = spec(0.6, _num(0, 1, strict_lo=True),
                             "roofline: share of peak FLOPs and bandwidth reached.",
                             control=Control(_MODEL, "Efficiency", 0.05, 1, 0.05, kinds=_ROOF))
    precision: str = spec("bf16", _choice("bf16", "fp8"), "roofline: bf16 or fp8 peak.",
                          control=Control(_MODEL, "Precision", options=("bf16", "fp8"),
                                          kinds=_ROOF))
    # affine and profile: the cost of each request in a batch beyond its rows (one row per
    # request here, so a batch of b requests takes curve(b) + per_request_ms x b)
    per_request_ms: float = spec(0.0, _num(0, MAX_MS), "Cost of each request in a batch "
                                 "beyond its rows.", unit="ms")
    # all kinds
    variability: Variability = spec(Variability.DETERMINISTIC, _enum(Variability),
                                    "Per-batch spread: deterministic, exponential, gamma, "
                                    "empirical.")
    cv: float = spec(0.0, _num(0, MAX_CV), "gamma: the spread's coefficient of variation.")
    multipliers: tuple[float, ...] = spec(
        (), _samples(0.0, MAX_MULTIPLIER, "multipliers (batch time / mean)"),
        "empirical: measured batch time / the model's mean")
    multiplier_block: int = spec(
        1, _int(1, MAX_MULTIPLIER_BLOCK),
        "empirical: the multipliers drawn in runs of this many consecutive ones, in their "
        "measured order (a block bootstrap, which keeps how a server's speed drifts from "
        "batch to batch); 1: each drawn on its own.")


@dataclass(frozen=True, slots=True)
class Latency:
    """Latency outside the GPU, and the end-to-end objective.

    A component given by its median alone is constant; with a p99 as well it
    is log-normal through those two points; with measured samples it is those
    samples, resampled (so measured stalls reach the tail).
    """

    feature_fetch_ms: float = spec(0.0, _num(0, MAX_MS), "Feature fetch, median.", unit="ms",
                                   control=Control(_OUTSIDE, "Feature fetch (ms)", 0, 50, 0.1))
    feature_fetch_p99_ms: float | None = spec(None, _opt(_num(0, MAX_MS)),
                                              "Feature fetch p99 (log-normal).", unit="ms")
    network_ms: float = spec(0.0, _num(0, MAX_MS), "Network, median.", unit="ms",
                             control=Control(_OUTSIDE, "Network (ms)", 0, 50, 0.1))
    network_p99_ms: float | None = spec(None, _opt(_num(0, MAX_MS)),
                                        "Network p99 (log-normal).", unit="ms")
    p99_slo_ms: float = spec(100.0, _num(0, MAX_MS, strict_lo=True),
                             "p99 end-to-end SLO in ms.", unit="ms", flags=("--slo-ms",),
                             control=Control(_OUTSIDE, "p99 SLO (ms)", 1, 500, 1))
    feature_fetch_samples_ms: tuple[float, ...] = spec(
        (), _samples(0.0, MAX_MS, "latencies in ms"), "Measured feature fetches, resampled.",
        unit="ms")
    network_samples_ms: tuple[float, ...] = spec(
        (), _samples(0.0, MAX_MS, "latencies in ms"), "Measured network times, resampled.",
        unit="ms")
    # The server's front end (HTTP parsing, the answer) as a CPU station before the
    # batcher: requests wait there for one of its workers (first come first served, or
    # one event loop's turns), each taking frontend_cpu_ms. 0 workers or 0 ms: no
    # station, the time outside is a pure delay.
    frontend_workers: int = spec(
        0, _int(0, MAX_FRONTEND_WORKERS), "Front-end workers before the batcher (0: none; 1 "
        "for an interpreter-bound server such as servelab's gateway).",
        flags=("--frontend-workers",),
        control=Control(_OUTSIDE, "Front-end workers (0: none)", 0, 16, 1))
    frontend_cpu_ms: float = spec(
        0.0, _num(0, MAX_MS), "A request's CPU time in a front-end worker.", unit="ms",
        flags=("--frontend-cpu-ms",),
        control=Control(_OUTSIDE, "Front-end CPU per request (ms)", 0, 5, 0.01))
    frontend_event_loop: bool = spec(
        False, _bool, "The front end is one event loop (servelab's gateway, any asyncio "
        "server): each turn it takes every request waiting, and the batcher sees them "
        "together at the turn's end; needs frontend_workers = 1.",
        flags=("--frontend-event-loop/--no-frontend-event-loop",))
    # An event loop's own cost per turn (its poll and wake-up), beside each request's: a
    # turn of k requests takes frontend_turn_ms + k x frontend_cpu_ms. At low load a turn
    # holds one request; under load the turn's cost is shared by many.
    frontend_turn_ms: float = spec(
        0.0, _num(0, MAX_MS), "An event loop's cost per turn (its poll and wake-up), "
        "beside each request's; needs frontend_event_loop.", unit="ms",
        flags=("--frontend-turn-ms",))
    # An event loop also writes each answer: when a batch ends, its requests' answers are
    # work the loop takes in time order beside new requests, so a loop busy answering
    # hands the batcher more requests at once. A turn of k requests and m answers takes
    # frontend_turn_ms + k x frontend_cpu_ms + m x frontend_answer_ms.
    frontend_answer_ms: float = spec(
        0.0, _num(0, MAX_MS), "A request's CPU time in the event loop when its batch ends "
        "(its answer written); needs frontend_event_loop.", unit="ms",
        flags=("--frontend-answer-ms",))

    # The whole server pausing now and then (batching/stalls.py): its front end, batcher
    # and model stop together, so a stall both slows its batch and bunches the arrivals
    # that came during it. Starts are a Poisson process on the server's own clock.
    stalls_per_s: float = spec(
        0.0, _num(0, MAX_STALLS_PER_S), "How often the whole server stalls (a garbage "
        "collection, the OS taking its core), per second of its running time; 0: never.",
        unit="stalls/s", flags=("--stalls-per-s",),
        control=Control(_OUTSIDE, "Server stalls per second (0: none)", 0, 50, 0.5))
    stall_ms: float = spec(
        0.0, _num(0, MAX_STALL_MS), "A stall's length, when stall_samples_ms is empty.",
        unit="ms", flags=("--stall-ms",),
        control=Control(_OUTSIDE, "Stall length (ms)", 0, 100, 0.5))
    stall_samples_ms: tuple[float, ...] = spec(
        (), _samples(0.0, MAX_STALL_MS, "stall lengths in ms"), "Measured stall lengths, "
        "resampled (servelab validate reads them from the server's trace).", unit="ms")

    @property
    def stalls(self) -> bool:
        """Whether the server stalls (a rate and a length both set)."""
        return self.stalls_per_s > 0 and (bool(self.stall_samples_ms) or self.stall_ms > 0)

    @property
    def stall_lengths_ms(self) -> tuple[float, ...]:
        """The lengths a stall draws from."""
        return self.stall_samples_ms or (self.stall_ms,)

    @property
    def frontend(self) -> bool:
        """Whether requests pass a front-end station (workers and a cost both set)."""
        return self.frontend_workers > 0 and (self.frontend_cpu_ms > 0
                                              or self.frontend_answer_ms > 0)

    @property
    def frontend_ms(self) -> float:
        """A request's whole CPU time in the front end (its parse and its answer)."""
        return self.frontend_cpu_ms + self.frontend_answer_ms

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
    max_busy_fraction: float = spec(1.0, _num(0, 1, strict_lo=True), "The planner's busy "
                                    "ceiling.")
    max_gpus: int = spec(512, _int(1, MAX_GPUS), "The planner's search limit.")


_KV_DTYPES = _choice("auto", "fp32", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2", "int8",
                     "int4")
_TOKENS = _num(1, 10_000_000)


@dataclass(frozen=True, slots=True)
class LlmPool:
    """An LLM deployment's KV-cache pool, by vLLM's knobs.

    ``gpu`` defaults to [hardware] gpu; ``tp`` 0 means all ``num_gpus`` in one
    tensor-parallel group. ``gpu_memory_gb`` and ``weights_gb`` are the seed
    dashboard's simpler assumptions (all memory but the weights is KV), kept so
    its figures can be checked on their own terms.
    """

    model: str = spec("llama-3.1-8b", _str, "Catalog model or a config.json.",
                      flags=("--model",), control=Control(_POOL, "Model", options_from="models"))
    # a config.json inline (canonical JSON text), instead of model
    config: str | None = spec(None, _config_table, "A config.json's keys inline ([llm.config]).")
    kv_dtype: str = spec("auto", _KV_DTYPES, "auto, fp16, bf16, fp8, int8, int4.",
                         flags=("--kv-dtype", "--kv-cache-dtype"),
                         control=Control(_POOL, "KV dtype", options_from="kv_dtypes"))
    weight_dtype: str = spec("auto", _weight_dtype, "auto, bf16, fp16, fp8, int8, int4 (vLLM's "
                             "--quantization: AWQ and GPTQ are int4).",
                             flags=("--weight-dtype", "--quantization"),
                             control=Control(_POOL, "Weight dtype", options_from="weight_dtypes"))
    context_tokens: int = spec(4096, _int(1, 10_000_000), "Tokens per session.", unit="tokens",
                               flags=("--context", "--max-model-len"),
                               control=Control(_POOL, "Context (tokens)", 512, 131072, 512))
    gpu: str | None = spec(None, _opt(_str), "GPU from the catalog.", flags=("--gpu",))
    num_gpus: int = spec(1, _int(1, MAX_GPUS), "GPUs in the deployment.", flags=("--num-gpus",),
                         control=Control(_POOL, "GPUs", 1, 16, 1))
    tp: int = spec(0, _int(0, 1024), "Tensor-parallel size.",
                   flags=("--tp", "--tensor-parallel-size", "-tp"),
                   control=Control(_POOL, "Tensor parallel (0: all GPUs)", 0, 16, 1))
    pp: int = spec(1, _int(1, MAX_PIPELINE_STAGES), "Pipeline-parallel size: the layers in "
                   "this many stages, a replica tp x pp GPUs (vLLM V1's batch queue: as many "
                   "batches in flight).", flags=("--pp", "--pipeline-parallel-size", "-pp"),
                   control=Control(_POOL, "Pipeline parallel (stages)", 1, 8, 1))
    gpu_memory_utilization: float = spec(
        0.9, _num(0, 1, strict_lo=True), "vLLM's share of each GPU (0.9).",
        flags=("--gpu-memory-utilization",),
        control=Control(_POOL, "gpu_memory_utilization", 0.5, 0.98, 0.01))
    block_size: int = spec(16, _int(1, 1024), "Tokens per KV block.", unit="tokens",
                           flags=("--block-size",),
                           control=Control(_POOL, "Block size (tokens)",
                                           options=("8", "16", "32"), numeric=True))
    # None: vLLM V1's `vllm serve` default for the GPU (EngineArgs.get_batch_defaults):
    # 8,192 tokens and 1,024 sequences on a GPU of 70 GiB or more other than the A100,
    # else 2,048 and 256
    max_num_batched_tokens: int | None = spec(
        None, _opt(_int(1, 10_000_000)), "vLLM max_num_batched_tokens (the token budget of "
        "a step).", unit="tokens", flags=("--max-num-batched-tokens",),
        control=Control(_SERVING, "max_num_batched_tokens", 512, 32768, 512))
    max_num_seqs: int | None = spec(None, _opt(_int(1, 1_000_000)), "vLLM max_num_seqs.",
                                    flags=("--max-num-seqs",),
                                    control=Control(_SERVING, "max_num_seqs", 1, 2048, 1))
    gpu_memory_gb: float | None = spec(None, _opt(_num(0, 1e6, strict_lo=True)),
                                       "The seed dashboard's memory per GPU.", unit="GB")
    weights_gb: float | None = spec(None, _opt(_num(0, 1e9)), "The seed dashboard's weights.",
                                    unit="GB")
    # Serving (`servelab llm simulate|plan`): the workload, the scheduler's switches, SLOs.
    request_rate: float = spec(5.0, _rate, "Requests per second over all replicas ([llm] "
                               "request_rate, default 5).", unit="requests/s",
                               flags=("--rate", "--request-rate"),
                               control=Control(_SERVING, "Requests/s", 0.25, 100, 0.25))
    num_requests: int = spec(2000, _int(1, 1_000_000), "Requests to simulate ([llm] "
                             "num_requests, default 2000).",
                             flags=("--num-requests", "--num-prompts"))
    arrival: str = spec("poisson", _choice("poisson", "constant"), "poisson or constant ([llm] "
                        "arrival, default poisson).", flags=("--arrival",))
    max_concurrency: int = spec(
        0, _int(0, 100_000), "A closed loop: at most this many requests out at once, each "
        "sent when one finishes, as `vllm bench serve --max-concurrency` (with --rate inf: "
        "all ready at once). Default 0: open loop.", flags=("--max-concurrency",))
    burstiness: float = spec(1.0, _num(0.01, 100), "vllm bench serve's --burstiness: "
                             "gamma-shaped gaps, 1 is Poisson, lower is burstier ([llm] "
                             "burstiness).", flags=("--burstiness",))
    prompt_tokens: float = spec(512.0, _TOKENS, "Prompt length, mean tokens ([llm] "
                                "prompt_tokens, default 512).", unit="tokens",
                                flags=("--prompt-tokens",),
                                control=Control(_SERVING, "Prompt tokens", 16, 8192, 16))
    prompt_tokens_p99: float | None = spec(None, _opt(_TOKENS), "Prompt p99 (log-normal "
                                           "through mean and p99; default: fixed).",
                                           unit="tokens", flags=("--prompt-tokens-p99",))
    output_tokens: float = spec(256.0, _TOKENS, "Output length, mean tokens ([llm] "
                                "output_tokens, default 256).", unit="tokens",
                                flags=("--output-tokens",),
                                control=Control(_SERVING, "Output tokens", 16, 2048, 16))
    output_tokens_p99: float | None = spec(None, _opt(_TOKENS), "Output p99 (log-normal; "
                                           "default: fixed).", unit="tokens",
                                           flags=("--output-tokens-p99",))
    lengths_csv: str | None = spec(
        None, _opt(_str), "A CSV of prompt_tokens,output_tokens, one row per request (as `kv "
        "paging` reads), instead of --prompt-tokens/--output-tokens ([llm] lengths_csv).",
        unit="path", flags=("--lengths",))
    replicas: int = spec(1, _int(1, 10_000), "Replicas, each of --tp GPUs ([llm] replicas, "
                         "default 1).", flags=("--replicas",))
    enable_chunked_prefill: bool = spec(
        True, _bool, "vLLM enable_chunked_prefill ([llm] enable_chunked_prefill, on in v1).",
        flags=("--chunked-prefill/--no-chunked-prefill",
               "--enable-chunked-prefill/--no-enable-chunked-prefill"))
    # vLLM V1's default (with no shared prefix it does nothing)
    enable_prefix_caching: bool = spec(
        True, _bool, "vLLM enable_prefix_caching, with --prefix-tokens shared.",
        flags=("--prefix-caching/--no-prefix-caching",
               "--enable-prefix-caching/--no-enable-prefix-caching"))
    prefix_tokens: int = spec(0, _int(0, 10_000_000), "Tokens of the shared prefix ([llm] "
                              "prefix_tokens).", unit="tokens", flags=("--prefix-tokens",))
    prefix_hit_share: float = spec(0.0, _num(0, 1), "Share of requests that start with the "
                                   "shared prefix.", flags=("--prefix-hit-share",))
    ttft_p99_slo_ms: float = spec(1000.0, _num(0, 3_600_000, strict_lo=True),
                                  "SLO: p99 time to first token, ms ([llm] ttft_p99_slo_ms, "
                                  "default 1000).", unit="ms", flags=("--ttft-p99-ms",))
    tpot_p99_slo_ms: float = spec(50.0, _num(0, 3_600_000, strict_lo=True),
                                  "SLO: p99 time per output token, ms ([llm] tpot_p99_slo_ms, "
                                  "default 50).", unit="ms", flags=("--tpot-p99-ms",))
    step_profile_csv: str | None = spec(
        None, _opt(_str), "A measured step profile instead of the roofline: a CSV of "
        "prefill_tokens,decode_seqs,kv_tokens_read,step_ms (one tensor-parallel group).",
        unit="path", flags=("--step-profile",))
    after_prefill_ms: tuple[float, ...] = spec(
        (), _samples(0, 60_000, "ms", most=64), "With step_profile_csv and the "
        "llama.cpp scheduler: ms more on the 1st, 2nd, ... step of decodes alone after a "
        "step with prompt tokens (as `llm validate` measured them).", unit="ms")
    num_gpu_blocks_override: int | None = spec(
        None, _opt(_int(1, 100_000_000)), "KV blocks per replica as given, not sized from "
        "memory (vLLM's flag; [llm] num_gpu_blocks_override).", unit="blocks",
        flags=("--num-gpu-blocks-override",))
    max_model_len: int = spec(
        0, _int(0, 10_000_000), "vLLM's --max-model-len for `llm simulate` and `llm plan`: "
        "a request whose prompt and output together pass it is refused before the engine "
        "(vLLM's server answers 400), and a KV pool that cannot hold one such request is "
        "an error, as at vLLM's start-up; 0: the model's own context, unchecked (vLLM's "
        "default). `servelab kv` reads --max-model-len as --context.", unit="tokens",
        flags=("--max-model-len",))
    num_scheduler_steps: int = spec(
        1, _int(1, MAX_SCHEDULER_STEPS), "vLLM 0.6's --num-scheduler-steps, with scheduler "
        "\"prefill-first\": decodes run in groups of this many steps, prompts are "
        "admitted and tokens sent only between groups (1: none; V1 has none).",
        unit="steps", flags=("--num-scheduler-steps",))
    # The engine's step loop: "v1" (vLLM V1: decodes and prompt chunks in one step),
    # "prefill-first" (vLLM V0 without chunked prefill: prompts run alone), "sglang"
    # (prompts alone, SGLang 0.3's admission and retraction) or "llama.cpp" (its server's
    # slots and ubatches, llm/llama_cpp.py)
    scheduler: str = spec("v1", _choice("v1", "prefill-first", "sglang", "llama.cpp"),
                          "The engine's step loop: v1 (vLLM V1, mixed steps), prefill-first "
                          "(vLLM V0 without chunked prefill), sglang (SGLang 0.3: prompts "
                          "alone, admitted while the KV cache holds them, their max_tokens "
                          "and the running requests' remaining max_tokens x "
                          "new_token_ratio; a full cache retracts requests) or llama.cpp "
                          "(its server: max_num_seqs slots of context_tokens each, n_batch "
                          "max_num_batched_tokens, ubatches of 512) ([llm] scheduler, "
                          "default v1).",
                          flags=("--scheduler",))
    # The roofline's constants (None: the defaults fitted to published measurements;
    # `servelab llm fit` writes a user's own)
    compute_efficiency: float | None = spec(
        None, _opt(_num(0.001, 1)), "Share of peak FLOPs the step's GEMMs reach ([llm] "
        "compute_efficiency; default fitted to published runs).",
        flags=("--compute-efficiency",))
    compute_ramp_tokens: float | None = spec(
        None, _opt(_num(0, 100_000)), "Tokens a step's compute side costs beyond those it "
        "runs: a step of M tokens reaches compute_efficiency x M / (M + this) of peak "
        "FLOPs.", unit="tokens", flags=("--compute-ramp-tokens",))
    memory_efficiency: float | None = spec(None, _opt(_num(0.001, 1)), "Share of HBM bandwidth "
                                           "a step's reads of the weights reach.",
                                           flags=("--memory-efficiency",))
    kv_memory_efficiency: float | None = spec(
        None, _opt(_num(0.001, 1)), "Share of HBM bandwidth a step's reads of the KV cache "
        "reach (attention gathers it per sequence).", flags=("--kv-memory-efficiency",))
    overhead_ms: float | None = spec(None, _opt(_num(0, 1000)), "Fixed time per step "
                                     "(scheduler, launches) of vLLM V1.", unit="ms",
                                     flags=("--overhead-ms",))
    prefill_first_overhead_ms: float | None = spec(
        None, _opt(_num(0, 1000)), "The same for --scheduler prefill-first engines.",
        unit="ms", flags=("--prefill-first-overhead-ms",))
    per_seq_ms: float | None = spec(None, _opt(_num(0, 100)), "Time per scheduled sequence a "
                                    "step (sampling, bookkeeping).", unit="ms",
                                    flags=("--per-seq-ms",))
    overlap: float | None = spec(None, _opt(_num(1, 1000)), "p of the p-norm joining the "
                                 "compute and memory sides (large: the max).",
                                 flags=("--overlap",))
    allreduce_latency_us: float | None = spec(None, _opt(_num(0, 100_000)), "Fixed time of "
                                              "each of a tensor-parallel all-reduce's "
                                              "2 (tp - 1) ring steps.", unit="µs",
                                              flags=("--allreduce-latency-us",))
    nccl_allreduce_latency_us: float | None = spec(
        None, _opt(_num(0, 100_000)), "The same where vLLM all-reduces through NCCL (more "
        "than two GPUs joined only by PCIe).", unit="µs",
        flags=("--nccl-allreduce-latency-us",))
    pp_hop_ms: float | None = spec(None, _opt(_num(0, 1000)), "Fixed time of one pipeline "
                                   "stage's send to the next (fitted: all a pass across "
                                   "stages costs beyond the stages' own time).", unit="ms",
                                   flags=("--pp-hop-ms",))
    frontend_ms: float | None = spec(None, _opt(_num(0, 60_000)), "Time a request spends "
                                     "outside the steps (HTTP, tokenizing), added to TTFT and "
                                     "end-to-end latency.", unit="ms",
                                     flags=("--frontend-ms",))
    intake_ms: float | None = spec(None, _opt(_num(0, 1000)), "Time the API server's one "
                                   "event loop takes each request before the engine sees "
                                   "it; requests that come while it is busy wait (a burst "
                                   "of N waits N times this).", unit="ms",
                                   flags=("--intake-ms",))
    intake_per_token_us: float | None = spec(
        None, _opt(_num(0, 10_000)), "The same intake's time for each token of the "
        "request's prompt (parsing, tokenizing), beside intake_ms.", unit="µs",
        flags=("--intake-per-token-us",))

    @property
    def tensor_parallel(self) -> int:
        return self.tp or max(1, self.num_gpus // self.pp)


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


@dataclass(frozen=True, slots=True)
class FieldInfo:
    """One scenario field as declared on its section (see `spec`)."""

    section: str
    name: str
    type: str  # the annotation, e.g. "float | None"
    default: Any
    rule: Callable[[str, Any], Any]
    help: str
    unit: str
    flags: tuple[str, ...]
    control: Control | None

    @property
    def key(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def toml(self) -> str:
        return f"[{self.section}] {self.name}"


_CLASSES: dict[str, type] = {"workload": Workload, "batching": BatchingPolicy,
                             "hardware": Hardware, "model": ServiceModelSpec,
                             "latency": Latency, "plan": PlanLimits, "llm": LlmPool}

# Every declared field, by its flat key ("workload.qps"), in declaration order.
FIELDS: dict[str, FieldInfo] = {
    f"{section}.{f.name}": FieldInfo(
        section, f.name, str(f.type), f.default, f.metadata["rule"], f.metadata["help"],
        f.metadata["unit"], f.metadata["flags"], f.metadata["control"])
    for section, cls in _CLASSES.items() for f in fields(cls) if "rule" in f.metadata
}

# The rules table: per section, one rule per TOML key (the [hardware] catalog figures
# are keys without a field of their own: they land in Hardware.overrides).
_SECTIONS: dict[str, tuple[type, dict[str, Callable[[str, Any], Any]]]] = {
    section: (cls, {f.name: f.rule for f in FIELDS.values() if f.section == section})
    for section, cls in _CLASSES.items()
}
_SECTIONS["hardware"][1].update({fig: _num(0, 1e9, strict_lo=True) for fig in FIGURES
                                 if fig != "price_per_gpu_hour_usd"})


def flag_keys(*sections: str) -> dict[str, str]:
    """A command's parameter name -> the scenario key its flag sets, for the fields of
    `sections` that declare a flag ("--max-queue-delay-us" -> max_queue_delay_us)."""
    return {_param_name(f): f.key for f in FIELDS.values() if f.flags and f.section in sections}


def _param_name(f: FieldInfo) -> str:
    """A flagged field's parameter name: its first flag's, as Typer names it."""
    return f.flags[0].split("/")[0].lstrip("-").replace("-", "_")


# `servelab sweep` varies one number of the deployment (the v2 sections; [llm] has its own
# `llm simulate --sweep-rates`).
SWEEP_SECTIONS = ("workload", "batching", "hardware", "model", "latency", "plan")


def _sweepable() -> list[FieldInfo]:
    return [f for f in FIELDS.values() if f.section in SWEEP_SECTIONS
            and f.type.removesuffix(" | None") in ("int", "float")]


def _sweep_name(f: FieldInfo, names: list[str]) -> str:
    """A field's name as `sweep` lists it: its flag's, else its TOML key where no other
    section has that key, else its dotted key."""
    if f.flags:
        return _param_name(f)
    return f.name if names.count(f.name) == 1 else f.key


@functools.cache
def sweep_params() -> dict[str, tuple[str, bool]]:
    """`sweep`'s parameter names -> (scenario key, whether whole). Every int or float field
    of SWEEP_SECTIONS answers to its listed name (`sweep_names`), its TOML key where no
    other section has that key, and its dotted key: "max_queue_delay_us",
    "max_queue_delay_microseconds" and "batching.max_queue_delay_microseconds" are one."""
    numeric = _sweepable()
    names = [f.name for f in numeric]
    out: dict[str, tuple[str, bool]] = {}
    for f in numeric:
        target = (f.key, f.type.startswith("int"))
        unique = [f.name] if names.count(f.name) == 1 else []
        for name in (_sweep_name(f, names), *unique, f.key):
            out.setdefault(name, target)
    return out


def sweep_names() -> list[str]:
    """One name per sweepable field, in declaration order, for help and errors."""
    numeric = _sweepable()
    return [_sweep_name(f, [g.name for g in numeric]) for f in numeric]


def lab_controls() -> list[dict[str, Any]]:
    """The lab's groups of controls, in declaration order: the sidebar's, and the LLM
    serving section's (group "LLM serving")."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for f in FIELDS.values():
        if f.control is not None:
            flags = [name for fl in f.flags for name in fl.split("/")[:1]]
            groups.setdefault(f.control.group, []).append(
                {**f.control.to_dict(f.key), **({"flags": flags} if flags else {})})
    return [{"group": g, "items": items} for g, items in groups.items()]


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
        out[view] = _checked(f"lab.{view}", table, _LAB[view])
    return out


def _checked(name: str, raw: Any, rules: Mapping[str, Callable[[str, Any], Any]]
             ) -> dict[str, Any]:
    """A TOML table [name] checked key by key against its rules."""
    if not isinstance(raw, Mapping):
        raise invalid(f"[{name}]", raw, "a table of keys",
                      f"write [{name}] on its own line, keys below")
    values: dict[str, Any] = {}
    for key, v in raw.items():
        if key not in rules:
            raise unknown_key(f"[{name}]", key, rules)
        values[key] = rules[key](f"[{name}] {key}", v)
    return values

# Which [model] keys each service-time kind takes (beyond kind/name/variability/cv).
_MODEL_KEYS = {
    ServiceKind.CONSTANT: {"latency_ms", "flops_per_row"},
    ServiceKind.AFFINE: {"base_ms", "per_row_ms", "per_request_ms", "flops_per_row"},
    ServiceKind.PROFILE: {"points", "csv", "perf_analyzer_csv", "per_request_ms", "flops_per_row"},
    ServiceKind.ROOFLINE: {"flops_per_row", "bytes_per_row", "bytes_per_batch", "overhead_us",
                           "efficiency", "precision"},
}
_MODEL_COMMON = {"kind", "name", "variability", "cv", "multipliers", "multiplier_block"}


def _section(name: str, raw: Any) -> Any:
    cls, rules = _SECTIONS[name]
    values = _checked(name, raw, rules)
    if name == "llm" and values.get("gpu"):
        values["gpu"] = resolve_gpu_name(values["gpu"], "[llm] gpu")
    if name == "llm" and values.get("tp") and values.get("num_gpus", 1) % values["tp"]:
        n, tp = values.get("num_gpus", 1), values["tp"]
        raise invalid("[llm] num_gpus", n, f"a multiple of [llm] tp = {tp} (each replica "
                      f"spans tp GPUs)", f"set [llm] num_gpus to {tp * max(1, n // tp)}, or "
                      "[llm] tp to a divisor of it (0: all GPUs in one replica)")
    if name == "latency" and values.get("frontend_event_loop") and values.get(
            "frontend_workers", 0) > 1:
        raise invalid("[latency] frontend_workers", values["frontend_workers"],
                      "1 with frontend_event_loop = true (an event loop is one thread)",
                      "set frontend_workers = 1, or frontend_event_loop = false for a pool "
                      "of threads")
    if name == "latency" and values.get("frontend_turn_ms", 0) > 0 and not values.get(
            "frontend_event_loop"):
        raise invalid("[latency] frontend_turn_ms", values["frontend_turn_ms"],
                      "0 unless frontend_event_loop = true (a cost per turn is an event "
                      "loop's)", "set frontend_event_loop = true, or frontend_turn_ms = 0")
    if name == "latency" and values.get("frontend_answer_ms", 0) > 0 and not values.get(
            "frontend_event_loop"):
        raise invalid("[latency] frontend_answer_ms", values["frontend_answer_ms"],
                      "0 unless frontend_event_loop = true (answers are work an event loop "
                      "takes between new requests; threads answer apart)",
                      "set frontend_event_loop = true, or frontend_answer_ms = 0")
    if name == "latency" and values.get("stalls_per_s", 0) > 0 and not (
            values.get("stall_ms", 0) > 0 or any(values.get("stall_samples_ms", ()))):
        raise invalid("[latency] stalls_per_s", values["stalls_per_s"],
                      "a stall length as well (stall_ms above 0, or stall_samples_ms with a "
                      "length above 0)", "set stall_ms = 5 (say), or stalls_per_s = 0")
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
    if m.multiplier_block > 1 and m.variability is not Variability.EMPIRICAL:
        raise invalid("[model] multiplier_block", m.multiplier_block,
                      "1 unless variability = 'empirical' (it draws measured multipliers "
                      "in runs)", "leave multiplier_block out, or give measured multipliers "
                      "with variability = 'empirical'")
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
