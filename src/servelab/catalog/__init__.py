"""Hardware catalog: GPU figures from a data file, each with its source and date."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from servelab.errors import closest, invalid

# Short names people type, mapped to the catalog key they mean.
ALIASES = {"H100": "H100-SXM", "A100": "A100-80GB", "H100SXM": "H100-SXM"}

FIGURES = (
    "memory_datasheet_gb",
    "memory_runtime_gib",
    "hbm_bandwidth_tbps",
    "bf16_dense_tflops",
    "fp8_dense_tflops",
    "price_per_gpu_hour_usd",
    "interconnect_gbps",
)


@dataclass(frozen=True, slots=True)
class Sourced:
    """One catalog figure and where it came from."""

    value: float
    source: str
    date: str


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Peak figures of one GPU model. `fp8_dense_tflops` is None where there is no FP8."""

    key: str
    name: str
    memory_datasheet_gb: float
    hbm_bandwidth_tbps: float
    bf16_dense_tflops: float
    fp8_dense_tflops: float | None
    price_per_gpu_hour_usd: float
    memory_runtime_gib: float | None = None
    interconnect_gbps: float | None = None  # one direction, GB/s (tensor-parallel traffic)
    sources: tuple[tuple[str, Sourced], ...] = ()

    # Where no runtime figure is recorded: the runtime reports about 1% less than the
    # datasheet's (binary) GB, e.g. 79.11-79.33 GiB for 80 GB parts in vLLM logs.
    RUNTIME_SHARE = 0.99

    def runtime_memory_gib(self) -> float:
        """Device memory as torch.cuda.mem_get_info reports it (vLLM's total_gpu_memory)."""
        if self.memory_runtime_gib is not None:
            return self.memory_runtime_gib
        return self.memory_datasheet_gb * self.RUNTIME_SHARE

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_tbps * 1e12

    def peak_flops(self, precision: str) -> float:
        """Dense tensor-core peak in FLOP/s for 'bf16' or 'fp8'."""
        if precision == "fp8":
            if self.fp8_dense_tflops is None:
                raise invalid(
                    "[model] precision",
                    precision,
                    f"a precision that {self.key} supports (bf16; it has no FP8 tensor cores)",
                    "set precision = 'bf16' or choose a GPU with FP8 (H100, H200, L4, L40S, B200)",
                )
            return self.fp8_dense_tflops * 1e12
        return self.bf16_dense_tflops * 1e12


@cache
def _raw() -> dict[str, Any]:
    text = resources.files("servelab.catalog").joinpath("gpus.toml").read_text("utf-8")
    return tomllib.loads(text)


def gpu_names() -> list[str]:
    """Catalog keys, in file order."""
    return list(_raw())


def resolve_gpu_name(name: str, field: str = "[hardware] gpu") -> str:
    """The catalog key for a name as typed (case-insensitive, common aliases)."""
    keys = {k.upper(): k for k in _raw()}
    up = name.strip().upper()
    if up in keys:
        return keys[up]
    if up in ALIASES:
        return ALIASES[up]
    names = {k.upper(): k for k in gpu_names()} | {a: a for a in ALIASES}
    guess = closest(up, names, cutoff=0.5)
    fix = f"did you mean {names[guess]!r}?" if guess else "use one of the catalog names"
    raise invalid(field, name, f"one of {', '.join(gpu_names())}", fix)


def get_gpu(name: str, overrides: dict[str, float] | None = None) -> GpuSpec:
    """A GPU by name, with any figure replaced by a user's override."""
    key = resolve_gpu_name(name)
    entry = _raw()[key]
    values: dict[str, Any] = {}
    sources: list[tuple[str, Sourced]] = []
    for fig in FIGURES:
        item = entry.get(fig)
        if item is None:
            values[fig] = None
            continue
        values[fig] = float(item["value"])
        sources.append((fig, Sourced(float(item["value"]), item["source"], item["date"])))
    for fig, val in (overrides or {}).items():
        values[fig] = float(val)
        sources = [(f, s) for f, s in sources if f != fig]
        sources.append((fig, Sourced(float(val), "scenario override", "")))
    return GpuSpec(key=key, name=entry["name"], sources=tuple(sources), **values)
