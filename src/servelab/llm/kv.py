"""KV-cache bytes for standard and grouped-query attention.

Per token, every layer stores one K and one V vector per KV head:
``2 x layers x kv_heads x head_dim x bytes_per_element``. (The factor 2 is K
and V; the element size is a separate factor. Counting the FP16 "2" for both
is the seed dashboard's error.)
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from servelab.errors import invalid

KV_DTYPE_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


@dataclass(frozen=True, slots=True)
class AttentionShape:
    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int


@cache
def _models() -> dict[str, Any]:
    text = resources.files("servelab.catalog").joinpath("models.toml").read_text("utf-8")
    return tomllib.loads(text)


def get_model(name: str) -> AttentionShape:
    models = _models()
    key = name.strip().lower()
    if key not in models:
        from servelab.errors import closest

        guess = closest(key, models)
        raise invalid("[llm] model", name, f"one of {', '.join(models)}",
                      f"did you mean {guess!r}?" if guess else "pick a catalog model")
    m = models[key]
    heads = int(m["num_attention_heads"]["value"])
    return AttentionShape(
        name=m["name"],
        num_layers=int(m["num_hidden_layers"]["value"]),
        num_kv_heads=int(m["num_key_value_heads"]["value"]),
        head_dim=int(m["hidden_size"]["value"]) // heads,
    )


def bytes_per_token(shape: AttentionShape, kv_dtype: str) -> float:
    """K and V bytes one token holds across all layers."""
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * KV_DTYPE_BYTES[kv_dtype]


@dataclass(frozen=True, slots=True)
class NaivePool:
    """Pool capacity under the seed dashboard's own assumptions: every byte of GPU
    memory not holding weights holds KV, nothing else is reserved."""

    bytes_per_token: float
    bytes_per_session: float
    headroom_bytes: float
    max_sessions: int


def naive_pool(shape: AttentionShape, kv_dtype: str, context_tokens: int, num_gpus: int,
               gpu_memory_gb: float, weights_gb: float) -> NaivePool:
    per_token = bytes_per_token(shape, kv_dtype)
    per_session = per_token * context_tokens
    headroom = (num_gpus * gpu_memory_gb - weights_gb) * 1e9
    return NaivePool(per_token, per_session, headroom, max(0, int(headroom // per_session)))
