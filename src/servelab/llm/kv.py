"""KV-cache sizing and pool capacity, counted the way vLLM counts them.

Per token, per layer, a standard or grouped-query attention layer stores one K
and one V vector per KV head::

    2 x kv_heads x head_dim x bytes_per_element

(the 2 is K and V; the element size is its own factor — counting FP16's 2
bytes twice is the seed dashboard's error). An MLA layer (DeepSeek-V2/V3)
stores one latent of ``kv_lora_rank + qk_rope_head_dim`` elements. A
sliding-window layer holds at most its window. Under tensor parallelism each
GPU holds ``max(1, kv_heads // tp)`` heads (replicated when tp exceeds them);
an MLA latent is a full copy on every rank.

The pool follows vLLM's worker: the memory the runtime reports times
``gpu_memory_utilization``, minus the weights on the rank, the activation peak
of a profiling run of ``max_num_batched_tokens``, non-torch memory and any
CUDA-graph reserve; ``num_blocks = available // (block_size x bytes per token
per GPU)``; "maximum concurrency" = ``num_blocks / blocks per request``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servelab.catalog import GpuSpec
from servelab.errors import invalid
from servelab.llm.models import SLIDING, ModelConfig

GIB = 1024**3

# KV element bytes, and bytes of scale per stored vector (per token, per head, per K or V).
# fp8 (e4m3/e5m2) uses per-tensor scales in vLLM: a few bytes per layer, not per token.
# int8/int4 as in LMDeploy's online KV quantization: an fp16 scale and an fp16 zero point
# per token per head, for K and for V.
KV_DTYPES: dict[str, tuple[float, float]] = {
    "fp32": (4.0, 0.0),
    "fp16": (2.0, 0.0),
    "bf16": (2.0, 0.0),
    "fp8": (1.0, 0.0),
    "fp8_e4m3": (1.0, 0.0),
    "fp8_e5m2": (1.0, 0.0),
    "int8": (1.0, 4.0),
    "int4": (0.5, 4.0),
}

# Weight bytes per parameter. fp8 block/channel scales are < 0.1% and left out;
# int4 is AWQ/GPTQ with group size 128: an fp16 scale and a 4-bit zero per group.
WEIGHT_DTYPES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5 + 2.5 / 128,
}

_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def resolve_kv_dtype(kv_dtype: str, model: ModelConfig) -> str:
    """'auto' means the model's dtype, as in vLLM's --kv-cache-dtype auto."""
    d = kv_dtype.lower()
    if d == "auto":
        return _TORCH_DTYPES.get(model.torch_dtype, "bf16")
    if d not in KV_DTYPES:
        raise invalid("--kv-dtype", kv_dtype, f"one of auto, {', '.join(KV_DTYPES)}",
                      "use fp16/bf16, fp8, int8 or int4")
    return d


def kv_heads_per_gpu(model: ModelConfig, tp: int) -> int:
    return max(1, model.num_kv_heads // tp)


def layer_bytes_per_token(model: ModelConfig, kv_dtype: str, tp: int = 1) -> float:
    """Bytes one token occupies in one layer on one GPU (a "page" slot)."""
    elem, scale = KV_DTYPES[resolve_kv_dtype(kv_dtype, model)]
    if model.is_mla:
        assert model.kv_lora_rank is not None
        latent = model.kv_lora_rank + (model.qk_rope_head_dim or 0)
        return latent * elem + scale
    return 2 * kv_heads_per_gpu(model, tp) * (model.head_dim * elem + scale)


def bytes_per_token(model: ModelConfig, kv_dtype: str) -> float:
    """K and V bytes one token holds across all layers, the model as a whole (tp=1)."""
    return model.num_layers * layer_bytes_per_token(model, kv_dtype, 1)


def bytes_per_token_per_gpu(model: ModelConfig, kv_dtype: str, tp: int) -> float:
    return model.num_layers * layer_bytes_per_token(model, kv_dtype, tp)


def tokens_held(model: ModelConfig, context: int) -> list[int]:
    """Token states each layer holds for a sequence of `context` tokens."""
    w = model.sliding_window or context
    return [min(context, w) if kind == SLIDING else context for kind in model.layer_kinds()]


def session_bytes(model: ModelConfig, kv_dtype: str, context: int, tp: int = 1) -> float:
    """Bytes of token states one sequence of `context` tokens holds (per GPU under tp)."""
    return sum(tokens_held(model, context)) * layer_bytes_per_token(model, kv_dtype, tp)


def resolve_weight_dtype(weight_dtype: str, model: ModelConfig) -> str:
    """'auto' is how vLLM loads the checkpoint: a quantized checkpoint's own dtype
    (its config's quantization_config), else the config's torch_dtype."""
    d = weight_dtype.lower()
    if d == "auto":
        d = model.checkpoint_dtype or _TORCH_DTYPES.get(model.torch_dtype, "bf16")
    if d not in WEIGHT_DTYPES:
        raise invalid("--weight-dtype", weight_dtype, f"one of auto, {', '.join(WEIGHT_DTYPES)}",
                      "use bf16, fp8, int8 or int4")
    return d


def weights_bytes(model: ModelConfig, weight_dtype: str) -> float:
    return model.num_parameters * WEIGHT_DTYPES[resolve_weight_dtype(weight_dtype, model)]


def activation_peak_bytes(model: ModelConfig, tp: int, max_num_batched_tokens: int,
                          max_num_seqs: int) -> float:
    """Estimate of vLLM's profiled activation peak.

    A forward pass of ``max_num_batched_tokens`` tokens holds the MLP's gate/up
    output and its activation (3 x intermediate / tp) and a few hidden-size
    tensors (4 x hidden) in 16-bit; the sampler holds fp32 logits, probs and
    logprobs for ``max_num_seqs`` sequences. With vLLM's defaults this gives
    1.27 GiB for Llama-3-8B; vLLM logged 1.19-1.26 GiB for it on 80 GB GPUs
    (vllm-project/vllm PR #10511 and users' logs). Override with a measured value.
    """
    per_token = (3 * model.intermediate_size / tp + 4 * model.hidden_size) * 2
    sampler = max_num_seqs * model.vocab_size * 4 * 3
    return max_num_batched_tokens * per_token + sampler


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """A vLLM deployment of one model. Memory overrides are GiB; None means estimate."""

    model: ModelConfig
    gpu: GpuSpec
    kv_dtype: str = "auto"
    weight_dtype: str = "auto"
    context_tokens: int = 4096
    num_gpus: int = 1
    tp: int = 1
    pp: int = 1  # pipeline stages: a replica is tp x pp GPUs, each stage its share of layers
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    memory_runtime_gib: float | None = None
    weights_gib: float | None = None  # total over all ranks
    activation_gib: float | None = None
    non_torch_gib: float | None = None
    cudagraph_gib: float = 0.0
    num_gpu_blocks_override: int | None = None  # vLLM's flag: the pool's blocks as given
    defaults: tuple[str, ...] = ()  # settings taken from vLLM's defaults for the GPU, said


# Non-torch memory (CUDA context, cuBLAS workspace, NCCL buffers): vLLM logs have shown
# 0.09-1.79 GiB at tp=1 and 3.58 GiB at tp=2 (PR #10511, Llama-3-8B on H100).
NON_TORCH_GIB_TP1 = 0.5
NON_TORCH_GIB_TP = 2.0


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """One GPU's memory, in bytes."""

    runtime_total_bytes: float
    usable_bytes: float  # runtime total x gpu_memory_utilization
    weights_bytes: float  # on this GPU
    activation_bytes: float
    non_torch_bytes: float
    cudagraph_bytes: float
    kv_pool_bytes: float  # available for KV, >= 0
    unused_bytes: float  # the (1 - utilization) share vLLM leaves alone


@dataclass(frozen=True, slots=True)
class PoolReport:
    model: str
    kv_dtype: str
    weight_dtype: str
    context_tokens: int
    tp: int
    replicas: int
    bytes_per_token: float
    bytes_per_token_per_gpu: float
    bytes_per_session: float  # token states of one context-length session, whole model
    bytes_per_session_per_gpu: float
    block_size: int
    block_bytes_per_gpu: float  # one block across all layers of one GPU
    blocks_per_session: int  # as vLLM reserves them for a max-length request
    num_blocks: int  # per replica
    tokens_capacity: int  # per replica
    max_concurrency: float  # vLLM's "Maximum concurrency for N tokens per request"
    max_sessions: int  # whole sessions over all replicas
    weights_bytes: float  # whole model
    per_gpu: MemoryBreakdown
    fits: bool
    notes: tuple[str, ...] = ()
    pp: int = 1  # pipeline stages: each GPU holds its stage's layers' weights and KV


def runtime_total_bytes(gpu: GpuSpec, override_gib: float | None) -> float:
    if override_gib is not None:
        return override_gib * GIB
    return gpu.runtime_memory_gib() * GIB


def blocks_per_request(model: ModelConfig, context: int, block_size: int,
                       max_num_batched_tokens: int) -> float:
    """Blocks vLLM budgets for one max-length request, in units of an all-layer block.

    Full-attention layers need ceil(context / block); a sliding-window layer
    needs ceil(min(window - 1 + max_num_batched_tokens, context) / block) + 1
    (vLLM's SlidingWindowSpec.max_memory_usage_bytes). Layers are averaged,
    since an all-layer block spans every layer.
    """
    per_layer = []
    for kind in model.layer_kinds():
        if kind == SLIDING and model.sliding_window:
            n = min(model.sliding_window - 1 + max_num_batched_tokens, context)
            per_layer.append(math.ceil(n / block_size) + 1)
        else:
            per_layer.append(math.ceil(context / block_size))
    if len(set(per_layer)) == 1:
        return float(per_layer[0])
    return sum(per_layer) / len(per_layer)


def size_pool(p: PoolSpec) -> PoolReport:
    """The KV pool of one deployment, vLLM's way; see the module docstring."""
    m = p.model
    group = p.tp * p.pp
    if p.tp < 1 or p.pp < 1 or p.num_gpus % group:
        raise invalid("--num-gpus/--tp", (p.num_gpus, p.tp),
                      "a GPU count that is a multiple of the tensor-parallel size"
                      + (f" times the pipeline-parallel size {p.pp}" if p.pp > 1 else ""),
                      f"use --num-gpus {group * max(1, p.num_gpus // max(1, group))} or "
                      "change --tp")
    if p.pp > m.num_layers:
        raise invalid("--pipeline-parallel-size", p.pp, f"at most the model's {m.num_layers} "
                      "layers (each stage holds at least one)",
                      f"--pipeline-parallel-size {m.num_layers} or fewer")
    if not 0 < p.gpu_memory_utilization <= 1:
        raise invalid("--gpu-memory-utilization", p.gpu_memory_utilization,
                      "a fraction in (0, 1]", "use e.g. 0.9 (vLLM's default)")
    kv_dtype = resolve_kv_dtype(p.kv_dtype, m)
    w_total = (p.weights_gib * GIB if p.weights_gib is not None
               else weights_bytes(m, p.weight_dtype))
    total = runtime_total_bytes(p.gpu, p.memory_runtime_gib)
    usable = total * p.gpu_memory_utilization
    act = (p.activation_gib * GIB if p.activation_gib is not None
           else activation_peak_bytes(m, p.tp, p.max_num_batched_tokens, p.max_num_seqs))
    non_torch = (p.non_torch_gib if p.non_torch_gib is not None
                 else NON_TORCH_GIB_TP1 if p.tp == 1 else NON_TORCH_GIB_TP) * GIB
    graphs = p.cudagraph_gib * GIB
    w_rank = w_total / group
    available = usable - w_rank - act - non_torch - graphs
    # a stage holds the KV of its own layers; vLLM gives the last stages the layers left
    # over (get_pp_indices) and sizes every stage's pool as the fullest one's
    stage_share = -(-m.num_layers // p.pp) / m.num_layers
    per_tok_gpu = bytes_per_token_per_gpu(m, kv_dtype, p.tp) * stage_share
    block_bytes = p.block_size * per_tok_gpu
    num_blocks = (p.num_gpu_blocks_override if p.num_gpu_blocks_override is not None
                  else max(0, int(available // block_bytes)))
    per_req = blocks_per_request(m, p.context_tokens, p.block_size, p.max_num_batched_tokens)
    concurrency = num_blocks / math.ceil(per_req) if per_req else 0.0
    replicas = p.num_gpus // group
    notes = []
    if p.num_gpu_blocks_override is not None:
        notes.append(f"KV pool: {num_blocks:,} blocks as given (num_gpu_blocks_override, "
                     "vLLM's --num-gpu-blocks-override), not sized from memory")
    elif available <= 0:
        notes.append(f"the weights and reserves need {(-available) / GIB:.2f} GiB more than "
                     "gpu_memory_utilization leaves on each GPU: nothing is left for KV")
    if p.context_tokens > m.max_position_embeddings:
        notes.append(f"context {p.context_tokens:,} exceeds the model's "
                     f"max_position_embeddings ({m.max_position_embeddings:,})")
    if m.num_kv_heads < p.tp and not m.is_mla:
        notes.append(f"tp {p.tp} > {m.num_kv_heads} KV heads: each GPU holds a replica of one "
                     "head, so KV bytes per GPU do not shrink further")
    kv_pool = max(0.0, available)
    return PoolReport(
        model=m.key,
        kv_dtype=kv_dtype,
        weight_dtype=(resolve_weight_dtype(p.weight_dtype, m) if p.weights_gib is None
                      else "given in GiB"),
        context_tokens=p.context_tokens,
        tp=p.tp,
        replicas=replicas,
        bytes_per_token=bytes_per_token(m, kv_dtype),
        bytes_per_token_per_gpu=per_tok_gpu,
        bytes_per_session=session_bytes(m, kv_dtype, p.context_tokens),
        bytes_per_session_per_gpu=session_bytes(m, kv_dtype, p.context_tokens, p.tp)
        * stage_share,
        block_size=p.block_size,
        block_bytes_per_gpu=block_bytes,
        blocks_per_session=math.ceil(per_req),
        num_blocks=num_blocks,
        tokens_capacity=num_blocks * p.block_size,
        max_concurrency=concurrency,
        max_sessions=int(concurrency) * replicas,
        weights_bytes=w_total,
        per_gpu=MemoryBreakdown(
            runtime_total_bytes=total,
            usable_bytes=usable,
            weights_bytes=w_rank,
            activation_bytes=act,
            non_torch_bytes=non_torch,
            cudagraph_bytes=graphs,
            kv_pool_bytes=kv_pool,
            unused_bytes=total - usable,
        ),
        fits=num_blocks >= math.ceil(per_req),
        notes=tuple(notes),
        pp=p.pp,
    )


def longest_context(p: PoolSpec, sessions: int) -> int:
    """The longest context at which `sessions` concurrent sessions fit the pool (0: none)."""
    if sessions < 1:
        raise invalid("--sessions", sessions, "a whole number >= 1", "use e.g. --sessions 32")
    pool = size_pool(p)
    per_replica = math.ceil(sessions / pool.replicas)
    lo, hi = 0, max(p.context_tokens, pool.tokens_capacity) + 1
    # blocks per request never shrink as the context grows: bisect on it.
    while hi - lo > 1:
        mid = (lo + hi) // 2
        need = math.ceil(blocks_per_request(p.model, mid, p.block_size,
                                            p.max_num_batched_tokens))
        if per_replica * need <= pool.num_blocks:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True, slots=True)
class NaivePool:
    """Pool capacity under the seed dashboard's own assumptions: every byte of GPU
    memory not holding weights holds KV, nothing else is reserved."""

    bytes_per_token: float
    bytes_per_session: float
    headroom_bytes: float
    max_sessions: int


def naive_pool(model: ModelConfig, kv_dtype: str, context_tokens: int, num_gpus: int,
               gpu_memory_gb: float, weights_gb: float) -> NaivePool:
    per_token = bytes_per_token(model, kv_dtype)
    per_session = per_token * context_tokens
    headroom = (num_gpus * gpu_memory_gb - weights_gb) * 1e9
    return NaivePool(per_token, per_session, headroom, max(0, int(headroom // per_session)))
