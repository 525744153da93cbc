"""KV sizing held to hand arithmetic from each model's config, and to vLLM's own logs."""

from __future__ import annotations

import json
import math

import pytest

from servelab.catalog import get_gpu
from servelab.errors import InputError
from servelab.llm.kv import (
    GIB,
    PoolSpec,
    blocks_per_request,
    bytes_per_token,
    bytes_per_token_per_gpu,
    longest_context,
    session_bytes,
    size_pool,
    weights_bytes,
)
from servelab.llm.models import get_model, model_names

# Bytes per token at 16 bits, written out from each config.json (2 = K and V; last 2 = bytes).
BY_HAND = {
    "llama-3-70b": 2 * 80 * 8 * 128 * 2,
    "llama-3.1-8b": 2 * 32 * 8 * 128 * 2,
    "llama-3.1-70b": 2 * 80 * 8 * 128 * 2,
    "llama-3.1-405b": 2 * 126 * 8 * 128 * 2,
    "mistral-7b-v0.3": 2 * 32 * 8 * 128 * 2,
    "mixtral-8x7b": 2 * 32 * 8 * (4096 // 32) * 2,
    "qwen2.5-7b": 2 * 28 * 4 * (3584 // 28) * 2,
    "qwen2.5-72b": 2 * 80 * 8 * (8192 // 64) * 2,
    "qwen3-14b": 2 * 40 * 8 * 128 * 2,
    "gemma-2-9b": 2 * 42 * 8 * 256 * 2,
    "gemma-2-27b": 2 * 46 * 16 * 128 * 2,
    "phi-3-mini-4k": 2 * 32 * 32 * (3072 // 32) * 2,
    "deepseek-v3": 61 * (512 + 64) * 2,  # MLA: one latent per layer, no K/V pair
}


def test_every_catalog_model_is_checked_by_hand():
    assert set(model_names()) == set(BY_HAND)


@pytest.mark.parametrize("name", sorted(BY_HAND))
def test_bytes_per_token_by_hand(name):
    m = get_model(name)
    assert bytes_per_token(m, "bf16") == BY_HAND[name]
    assert bytes_per_token(m, "fp8") == BY_HAND[name] / 2
    assert m.source
    assert m.params_source


def test_sliding_window_sessions():
    # Gemma 2: every other layer holds at most 4,096 tokens.
    g = get_model("gemma-2-9b")
    per_layer = 2 * 8 * 256 * 2
    assert session_bytes(g, "bf16", 8192) == (21 * 8192 + 21 * 4096) * per_layer
    assert session_bytes(g, "bf16", 2000) == 42 * 2000 * per_layer
    # Phi-3 mini 4k sets only sliding_window (2047): every layer is bounded by it.
    p = get_model("phi-3-mini-4k")
    assert session_bytes(p, "bf16", 4096) == 32 * 2047 * (2 * 32 * 96 * 2)
    # Qwen2.5 carries a window it does not use (use_sliding_window: false).
    q = get_model("qwen2.5-7b")
    assert session_bytes(q, "bf16", 4096) == 4096 * BY_HAND["qwen2.5-7b"]


def test_tensor_parallel_heads_split_replicate_and_mla_copies():
    m = get_model("llama-3.1-8b")  # 8 KV heads
    assert bytes_per_token_per_gpu(m, "bf16", 2) == 2 * 32 * 4 * 128 * 2
    assert bytes_per_token_per_gpu(m, "bf16", 8) == 2 * 32 * 1 * 128 * 2
    assert bytes_per_token_per_gpu(m, "bf16", 16) == 2 * 32 * 1 * 128 * 2  # replicated
    d = get_model("deepseek-v3")
    assert bytes_per_token_per_gpu(d, "bf16", 8) == 61 * 576 * 2  # full copy per rank


def test_quantized_kv_with_scale_overhead():
    m = get_model("llama-3.1-8b")
    # int8/int4: an fp16 scale and zero point (4 bytes) per token, head, K or V.
    assert bytes_per_token(m, "int8") == 2 * 32 * 8 * (128 * 1 + 4)
    assert bytes_per_token(m, "int4") == 2 * 32 * 8 * (128 * 0.5 + 4)
    assert bytes_per_token(m, "auto") == BY_HAND["llama-3.1-8b"]


def test_weights_by_dtype():
    m = get_model("llama-3.1-8b")
    assert weights_bytes(m, "bf16") == 8_030_261_248 * 2
    assert weights_bytes(m, "fp8") == 8_030_261_248
    assert weights_bytes(m, "int4") == pytest.approx(8_030_261_248 * (0.5 + 2.5 / 128))
    with pytest.raises(InputError, match="--weight-dtype"):
        weights_bytes(m, "fp4")


def test_pool_worked_step_by_step_against_vllm_log():
    # vllm-project/vllm PR #10511: Llama-3-8B on an H100-80G, tp=1:
    # total 79.22 GiB x 0.90 = 71.29 GiB; weights 14.96 GiB; non-torch 1.79 GiB;
    # activation peak 1.26 GiB; available_kv_cache_memory 53.29 GiB.
    m = get_model("llama-3.1-8b")  # same shapes and parameter count as Llama-3-8B
    spec = PoolSpec(model=m, gpu=get_gpu("H100-SXM"), kv_dtype="auto", weight_dtype="bf16",
                    context_tokens=8192, activation_gib=1.26, non_torch_gib=1.79)
    pool = size_pool(spec)
    usable = 79.22 * GIB * 0.9
    weights = 8_030_261_248 * 2
    assert weights / GIB == pytest.approx(14.96, abs=0.005)
    available = usable - weights - 1.26 * GIB - 1.79 * GIB
    assert available / GIB == pytest.approx(53.29, abs=0.005)
    assert pool.per_gpu.kv_pool_bytes == pytest.approx(available)
    block = 16 * 2 * 32 * 8 * 128 * 2  # 16 tokens, all layers: 2 MiB
    assert pool.num_blocks == int(available // block)
    assert pool.max_concurrency == pool.num_blocks / (8192 / 16)
    assert pool.max_sessions == int(pool.num_blocks / 512)


@pytest.mark.parametrize(
    ("model", "blocks", "context", "logged"),
    [
        # Llama-3.1-8B on a 24 GiB GPU (vllm-project/vllm issue #10517): "# GPU blocks: 1952",
        # "Maximum concurrency for 20000 tokens per request: 1.56x"; 1478 blocks at 29000:
        # 0.82x and "the maximum number of tokens that can be stored in KV cache (23648)".
        ("llama-3.1-8b", 1952, 20000, 1.56),
        ("llama-3.1-8b", 1478, 29000, 0.82),
        # Qwen3-14B (LMCache issue #1739): 42,656 tokens; 32,768 per request: 1.30x.
        ("qwen3-14b", 42656 // 16, 32768, 1.30),
        # Llama-3.1-8B on an L40S (vllm-project/vllm PR #17122): 158,656 tokens; 4.84x.
        ("llama-3.1-8b", 158656 // 16, 32768, 4.84),
    ],
)
def test_max_concurrency_matches_vllm_logs(model, blocks, context, logged):
    m = get_model(model)
    block = 16 * bytes_per_token(m, "bf16")
    # Give the pool exactly vLLM's block count (plus change) and read the figures back.
    spec = PoolSpec(model=m, gpu=get_gpu("L40S"), kv_dtype="bf16", weight_dtype="bf16",
                    context_tokens=context, memory_runtime_gib=100.0, weights_gib=0.0,
                    activation_gib=0.0, non_torch_gib=0.0, gpu_memory_utilization=1.0)
    spec = PoolSpec(**{**{f: getattr(spec, f) for f in spec.__slots__},
                       "memory_runtime_gib": (blocks * block + block / 2) / GIB})
    pool = size_pool(spec)
    assert pool.num_blocks == blocks
    assert round(pool.max_concurrency, 2) == logged
    assert pool.tokens_capacity == blocks * 16


def test_sliding_window_blocks_per_request_follow_vllm():
    g = get_model("gemma-2-9b")
    # full layers: ceil(32768/16); sliding: ceil(min(4095 + 8192, 32768)/16) + 1; averaged.
    full, sliding = math.ceil(32768 / 16), math.ceil((4095 + 8192) / 16) + 1
    assert blocks_per_request(g, 32768, 16, 8192) == (full + sliding) / 2


def test_longest_context_for_n_sessions():
    spec = PoolSpec(model=get_model("llama-3.1-8b"), gpu=get_gpu("H100-SXM"))
    pool = size_pool(spec)
    for n in (1, 7, 64):
        ctx = longest_context(spec, n)
        assert ctx == (pool.num_blocks // n) * 16
        assert n * math.ceil(ctx / 16) <= pool.num_blocks < n * math.ceil((ctx + 1) / 16)


def test_pool_errors_and_notes():
    m = get_model("llama-3.1-70b")
    with pytest.raises(InputError, match="multiple of the tensor-parallel size"):
        size_pool(PoolSpec(model=m, gpu=get_gpu("H100-SXM"), num_gpus=3, tp=2))
    p = size_pool(PoolSpec(model=m, gpu=get_gpu("L4"), weight_dtype="bf16"))
    assert p.num_blocks == 0
    assert not p.fits
    assert "nothing is left for KV" in p.notes[0]


def test_pipeline_stages_hold_their_own_layers():
    """tp 4 x pp 2: each GPU holds an eighth of the weights and the KV of its stage's 40
    layers for its 2 of the 8 KV heads; the pool is sized per stage (the fullest)."""
    m = get_model("llama-3.1-70b")
    spec = PoolSpec(model=m, gpu=get_gpu("A100-40GB"), num_gpus=8, tp=4, pp=2,
                    weight_dtype="bf16", activation_gib=1.0, non_torch_gib=2.0)
    pool = size_pool(spec)
    per_token = 40 * 2 * (8 // 4) * 128 * 2  # layers x (K, V) x heads x head_dim x bf16
    assert pool.bytes_per_token_per_gpu == per_token == 40_960
    weights = weights_bytes(m, "bf16")
    assert pool.per_gpu.weights_bytes == pytest.approx(weights / 8)
    available = (pool.per_gpu.usable_bytes - weights / 8 - 1.0 * GIB - 2.0 * GIB)
    assert pool.num_blocks == int(available // (16 * per_token))
    assert pool.replicas == 1
    assert pool.pp == 2
    # 80 layers in 3 stages: the fullest (27) sets the bytes a token
    odd = size_pool(PoolSpec(model=m, gpu=get_gpu("A100-40GB"), num_gpus=3, tp=1, pp=3))
    assert odd.bytes_per_token_per_gpu == pytest.approx(
        bytes_per_token_per_gpu(m, "bf16", 1) * 27 / 80)
    with pytest.raises(InputError, match=r"times the pipeline-parallel size 2"):
        size_pool(PoolSpec(model=m, gpu=get_gpu("A100-40GB"), num_gpus=4, tp=4, pp=2))
    with pytest.raises(InputError, match=r"--pipeline-parallel-size = 81: expected at most "
                                         r"the model's 80 layers"):
        size_pool(PoolSpec(model=m, gpu=get_gpu("A100-40GB"), num_gpus=81, tp=1, pp=81))


def test_local_config_json(tmp_path):
    cfg = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
           "hidden_size": 512, "sliding_window": 128, "vocab_size": 1000,
           "intermediate_size": 1024,
           "layer_types": ["sliding_attention", "full_attention"] * 2}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = get_model(str(path))
    assert m.head_dim == 64
    assert bytes_per_token(m, "fp16") == 2 * 4 * 2 * 64 * 2
    assert session_bytes(m, "fp16", 1000) == (2 * 128 + 2 * 1000) * (2 * 2 * 64 * 2)
    assert m.num_parameters > 0
    assert "estimated" in m.params_source
    (tmp_path / "bad.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(InputError, match="num_hidden_layers"):
        get_model(str(tmp_path / "bad.json"))
    with pytest.raises(InputError, match=r"did you mean 'llama-3\.1-8b'"):
        get_model("llama3.1-8b")
