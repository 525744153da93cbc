"""A scenario: one serving setup, described once, validated once at the edge.

A scenario is read from TOML (or built in Python), overridden by CLI flags or
lab sliders as a flat ``{"section.key": value}`` mapping, and validated into
frozen dataclasses. Keys use the names users know: Triton's for batching
(``max_batch_size``, ``max_queue_delay_microseconds``, ...).
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from importlib import resources
from pathlib import Path
from typing import Any

import tomli_w

from servelab.catalog import FIGURES, GpuSpec, get_gpu, resolve_gpu_name
from servelab.errors import InputError, closest, invalid, unknown_key


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


class Variability(Enum):
    """How one batch's execution time varies around the model's mean."""

    DETERMINISTIC = "deterministic"
    EXPONENTIAL = "exponential"
    GAMMA = "gamma"


@dataclass(frozen=True, slots=True)
class Workload:
    qps: float = 1000.0
    arrival: Arrival = Arrival.POISSON
    cv: float = 1.0  # coefficient of variation of inter-arrival gaps (gamma only)
    trace_csv: str | None = None  # arrival times, one per row (trace only)
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
    # all kinds
    variability: Variability = Variability.DETERMINISTIC
    cv: float = 0.0


@dataclass(frozen=True, slots=True)
class Latency:
    """Latency outside the GPU, and the end-to-end objective.

    A component given by its median alone is constant; with a p99 as well it
    is log-normal through those two points.
    """

    feature_fetch_ms: float = 0.0
    feature_fetch_p99_ms: float | None = None
    network_ms: float = 0.0
    network_p99_ms: float | None = None
    p99_slo_ms: float = 100.0


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
    kv_dtype: str = "auto"
    weight_dtype: str = "auto"
    context_tokens: int = 4096
    gpu: str | None = None
    num_gpus: int = 1
    tp: int = 0
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    gpu_memory_gb: float | None = None
    weights_gb: float | None = None

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
    base_dir: str = "."  # where relative file paths in the scenario are resolved

    def with_overrides(self, overrides: Mapping[str, Any]) -> Scenario:
        """A copy with flat ``section.key`` overrides applied, validated like a file."""
        raw = scenario_to_dict(self)
        apply_overrides(raw, overrides)
        return scenario_from_dict(raw, base_dir=self.base_dir)

    def resolve_path(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else Path(self.base_dir) / p


# ---------------------------------------------------------------------------
# Validation: a small table per section, one rule per key.


@dataclass(frozen=True, slots=True)
class _Key:
    convert: Callable[[str, Any], Any]


def _num(lo: float | None = None, hi: float | None = None, *, strict_lo: bool = False,
         fix: str = "") -> Callable[[str, Any], float]:
    def conv(name: str, v: Any) -> float:
        bounds = []
        if lo is not None:
            bounds.append(f"{'>' if strict_lo else '>='} {lo:g}")
        if hi is not None:
            bounds.append(f"<= {hi:g}")
        expected = "a number" + (f" {' and '.join(bounds)}" if bounds else "")
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise invalid(name, v, expected, fix or f"set {name} to {expected}")
        if lo is not None and (v <= lo if strict_lo else v < lo):
            raise invalid(name, v, expected, fix or f"set {name} to {expected}")
        if hi is not None and v > hi:
            raise invalid(name, v, expected, fix or f"set {name} to {expected}")
        return float(v)

    return conv


def _int(lo: int, hi: int | None = None, fix: str = "") -> Callable[[str, Any], int]:
    def conv(name: str, v: Any) -> int:
        expected = f"a whole number >= {lo}" + (f" and <= {hi}" if hi is not None else "")
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            raise invalid(name, v, expected, fix or f"set {name} to {expected}")
        return v

    return conv


def _opt(conv: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    return lambda name, v: None if v is None else conv(name, v)


def _str(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise invalid(name, v, "a string", f"quote the value: {name} = \"...\"")
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


def _choice(*choices: str) -> Callable[[str, Any], str]:
    def conv(name: str, v: Any) -> str:
        if isinstance(v, str) and v.lower() in choices:
            return v.lower()
        raise invalid(name, v, f"one of {', '.join(choices)}", f"use one of {', '.join(choices)}")

    return conv


def _int_list(name: str, v: Any) -> tuple[int, ...]:
    if isinstance(v, int) and not isinstance(v, bool):
        v = [v]
    if not isinstance(v, list | tuple) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v
    ):
        raise invalid(name, v, "a list of whole numbers >= 1", f"write e.g. {name} = [4, 8]")
    return tuple(sorted(set(v)))


def _points(name: str, v: Any) -> tuple[tuple[int, float], ...]:
    expected = "a list of [batch_size, latency_ms] pairs"
    if not isinstance(v, list | tuple):
        raise invalid(name, v, expected, f"write e.g. {name} = [[1, 0.9], [8, 1.6]]")
    out: list[tuple[int, float]] = []
    for p in v:
        if (
            not isinstance(p, list | tuple)
            or len(p) != 2
            or isinstance(p[0], bool)
            or not isinstance(p[0], int)
            or p[0] < 1
            or not isinstance(p[1], int | float)
            or not p[1] > 0
        ):
            raise invalid(name, p, f"each entry [batch_size >= 1, latency_ms > 0] in {expected}",
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
    out = []
    for k, path in v.items():
        if not str(k).isdigit() or int(k) < 1 or not isinstance(path, str):
            raise invalid(f"{name}.{k}", path, expected, "use the -b batch size as the key")
        out.append((int(k), path))
    return tuple(sorted(out))


_SECTIONS: dict[str, tuple[type, dict[str, Callable[[str, Any], Any]]]] = {
    "workload": (Workload, {
        "qps": _num(0, strict_lo=True),
        "arrival": _enum(Arrival),
        "cv": _num(0, strict_lo=True),
        "trace_csv": _opt(_str),
        "num_requests": _int(1, 50_000_000),
        "seed": _int(0),
    }),
    "batching": (BatchingPolicy, {
        "max_batch_size": _int(1, 1 << 16),
        "max_queue_delay_microseconds": _int(0, 60_000_000),
        "preferred_batch_size": _int_list,
        "max_queue_size": _int(0),
        "default_timeout_microseconds": _int(0),
        "instances_per_gpu": _int(1, 64),
    }),
    "hardware": (Hardware, {
        "gpu": _str,
        "num_gpus": _int(1, 100_000),
        "price_per_gpu_hour": _opt(_num(0)),
        **{fig: _num(0, strict_lo=True) for fig in FIGURES if fig != "price_per_gpu_hour_usd"},
    }),
    "model": (ServiceModelSpec, {
        "kind": _enum(ServiceKind),
        "name": _str,
        "latency_ms": _opt(_num(0, strict_lo=True)),
        "base_ms": _opt(_num(0)),
        "per_row_ms": _opt(_num(0)),
        "points": _points,
        "csv": _opt(_str),
        "perf_analyzer_csv": _pa_files,
        "flops_per_row": _opt(_num(0)),
        "bytes_per_row": _opt(_num(0)),
        "bytes_per_batch": _opt(_num(0)),
        "overhead_us": _num(0),
        "efficiency": _num(0, 1, strict_lo=True),
        "precision": _choice("bf16", "fp8"),
        "variability": _enum(Variability),
        "cv": _num(0),
    }),
    "latency": (Latency, {
        "feature_fetch_ms": _num(0),
        "feature_fetch_p99_ms": _opt(_num(0)),
        "network_ms": _num(0),
        "network_p99_ms": _opt(_num(0)),
        "p99_slo_ms": _num(0, strict_lo=True),
    }),
    "plan": (PlanLimits, {
        "max_busy_fraction": _num(0, 1, strict_lo=True),
        "max_gpus": _int(1, 100_000),
    }),
    "llm": (LlmPool, {
        "model": _str,
        "kv_dtype": _choice("auto", "fp32", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2",
                            "int8", "int4"),
        "weight_dtype": _choice("auto", "fp32", "bf16", "fp16", "fp8", "int8", "int4"),
        "context_tokens": _int(1, 10_000_000),
        "gpu": _opt(_str),
        "num_gpus": _int(1, 100_000),
        "tp": _int(0, 1024),
        "gpu_memory_utilization": _num(0, 1, strict_lo=True),
        "block_size": _int(1, 1024),
        "max_num_batched_tokens": _int(1),
        "max_num_seqs": _int(1),
        "gpu_memory_gb": _opt(_num(0, strict_lo=True)),
        "weights_gb": _opt(_num(0)),
}),
}

_TOP = {"name", "description", *_SECTIONS}

# Which [model] keys each service-time kind takes (beyond kind/name/variability/cv).
_MODEL_KEYS = {
    ServiceKind.CONSTANT: {"latency_ms", "flops_per_row"},
    ServiceKind.AFFINE: {"base_ms", "per_row_ms", "flops_per_row"},
    ServiceKind.PROFILE: {"points", "csv", "perf_analyzer_csv", "flops_per_row"},
    ServiceKind.ROOFLINE: {"flops_per_row", "bytes_per_row", "bytes_per_batch", "overhead_us",
                           "efficiency", "precision"},
}
_MODEL_COMMON = {"kind", "name", "variability", "cv"}


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
    if m.variability is Variability.GAMMA and m.cv <= 0:
        raise invalid("[model] cv", m.cv, "a number > 0 with variability = 'gamma'",
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
    if w.arrival is Arrival.TRACE and not w.trace_csv:
        raise invalid("[workload] trace_csv", None, "a CSV of arrival times with arrival = 'trace'",
                      "set trace_csv = \"arrivals.csv\" (one time in seconds per row)")
    if w.trace_csv and w.arrival is not Arrival.TRACE:
        raise invalid("[workload] arrival", w.arrival.value, "'trace' when trace_csv is set",
                      "set arrival = \"trace\" or remove trace_csv")
    lat = s.latency
    for name, med, p99 in (("feature_fetch", lat.feature_fetch_ms, lat.feature_fetch_p99_ms),
                           ("network", lat.network_ms, lat.network_p99_ms)):
        if p99 is not None and (med <= 0 or p99 < med):
            raise invalid(f"[latency] {name}_p99_ms", p99,
                          f"a p99 >= the median {name}_ms ({med:g}) and a median > 0",
                          f"raise {name}_p99_ms or remove it for a constant {name}")
    return s


def scenario_from_dict(raw: Mapping[str, Any], base_dir: str | Path = ".") -> Scenario:
    """Validate a parsed TOML document (or equivalent dict) into a Scenario."""
    if not isinstance(raw, Mapping):
        raise invalid("scenario", raw, "a table of sections", "start from `servelab plan --help`")
    parts: dict[str, Any] = {}
    for key, v in raw.items():
        if key not in _TOP:
            raise unknown_key("scenario", key, _TOP)
        if key in ("name", "description"):
            parts[key] = _str(key, v)
        else:
            parts[key] = _section(key, v)
    if "model" in parts:
        parts["model"] = _check_model(parts["model"], set(raw["model"]))
    return _check(Scenario(base_dir=str(base_dir), **parts))


def seed_path() -> Path:
    return Path(str(resources.files("servelab.data").joinpath("seed.toml")))


def load_scenario(source: str | Path) -> Scenario:
    """Load a scenario from a TOML file, or the built-in one named 'seed'."""
    path = seed_path() if str(source) == "seed" else Path(source)
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        raise invalid("--scenario", str(source), "a TOML file that exists, or 'seed'",
                      "check the path, or use --scenario seed") from None
    except OSError as exc:
        raise invalid("--scenario", str(source), "a readable TOML file", str(exc)) from exc
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML ({exc}); fix: correct the file's syntax") from exc
    try:
        return scenario_from_dict(raw, base_dir=path.parent)
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None


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
        raw.setdefault(section, {})[key] = value


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


def scenario_from_flat(flat: Mapping[str, Any], base_dir: str | Path = ".") -> Scenario:
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
    return scenario_from_dict(raw, base_dir=base_dir)


def scenario_to_toml(s: Scenario) -> str:
    return tomli_w.dumps(scenario_to_dict(s))
