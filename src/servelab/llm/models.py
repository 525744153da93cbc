"""LLM shapes: the config.json fields that size weights and the KV cache.

Models come from the catalog (``catalog/models.toml``) or from any local
Hugging Face ``config.json`` by path. Nothing is fetched from a hub.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from servelab.errors import InputError, closest, invalid

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """What servelab needs of a transformer, by config.json's names."""

    key: str
    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    num_parameters: float
    torch_dtype: str = "bfloat16"
    kv_lora_rank: int | None = None  # MLA: one latent of kv_lora_rank + qk_rope_head_dim
    qk_rope_head_dim: int | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()  # one per layer; () means every layer is FULL
    source: str = ""
    params_source: str = ""

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    def layer_kinds(self) -> tuple[str, ...]:
        return self.layer_types or (FULL,) * self.num_layers


@cache
def _catalog() -> dict[str, Any]:
    text = resources.files("servelab.catalog").joinpath("models.toml").read_text("utf-8")
    return tomllib.loads(text)


def model_names() -> list[str]:
    return list(_catalog())


def _layer_types(cfg: dict[str, Any], n_layers: int, where: str) -> tuple[str, ...]:
    """Per-layer attention kinds, by the rule vLLM follows: ``layer_types`` where the
    config has it; every layer sliding where only ``sliding_window`` is set."""
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False:  # Qwen2 configs carry a window they do not use
        window = None
    if cfg.get("layer_types"):
        types = tuple(cfg["layer_types"])
    elif "layer_pattern" in cfg:
        pat = list(cfg["layer_pattern"])
        types = tuple(pat[i % len(pat)] for i in range(n_layers))
    elif window:
        types = (SLIDING,) * n_layers
    else:
        types = ()
    if types and len(types) != n_layers:
        raise invalid(f"{where} layer_types", f"{len(types)} entries",
                      f"one per layer ({n_layers})", "fix the config's layer_types")
    bad = sorted(set(types) - {FULL, SLIDING})
    if bad:
        raise invalid(f"{where} layer_types", bad, f"only {FULL!r} or {SLIDING!r}",
                      "servelab sizes full and sliding-window attention layers only")
    if SLIDING in types and not window:
        raise invalid(f"{where} sliding_window", window, "a window for sliding layers",
                      "set sliding_window in the config")
    return types


def estimate_parameters(cfg: dict[str, Any]) -> float:
    """Parameter count from the shapes, for a config that does not state it.

    Embeddings (twice unless tied) + per layer: attention projections and a gated
    MLP (x experts for a mixture of experts). Norms and biases are left out.
    """
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kvh = cfg.get("num_key_value_heads", heads)
    hd = cfg.get("head_dim") or h // heads
    inter = cfg.get("intermediate_size", 4 * h)
    experts = cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 1
    attn = h * hd * (heads + 2 * kvh) + heads * hd * h
    mlp = 3 * h * (cfg.get("moe_intermediate_size") or inter) * experts
    emb = cfg.get("vocab_size", 32000) * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return float(emb + cfg["num_hidden_layers"] * (attn + mlp))


def _from_dict(key: str, cfg: dict[str, Any], where: str) -> ModelConfig:
    def need(field: str) -> Any:
        if field not in cfg:
            raise invalid(f"{where} {field}", None, "a value in the config",
                          "use a transformer config.json (it lists num_hidden_layers, ...)")
        return cfg[field]

    n_layers = int(need("num_hidden_layers"))
    heads = int(need("num_attention_heads"))
    hidden = int(need("hidden_size"))
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    return ModelConfig(
        key=key,
        name=str(cfg.get("name", key)),
        num_layers=n_layers,
        num_attention_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        hidden_size=hidden,
        intermediate_size=int(cfg.get("intermediate_size", 4 * hidden)),
        vocab_size=int(cfg.get("vocab_size", 32000)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        num_parameters=float(cfg.get("num_parameters") or estimate_parameters(cfg)),
        torch_dtype=str(cfg.get("torch_dtype", "bfloat16")),
        kv_lora_rank=cfg.get("kv_lora_rank"),
        qk_rope_head_dim=cfg.get("qk_rope_head_dim") if cfg.get("kv_lora_rank") else None,
        sliding_window=(None if cfg.get("use_sliding_window") is False
                        else cfg.get("sliding_window")),
        layer_types=_layer_types(cfg, n_layers, where),
        source=str(cfg.get("source", where)),
        params_source=str(cfg.get("params_source",
                                  "estimated from the config's shapes" if "num_parameters"
                                  not in cfg else "")),
    )


def get_model(name_or_path: str, field: str = "--model") -> ModelConfig:
    """A catalog model by name (case-insensitive), or a config.json by path."""
    p = Path(name_or_path)
    if name_or_path.endswith(".json") or p.is_file():
        try:
            cfg = json.loads(p.read_text("utf-8"))
        except FileNotFoundError:
            raise invalid(field, name_or_path, "a config.json that exists, or a catalog model",
                          f"check the path, or use one of {', '.join(model_names())}") from None
        except (OSError, json.JSONDecodeError) as exc:
            raise InputError(f"{field} = {name_or_path!r}: not a readable JSON config ({exc}); "
                             "fix: pass a Hugging Face config.json") from None
        if not isinstance(cfg, dict):
            raise invalid(field, name_or_path, "a JSON object", "pass a config.json")
        return _from_dict(p.stem if p.name != "config.json" else p.parent.name or "model",
                          cfg, f"{name_or_path}:")
    catalog = _catalog()
    key = name_or_path.strip().lower()
    if key not in catalog:
        guess = closest(key, catalog, cutoff=0.5)
        raise invalid(field, name_or_path, f"one of {', '.join(catalog)} or a config.json path",
                      f"did you mean {guess!r}?" if guess else "pick a catalog model")
    return _from_dict(key, catalog[key], f"catalog {key}:")
