"""LLM shapes: the config.json fields that size weights and the KV cache.

Models come from the catalog (``catalog/models.toml``) or from any local
Hugging Face ``config.json`` by path. Nothing is fetched from a hub.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from servelab.errors import closest, cut, invalid
from servelab.files import MAX_CONFIG_BYTES, parse_json, read_text

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
    checkpoint_dtype: str | None = None  # a quantized checkpoint's weight dtype (fp8, int4)
    active_parameters: float | None = None  # a mixture of experts: those a token uses
    # a mixture of experts: its routed experts, how many a token goes to, and their weights'
    # parameters (all layers, all experts); 0 for a dense model (routed_experts)
    num_routed_experts: int = 0
    experts_per_token: int = 0
    routed_expert_parameters: float = 0.0
    source: str = ""
    params_source: str = ""

    @property
    def parameters_per_token(self) -> float:
        """Parameters each token's forward pass multiplies through (FLOPs = 2 x this)."""
        return self.active_parameters or self.num_parameters

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
    kvh = cfg.get("num_key_value_heads") or heads
    hd = cfg.get("head_dim") or h // heads
    inter = cfg.get("intermediate_size") or 4 * h
    experts = cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 1
    attn = h * hd * (heads + 2 * kvh) + heads * hd * h
    mlp = 3 * h * (cfg.get("moe_intermediate_size") or inter) * experts
    emb = (cfg.get("vocab_size") or 32000) * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return float(emb + cfg["num_hidden_layers"] * (attn + mlp))


def routed_experts(cfg: dict[str, Any]) -> tuple[int, int, float]:
    """A mixture of experts' routed experts per layer, the experts each token goes to, and
    the routed experts' parameters over all layers (gated MLPs, 3 x hidden x
    moe_intermediate each; layers before ``first_k_dense_replace`` are dense); (0, 0, 0.0)
    for a dense model. Shared experts are not routed: every token uses them."""
    experts = cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 1
    k = cfg.get("num_experts_per_tok")
    if experts <= 1 or not k:
        return 0, 0, 0.0
    inter = cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or (
        4 * cfg["hidden_size"])
    moe_layers = max(0, cfg["num_hidden_layers"] - (cfg.get("first_k_dense_replace") or 0))
    return int(experts), int(min(k, experts)), float(
        moe_layers * experts * 3 * cfg["hidden_size"] * inter)


def estimate_active_parameters(cfg: dict[str, Any], total: float) -> float | None:
    """Parameters a token passes through, for a mixture of experts (None: dense).

    Each MoE layer routes a token to ``num_experts_per_tok`` of its routed experts (plus
    any shared experts, which every token uses); the other routed experts' gated MLPs
    are inactive for it (routed_experts). Mixtral 8x7B gives 12.9B of 46.7B and
    DeepSeek-V3 37.5B of 671B, the figures their authors state (12.9B, 37B).
    """
    experts, k, routed = routed_experts(cfg)
    if not experts:
        return None
    inactive = routed * (experts - k) / experts
    return float(max(total - inactive, total / experts))


# Ranges a config.json's numbers are held to: wide enough for any released model, narrow
# enough that the sizing arithmetic and the per-layer lists stay small.
_INT_RANGES = {
    "num_hidden_layers": (1, 10_000),
    "num_attention_heads": (1, 100_000),
    "num_key_value_heads": (1, 100_000),
    "hidden_size": (1, 10_000_000),
    "head_dim": (1, 1_000_000),
    "intermediate_size": (1, 100_000_000),
    "moe_intermediate_size": (1, 100_000_000),
    "vocab_size": (1, 100_000_000),
    "max_position_embeddings": (1, 1_000_000_000),
    "sliding_window": (1, 1_000_000_000),
    "kv_lora_rank": (1, 1_000_000),
    "qk_rope_head_dim": (1, 1_000_000),
    "num_local_experts": (1, 100_000),
    "n_routed_experts": (1, 100_000),
    "num_experts_per_tok": (1, 100_000),
    "n_shared_experts": (0, 100_000),
    "first_k_dense_replace": (0, 10_000),
}


def _checked(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """The config with every number servelab reads checked for type and range."""
    for key, (lo, hi) in _INT_RANGES.items():
        v = cfg.get(key)
        if v is None:
            continue
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise invalid(f"{where} {key}", v, f"a whole number from {lo:,} to {hi:,}",
                          f"fix {key} in the config")
        cfg[key] = v
    n = cfg.get("num_parameters")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int | float)
                          or not 0 < float(n) <= 1e15):
        raise invalid(f"{where} num_parameters", n, "a number > 0 and <= 1e15",
                      "fix num_parameters, or remove it to estimate from the shapes")
    for key in ("torch_dtype", "name", "source", "params_source"):
        if key in cfg and not isinstance(cfg[key], str):
            raise invalid(f"{where} {key}", cfg[key], "a string", f"quote {key} in the config")
    if "layer_types" in cfg and cfg["layer_types"] is not None and not (
            isinstance(cfg["layer_types"], list)
            and all(isinstance(x, str) for x in cfg["layer_types"])):
        raise invalid(f"{where} layer_types", cfg["layer_types"], "a list of strings",
                      "fix layer_types in the config")
    if "layer_pattern" in cfg and not (isinstance(cfg["layer_pattern"], list)
                                       and cfg["layer_pattern"]):
        raise invalid(f"{where} layer_pattern", cfg["layer_pattern"], "a non-empty list",
                      "fix layer_pattern in the config")
    kvh, heads = cfg.get("num_key_value_heads"), cfg.get("num_attention_heads")
    if kvh is not None and heads is not None and kvh > heads:
        raise invalid(f"{where} num_key_value_heads", kvh,
                      f"at most num_attention_heads ({heads})", "fix the config")
    if cfg.get("hidden_size") and heads and not cfg.get("head_dim") and (
            cfg["hidden_size"] < heads):
        raise invalid(f"{where} hidden_size", cfg["hidden_size"],
                      f"at least num_attention_heads ({heads}) when head_dim is not given",
                      "set head_dim in the config")
    return cfg


def checkpoint_dtype(cfg: dict[str, Any], where: str) -> str | None:
    """The weight dtype a quantized checkpoint ships in (its ``quantization_config``),
    as vLLM loads it; None for an unquantized checkpoint (the torch_dtype applies)."""
    q = cfg.get("quantization_config")
    if q is None:
        return None
    if not isinstance(q, dict):
        raise invalid(f"{where} quantization_config", q, "a table", "fix the config")
    method = str(q.get("quant_method", "")).lower()
    bits = q.get("bits", q.get("w_bit"))
    if method in ("fp8", "fbgemm_fp8", "modelopt"):
        return "fp8"
    if method in ("awq", "gptq", "marlin", "awq_marlin", "gptq_marlin") and bits in (4, 8):
        return "int4" if bits == 4 else "int8"
    if method == "bitsandbytes":
        if q.get("load_in_4bit"):
            return "int4"
        if q.get("load_in_8bit"):
            return "int8"
    raise invalid(f"{where} quantization_config.quant_method", method or None,
                  "fp8, awq or gptq (4 or 8 bits), or bitsandbytes",
                  "give --weight-dtype (weight_dtype) explicitly for this checkpoint")


def _from_dict(key: str, cfg: dict[str, Any], where: str) -> ModelConfig:
    def need(field: str) -> Any:
        if cfg.get(field) is None:
            raise invalid(f"{where} {field}", None, "a value in the config",
                          "use a transformer config.json (it lists num_hidden_layers, ...)")
        return cfg[field]

    cfg = _checked(dict(cfg), where)
    n_layers = int(need("num_hidden_layers"))
    heads = int(need("num_attention_heads"))
    hidden = int(need("hidden_size"))
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    total = float(cfg.get("num_parameters") or estimate_parameters(cfg))
    experts, per_token, routed = routed_experts(cfg)
    return ModelConfig(
        key=key,
        name=str(cfg.get("name", key)),
        num_layers=n_layers,
        num_attention_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        hidden_size=hidden,
        intermediate_size=int(cfg.get("intermediate_size") or 4 * hidden),
        vocab_size=int(cfg.get("vocab_size") or 32000),
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 4096),
        num_parameters=total,
        active_parameters=estimate_active_parameters(cfg, total),
        num_routed_experts=experts, experts_per_token=per_token,
        routed_expert_parameters=min(routed, total),
        torch_dtype=str(cfg.get("torch_dtype") or "bfloat16"),
        kv_lora_rank=cfg.get("kv_lora_rank"),
        qk_rope_head_dim=cfg.get("qk_rope_head_dim") if cfg.get("kv_lora_rank") else None,
        sliding_window=(None if cfg.get("use_sliding_window") is False
                        else cfg.get("sliding_window")),
        layer_types=_layer_types(cfg, n_layers, where),
        checkpoint_dtype=checkpoint_dtype(cfg, where),
        source=str(cfg.get("source", where)),
        params_source=str(cfg.get("params_source",
                                  "estimated from the config's shapes" if "num_parameters"
                                  not in cfg else "")),
    )


def model_from_config(cfg: Any, where: str, key: str = "model") -> ModelConfig:
    """A model from a config.json's contents (parsed), validated key by key."""
    if not isinstance(cfg, dict):
        raise invalid(where, cfg, "a JSON object (a config.json)", "pass a config.json")
    return _from_dict(key, cfg, f"{where}:")


def looks_like_path(name: str) -> bool:
    """A model name that is a file path rather than a catalog key (decided without
    touching the file system, so naming a path reveals nothing about it)."""
    return name.endswith(".json") or "/" in name or "\\" in name


def get_model(name_or_path: str, field: str = "--model",
              resolve: Callable[[str, str], Path] | None = None) -> ModelConfig:
    """A catalog model by name (case-insensitive), or a config.json by path.

    `resolve` turns a path into the file to read (the scenario's sandbox in the lab);
    by default a path is read as given.
    """
    catalog = _catalog()
    key = name_or_path.strip().lower()
    if key in catalog:
        return _from_dict(key, catalog[key], f"catalog {key}:")
    if looks_like_path(name_or_path):
        p = resolve(name_or_path, field) if resolve is not None else Path(name_or_path)
        text = read_text(p, field, max_bytes=MAX_CONFIG_BYTES, what="config.json")
        cfg = parse_json(text, f"{field} = {cut(name_or_path)!r}")
        return model_from_config(cfg, cut(name_or_path),
                                 p.stem if p.name != "config.json" else p.parent.name or "model")
    guess = closest(key, catalog, cutoff=0.5) if len(key) < 200 else None
    raise invalid(field, name_or_path, f"one of {', '.join(catalog)} or a config.json path",
                  f"did you mean {guess!r}?" if guess else "pick a catalog model")
