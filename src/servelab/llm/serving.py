"""LLM serving under vLLM v1's scheduler: continuous batching, chunked prefill,
preemption by recompute, prefix caching; the time of each step from a roofline.

The scheduler (vllm/v1/core/sched/scheduler.py, ``Scheduler.schedule``), as modelled:

- Every request has ``num_tokens`` (its prompt plus what it has generated) and
  ``computed`` (tokens whose KV is in the cache). A step gives each scheduled request
  ``min(num_tokens - computed, budget)`` new tokens; when that reaches ``num_tokens`` the
  step samples one more token. So a prefill (possibly in chunks) and a decode (one token)
  are the same rule, as in v1.
- Each step has a token budget ``max_num_batched_tokens``. Running requests go first,
  in admission order; then waiting requests are admitted first-come-first-served while
  budget, ``max_num_seqs`` and free KV blocks allow (the queue's head is never skipped).
  With ``enable_chunked_prefill`` off, a prompt that does not fit the rest of the
  budget waits for a later step.
- KV is allocated in blocks of ``block_size`` tokens, on demand. A running request that
  needs a block when none is free preempts the most recently admitted running request
  (possibly itself): its blocks are freed, its ``computed`` goes back to zero and it
  returns to the front of the queue, to redo its prefill over prompt and output so far
  (recompute). A step that preempted admits no new request.
- Prefix caching: a share of requests (``prefix_hit_share``) starts with the same
  ``prefix_tokens``; their whole blocks are computed once and stay cached (counted once
  against the pool), so those requests start with them computed and do not hold them.
- A request whose prompt and output can never fit the pool is rejected on arrival.
- Arrivals are open (at their drawn times) or, with ``max_concurrency`` C, a closed loop
  as ``vllm bench serve --max-concurrency C`` runs one: a request is sent at its drawn
  time or when one of C slots frees (a request finishes or is rejected), whichever is
  later, first come first served; its TTFT and end-to-end latency count from the send.

Step time (``StepModel``), per GPU of a tensor-parallel group, the layers' GEMMs and
their attention as the separate kernels they are:
  GEMM FLOPs  = 2 x (parameters - embedding - LM head) / tp per scheduled token
                + 2 x LM head / tp per sampled token (a decode, or a prompt's last chunk)
  GEMM bytes  = the weights on the GPU, read once per step
  attn FLOPs  = 4 x layers x heads x head_dim / tp per (token, context token)
  attn bytes  = each scheduled request's cached context, KV bytes per token per GPU
  time  = max(GEMM FLOPs / (peak x compute_efficiency x M / (M + compute_ramp_tokens)),
              GEMM bytes / (HBM bandwidth x memory_efficiency))
          + max(attn FLOPs / (peak x compute_efficiency),
                attn bytes / (HBM bandwidth x memory_efficiency))
          + overhead per step + per_seq per scheduled sequence, for a step of M tokens.
  Each layer runs its GEMMs and then its attention, so a large decode batch whose GEMMs
  are compute-bound still pays for reading its KV cache (``attention_apart``; until
  2026-12-07 one max() over the sums, under which those reads rode free). `overlap`, a
  p-norm in place of each max(), is held at infinity: the max().
  A mixture of experts counts its active parameters for FLOPs (those a token is routed
  through) and for bytes its dense weights and the experts some token of the step was
  routed to (each missed by M tokens with chance (1 - top_k / experts)^M). With tp > 1,
  each layer's two all-reduces add
  2 x layers x 2 (tp - 1) x (latency + tokens x hidden x 2 bytes / tp / (link bandwidth x
  link efficiency)), not overlapped with compute: a ring all-reduce's 2 (tp - 1) steps.
  The latency of a step is vLLM's own all-reduce kernel's, or NCCL's where vLLM falls
  back to it (more than two PCIe-only GPUs).
  Each request also spends `frontend_ms` outside the steps (HTTP out, the first
  detokenize) and `intake_ms` + `intake_per_token_us` a prompt token in the API
  server's one loop, which queues (a burst waits for the loop to take all of it:
  intake_times), added to its TTFT and end-to-end
  latency. The constants (``StepParams``) are fitted to published
  vLLM and SGLang runs (llm/published.py, bench/fit_published_llm.py); `llm fit` fits
  them to a user's own.
Or a measured step profile (``ProfileStepModel``): step_ms fitted to prefill tokens,
decode sequences and KV tokens read from a user's own steps.
With ``prefill_first`` (vLLM V0 without chunked prefill, SGLang's default), a step that
can admit a waiting prompt runs only whole new prompts; the decodes wait for it.
With ``num_scheduler_steps`` K > 1 as well (vLLM 0.6's multi-step scheduling,
``--num-scheduler-steps``; vllm/core/scheduler.py gives a prompt step 1 step and a decode
step K: ``_get_num_lookahead_slots``, and ``LLMEngine._has_remaining_steps`` skips the
scheduler until a group's steps are done): a step of decodes alone starts a group of K
such steps, during which no prompt is admitted (arrivals wait for the group's end), and
the tokens a group makes reach the client together at its end (its streams carry K
tokens a chunk). A prompt step is one step, its first token sent at once. A request
whose last token comes mid-group is done at the group's end and until then stays in the
batch: the GPU runs the group's K steps on the batch it began with, a token each, and the
host drops the tokens past max_tokens afterwards (vllm/engine/output_processor/
multi_step.py, "Truncate to max_tokens if necessary"); its blocks are freed then too.
With ``reserve_output`` (SGLang 0.3's loop, ``--scheduler sglang``; with prefill_first):
SGLang reserves room for what its running requests will still write. A waiting prompt
comes in only while its prompt and whole output, the ones admitted before it in this
step likewise, and the running requests' remaining output x ``new_token_ratio`` fit
below the free cache (sglang/srt/managers/tp_worker.py ``get_new_prefill_batch``,
policy_scheduler.py ``PrefillAdder``); into an empty cache one comes anyway. The ratio is
0.7 at the start and when idle, and falls 0.001 a decode step to 0.1. A decode step whose
tokens do not fit the cache retracts requests (schedule_batch.py ``retract_decode``): the
fewest output tokens first (then the longest prompt), until the rest have room for 20
steps each; the retracted go to the back of the queue and recompute their prompt and
output so far, and the ratio becomes the rest's (tokens made + 20 each) / their output,
at most 1. Simplifications: the cache is counted in blocks (``block_size`` 1 is SGLang's
token pool); SGLang's exact check for ignore_eos requests, which admits more where its
ratio check says no, is left out.
With ``pipeline_parallel_size`` pp > 1 (vLLM's --pipeline-parallel-size, V1's scheduler
only): the layers are in pp stages and, as vLLM V1's ``EngineCore.step_with_batch_queue``
does, the host schedules a batch and hands it on at once while fewer than pp are in flight;
with pp in flight, or nothing left to schedule, it waits for the oldest batch's tokens. A
request is in one batch at a time (the scheduler skips ``scheduled_req_ids``). A batch
passes the stages in order, each once the batch ahead has left it: the pass's time split
evenly (``StepModel.stages``), a send between stages. So each token of a request is a
whole pass; more than one batch is under way only where requests came while one was.
Left out and stated: CUDA graphs' padding, speculative decoding, expert-parallel
all-to-all (experts are split by tensor parallelism).

Decode runs (how, not what): where every running request is decoding and until one of
them finishes, a request arrives, a waiting one could be admitted or a block could run
short, the steps are decodes alone whose only change is one more KV token per request.
`simulate_serving` takes such a run at once: it prices and samples each step as the
step-by-step loop does, in the same order (so the result is equal to the bit, a test
holds it), and does the per-request bookkeeping once for the run.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from servelab.catalog import GpuSpec
from servelab.errors import invalid
from servelab.llm.kv import (
    PoolSpec,
    bytes_per_token_per_gpu,
    resolve_kv_dtype,
    size_pool,
    weights_bytes,
)
from servelab.report import jsonable
from servelab.scenario import MAX_PIPELINE_STAGES, MAX_SCHEDULER_STEPS
from servelab.search import fewest_meeting

MAX_REQUESTS = 1_000_000
MAX_CONCURRENCY = 100_000
MAX_TOKENS_PER_REQUEST = 10_000_000
MAX_STEPS = 20_000_000
DECODE_RUN_MIN = 2  # steps a decode run must be able to take (`simulate_serving`)
DECODE_RUN_BACKOFF = 64  # steps at most between tries where runs keep failing
MAX_TOTAL_TOKENS = 100_000_000  # prompt + output over all requests: about 80 s to simulate
KV_SAMPLES = 2_000  # points of the KV-usage series kept (evenly thinned)
# SGLang 0.3's admission and retraction (--scheduler sglang; sglang/global_config.py,
# srt/managers/tp_worker.py, schedule_batch.py retract_decode): the running requests'
# remaining max_tokens count at new_token_ratio, 0.7 at the start, 0.001 less each decode
# step down to 0.1; a retraction leaves each remaining request room for 20 more steps
SGLANG_INIT_NEW_TOKEN_RATIO = 0.7
SGLANG_MIN_NEW_TOKEN_RATIO = 0.1
SGLANG_NEW_TOKEN_RATIO_DECAY = 0.001
SGLANG_RETRACT_DECODE_STEPS = 20
# The roofline's constants (StepParams' defaults), fitted by bench/fit_published_llm.py to
# the published vLLM and SGLang runs marked "fit" in servelab/data/published_llm.toml:
# first 2026-12-01 (rms log error 0.035 over 10 figures), then jointly again 2026-12-06
# with Lambda's ten-prompt H100 runs among the fit cases (25 figures, rms log error 0.043;
# `--only compute_efficiency compute_ramp_tokens memory_efficiency overhead_ms
# prefill_first_overhead_ms per_seq_ms intake_ms intake_per_token_us frontend_ms
# allreduce_latency_us --max-evals 300`, started near a first joint fit's values;
# docs/llm.md), and the same way again 2026-12-07 once a layer's attention was priced
# apart from its GEMMs and SGLang's runs had its own admission and batch limit (25
# figures, started from the earlier values, `llm fit`'s finite differences 2% of a range:
# rms log error 0.0447, 0.0462 as rounded here; with 5% differences 0.0455; one roofline
# over both, refitted with 5%, 0.0487). A step of M tokens reaches 0.644 x M / (M + 108)
# of peak FLOPs: 0.60 for a prefill of 1,369 tokens, 0.42 for a chunk of 200 (norms, activations
# and sampling beside the GEMMs, which reached 0.69-0.77 alone on an H200,
# bench/device/results/); weights and KV are read at 0.86 of HBM bandwidth (the GEMMs:
# 0.71-0.82). Fitted free within 1-8 (2026-12-01), the p-norm's p went to its bound: the
# larger of the two sides (max) is the default; freed again beside the ramp (2026-12-06)
# it went to 4 and fitted worse.
COMPUTE_EFFICIENCY = 0.6443
COMPUTE_RAMP_TOKENS = 107.6
MEMORY_EFFICIENCY = 0.8615
OVERHEAD_MS = 0.8951  # a step of vLLM V1 (0.21-0.23)
PREFILL_FIRST_OVERHEAD_MS = 1.677  # a step of vLLM 0.6.0 (multi-step) and SGLang 0.3.0
PER_SEQ_MS = 0.02932
OVERLAP = math.inf
# A ring all-reduce over tp GPUs takes 2 (tp - 1) steps, each a latency plus its share of
# the bytes (Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
# workstations", JPDC 2009; NCCL's and vLLM's kernels differ, the count of steps stands
# for how the synchronisation grows with the group). The latency of one step, fitted
# 2026-12-01 as 37.91 us a whole all-reduce at tp 4 (H100 NVLink), that over 6 steps
# (6.318); refitted alone on the "fit" cases 2026-12-06 once the API server's intake was
# in (5.81), and with the rest in the joint refit the same day (4.597) and 2026-12-07:
ALLREDUCE_LATENCY_US = 4.664
# vLLM's own (custom) all-reduce kernel needs NVLink between every pair of GPUs, or at most
# two GPUs: "Custom allreduce is disabled because it's not supported on more than two
# PCIe-only GPUs" (vllm/distributed/device_communicators/custom_all_reduce.py), and NCCL
# does the all-reduces instead. Its latency is fitted to the one published case on that
# path (Llama 3.3 70B, tp 4 on four A100 PCIe, ShareGPT at 1/s, the "fit" case
# vllm-70b-a100pcie-tp4-r1 in servelab/data/published_llm.toml): bench/fit_published_llm.py
# --only nccl_allreduce_latency_us --cases vllm-70b-a100pcie-tp4-r1. 24.5 us a step
# (147 us a whole all-reduce at tp 4) on 2026-12-03; 20.91 us (125 us) since 2026-12-06,
# when each draw of that case was first held to the run's own mean prompt and output
# lengths and averaged over 16 draws (published.py). Fitting the link's efficiency beside
# it put the held-out 4/s case at +36..+43%, so the bandwidth term stays as it is.
NCCL_ALLREDUCE_LATENCY_US = 20.91
# Pipeline parallelism: the fixed cost of one stage's send to the next. Fitted alone on the
# one published pipeline-parallel run at light load (Llama 3.3 70B, tp 4 x pp 2 over two
# machines of A100 40GB, ShareGPT at 1/s: the "fit" case vllm-70b-a100-40-tp4pp2-r1 in
# servelab/data/published_llm.toml; bench/fit_published_llm.py --only pp_hop_ms --cases
# vllm-70b-a100-40-tp4pp2-r1 --max-evals 40, 2026-12-06). A send of a few hundred KB over
# NVLink or InfiniBand takes tens of microseconds: this is all that deployment's passes cost
# beyond the stages' own time (Ray between the machines, the network), not a link's latency.
PP_HOP_MS = 10.33
# a GPU-to-GPU link below this (GB/s, one direction) is PCIe: NVLink starts at 150
PCIE_MAX_GBPS = 100.0
# A request outside the steps: the API server's intake (INTAKE_MS and INTAKE_PER_TOKEN_US
# a prompt token, which queue) and the rest (FRONTEND_MS: HTTP out, the first detokenize),
# fitted in the joint refit of 2026-12-06. vLLM 0.6.0's first token of a 320-prompt burst
# came 1.05 s after the send on one H100 (LambdaLabsML/vllm-benchmark results/prompt_320,
# the tp 1 run, a "fit" case), every request at once, where ten of the same prompts at
# once on the same host took 62 ms in all (results/prompt_10): 3.1 ms a request for the
# burst's 194-token prompts, too much for ten of 137. A cost a token fits both (the
# burst's 62,000 prompt tokens, the ten's 1,369).
INTAKE_MS = 0.3759
INTAKE_PER_TOKEN_US = 11.14
FRONTEND_MS = 16.69
Z99 = 2.3263478740408408


@dataclass(frozen=True, slots=True)
class StepParams:
    """The roofline's stated constants: what `llm fit` fits and the published cases set
    (servelab/data/published_llm.toml, docs/llm.md)."""

    compute_efficiency: float = COMPUTE_EFFICIENCY
    # A step's compute side costs this many tokens more than it runs: compute efficiency
    # compute_efficiency x M / (M + this) for a step of M tokens (0: flat). A decode-only
    # step pays it too: where its weights are read fast (FP8 weights on an A100, which
    # computes in BF16) its compute side then binds, which the measurement does not
    # (docs/llm.md); sparing decode steps lost the A100 bursts' throughput instead
    compute_ramp_tokens: float = COMPUTE_RAMP_TOKENS
    memory_efficiency: float = MEMORY_EFFICIENCY
    # The KV cache's reads apart from the weights': attention gathers the KV per sequence
    # (on an H200 PyTorch's kernels read it at 0.46-0.62 of HBM bandwidth,
    # bench/device/results/steps/). None: the weights' memory_efficiency. Fitted apart to
    # the published runs it went to 0.52 and the hold-out cases got no better (docs/llm.md)
    kv_memory_efficiency: float | None = None
    overhead_ms: float = OVERHEAD_MS
    # the same for the prefill-first engines (vLLM 0.6.0, SGLang 0.3.0), whose loop
    # spent more time outside the GPU a step than vLLM V1's
    prefill_first_overhead_ms: float = PREFILL_FIRST_OVERHEAD_MS
    per_seq_ms: float = PER_SEQ_MS
    overlap: float = OVERLAP
    allreduce_latency_us: float = ALLREDUCE_LATENCY_US
    # the same through NCCL: more than two GPUs joined only by PCIe (`nccl_allreduce`)
    nccl_allreduce_latency_us: float = NCCL_ALLREDUCE_LATENCY_US
    link_efficiency: float = 0.7
    # pipeline parallelism: the fixed cost of one stage's send to the next
    pp_hop_ms: float = PP_HOP_MS
    # Outside the steps: HTTP, tokenizing, queuing for the engine loop, the first token's
    # detokenizing. Added to each request's TTFT and end-to-end latency (`llm validate`
    # measures the same on a live server).
    frontend_ms: float = FRONTEND_MS
    # The API server's intake: one event loop takes each arriving request (HTTP,
    # tokenizing) for this long, and the requests it took while busy reach the engine
    # together when it is next free (intake_times). Added to TTFT and end-to-end latency
    # beside frontend_ms; 0: none (open loops only: a closed loop's few clients never
    # wait on it).
    intake_ms: float = INTAKE_MS
    # and this much more for each token of its prompt (parsing, tokenizing)
    intake_per_token_us: float = INTAKE_PER_TOKEN_US
    # A layer's GEMMs and its attention each a roofline of their own, the two added (the
    # default since 2026-12-07); False: one roofline over both, as the model had it before
    # (docs/llm.md compares the two)
    attention_apart: bool = True

    @property
    def kv_read_efficiency(self) -> float:
        """The KV cache's share of HBM bandwidth: its own, or the weights'."""
        return (self.memory_efficiency if self.kv_memory_efficiency is None
                else self.kv_memory_efficiency)

    def check(self) -> None:
        for name, v, lo, hi in (("--compute-efficiency", self.compute_efficiency, 1e-3, 1.0),
                                ("--compute-ramp-tokens", self.compute_ramp_tokens, 0.0,
                                 100_000.0),
                                ("--memory-efficiency", self.memory_efficiency, 1e-3, 1.0),
                                ("--kv-memory-efficiency", self.kv_read_efficiency, 1e-3,
                                 1.0),
                                ("--overhead-ms", self.overhead_ms, 0.0, 1000.0),
                                ("--prefill-first-overhead-ms",
                                 self.prefill_first_overhead_ms, 0.0, 1000.0),
                                ("--per-seq-ms", self.per_seq_ms, 0.0, 100.0),
                                ("--overlap", self.overlap, 1.0, math.inf),
                                ("--allreduce-latency-us", self.allreduce_latency_us, 0.0,
                                 1e5),
                                ("--nccl-allreduce-latency-us",
                                 self.nccl_allreduce_latency_us, 0.0, 1e5),
                                ("--link-efficiency", self.link_efficiency, 1e-3, 1.0),
                                ("--pp-hop-ms", self.pp_hop_ms, 0.0, 1000.0),
                                ("--frontend-ms", self.frontend_ms, 0.0, 60_000.0),
                                ("--intake-ms", self.intake_ms, 0.0, 1000.0),
                                ("--intake-per-token-us", self.intake_per_token_us, 0.0,
                                 10_000.0)):
            if math.isnan(v) or not lo <= v <= hi:
                raise invalid(name, v, f"a number from {lo:g} to {hi:g}",
                              f"give {name} within that range")


def intake_times(arrival_s: np.ndarray, cost_s: float | np.ndarray) -> np.ndarray:
    """When each request reaches the engine through an API server's one event loop: the
    loop takes requests in arrival order, each for its `cost_s` (one figure, or one a
    request: HTTP, parsing and tokenizing, which grow with the prompt), and every request
    it took while busy goes on when it is next free, at the end of that busy stretch (each
    handler runs to its first wait before the engine's task gets a turn). Requests seconds
    apart go on their cost after they came; a burst at once goes on together, the sum of
    its costs later: vLLM 0.6.0's first tokens of a 320-prompt burst came 1.0 s after the
    send on an H100 host and 1.9-2.4 s on A100 hosts, all at once (docs/llm.md). One pass
    over the requests in arrival order; the result in the order given."""
    order = np.argsort(arrival_s, kind="stable")
    a = arrival_s[order].astype(np.float64)
    cost = np.broadcast_to(np.asarray(cost_s, np.float64), a.shape)[order]
    went = np.empty_like(a)
    n, i = a.size, 0
    while i < n:
        t = float(a[i]) + float(cost[i])  # the loop starts on request i, idle before it
        j = i + 1
        while j < n and a[j] <= t:  # came while busy: taken next, then all go on at t
            t += float(cost[j])
            j += 1
        went[i:j] = t
        i = j
    out = np.empty_like(went)
    out[order] = went
    return out


@dataclass(frozen=True, slots=True)
class StepModel:
    """A step's time on one tensor-parallel group (figures per GPU): a roofline, plus the
    tensor-parallel all-reduces a step makes."""

    weight_bytes: float
    kv_bytes_per_token: float
    flops_per_token: float
    attn_flops_per_context_token: float
    peak_flops: float
    hbm_bytes_per_s: float
    compute_efficiency: float = COMPUTE_EFFICIENCY
    compute_ramp_tokens: float = 0.0  # the compute side's extra tokens a step
    memory_efficiency: float = MEMORY_EFFICIENCY
    kv_memory_efficiency: float | None = None  # None: memory_efficiency
    overhead_s: float = 0.0005
    tp: int = 1
    allreduces_per_step: int = 0  # two per layer (after attention, after the MLP)
    allreduce_bytes_per_token: float = 0.0  # the hidden state each all-reduce sums
    link_bytes_per_s: float = 0.0  # GPU-to-GPU, one direction
    link_efficiency: float = 0.7
    allreduce_latency_s: float = 0.000006
    # How the two sides combine: (compute^p + memory^p)^(1/p). inf is the plain max();
    # finite p charges a step near the ridge for both (measured GEMMs there ran 29-34%
    # slower than the max, docs/llm.md)
    overlap: float = math.inf
    per_seq_s: float = 0.0  # per scheduled sequence: sampling, scheduler, detokenizing
    lm_head_flops: float = 0.0  # per sampled token (the LM head runs for those only)
    # pipeline parallelism: what one stage sends the next (hidden state and residual) per
    # token, and the fixed cost of a send; the bytes go over link_bytes_per_s
    hop_bytes_per_token: float = 0.0
    hop_latency_s: float = 0.0
    # A mixture of experts: of weight_bytes, its routed experts' (per GPU), and the share of
    # them one token goes to (top-k of E). vLLM's fused MoE kernel reads only the experts
    # that some token of the step was routed to: with routing spread evenly, an expert is
    # missed by all of a step's M tokens with chance (1 - k/E)^M, and those bytes are not
    # read (Mixtral's top-2 of 8 at 2 tokens reads 44% of its experts; DeepSeek-V3's top-8
    # of 256 at 10 tokens, 27%). Uneven routing touches fewer, so this reads at most.
    routed_bytes: float = 0.0
    expert_share: float = 0.0
    # the GEMMs' roofline plus attention's (per-layer kernels, module docstring); False:
    # one roofline over both (the form until 2026-12-07)
    attention_apart: bool = True

    kind = "roofline"

    def step_s(self, tokens: int, attn_context: float, kv_tokens_read: float,
               decode_seqs: int = 0, seqs: int = 0) -> float:
        """`seqs` scheduled sequences each sample a token (a prompt's last chunk or a
        decode); 0 counts the decodes."""
        seqs = seqs or decode_seqs
        weights = self.weight_bytes
        if self.routed_bytes:
            weights -= self.routed_bytes * (1.0 - self.expert_share) ** tokens
        per_flop = 1.0 / (self.peak_flops * self.compute_efficiency)
        gemm = (tokens * self.flops_per_token + seqs * self.lm_head_flops) * per_flop
        if tokens and self.compute_ramp_tokens:
            gemm *= (tokens + self.compute_ramp_tokens) / tokens
        attn = attn_context * self.attn_flops_per_context_token * per_flop
        w = weights / (self.memory_efficiency * self.hbm_bytes_per_s)
        kv = kv_tokens_read * self.kv_bytes_per_token / (self.kv_read_efficiency
                                                         * self.hbm_bytes_per_s)
        if self.attention_apart:
            both = self._combine(gemm, w) + self._combine(attn, kv)
        else:  # the ramp on attention's FLOPs too, as the one roofline had it
            ramp = (tokens + self.compute_ramp_tokens) / tokens if tokens else 1.0
            both = self._combine(gemm + attn * ramp, w + kv)
        return both + self.overhead_s + seqs * self.per_seq_s + self.allreduce_s(tokens)

    def _combine(self, compute: float, memory: float) -> float:
        """A roofline's two sides: the larger, or their `overlap`-norm."""
        hi = max(compute, memory)
        if math.isinf(self.overlap) or hi <= 0:
            return hi
        p = self.overlap
        return hi * float(((compute / hi) ** p + (memory / hi) ** p) ** (1 / p))

    @property
    def kv_read_efficiency(self) -> float:
        """The KV cache's share of HBM bandwidth: its own, or the weights'."""
        return (self.memory_efficiency if self.kv_memory_efficiency is None
                else self.kv_memory_efficiency)

    def stages(self, step_s: float, tokens: int, seqs: int,
               pp: int) -> tuple[float, float, float, float]:
        """A step whose time as one pass is `step_s`, cut into `pp` pipeline stages of
        equal layers: (the host's part before the GPUs, each stage's part, a send from one
        stage to the next, the sampling after the last). The host schedules
        (overhead) and samples (per sequence) once a step; the layers' reads, FLOPs and
        all-reduces split evenly over the stages."""
        host, tail = self.overhead_s, seqs * self.per_seq_s
        hop = self.hop_latency_s + (tokens * self.hop_bytes_per_token
                                    / (self.link_bytes_per_s * self.link_efficiency)
                                    if self.link_bytes_per_s else 0.0)
        return host, max(0.0, step_s - host - tail) / pp, hop, tail

    def allreduce_s(self, tokens: int) -> float:
        """A ring all-reduce moves 2 (tp - 1) / tp of the data through each GPU's link; each
        also pays a fixed latency. Not overlapped with compute (vLLM does not)."""
        if self.tp <= 1 or self.allreduces_per_step == 0:
            return 0.0
        moved = 2.0 * (self.tp - 1) / self.tp * tokens * self.allreduce_bytes_per_token
        return self.allreduces_per_step * (
            self.allreduce_latency_s + moved / (self.link_bytes_per_s * self.link_efficiency))

    @classmethod
    def roofline(cls, spec: PoolSpec, params: StepParams | None = None,
                 prefill_first: bool = False) -> StepModel:
        """FLOPs count the parameters a token passes through (a mixture of experts' active
        ones) less the embedding table (a lookup, not a GEMM) and the LM head, which runs
        only for the tokens a step samples; bytes count every weight (a batch of tokens
        touches nearly every expert)."""
        p = params or StepParams()
        p.check()
        m, g, tp = spec.model, spec.gpu, spec.tp
        head = float(m.vocab_size) * m.hidden_size
        # an untied model holds the table twice (embedding, LM head); a tied one once
        gemm_params = max(m.parameters_per_token - 2 * head, 0.5 * m.parameters_per_token)
        kv_dtype = resolve_kv_dtype(spec.kv_dtype, m)
        w = (spec.weights_gib * 2**30 if spec.weights_gib is not None
             else weights_bytes(m, spec.weight_dtype))
        fp8 = spec.weight_dtype in ("fp8",) or m.checkpoint_dtype == "fp8"
        peak = (g.fp8_dense_tflops if fp8 and g.fp8_dense_tflops else g.bf16_dense_tflops)
        if (tp > 1 or spec.pp > 1) and not g.interconnect_gbps:
            flag = "--tp" if tp > 1 else "--pipeline-parallel-size"
            raise invalid(flag, tp if tp > 1 else spec.pp, f"1 on {g.key}: the catalog has "
                          "no GPU-to-GPU bandwidth for it",
                          f"set [hardware] interconnect_gbps, or {flag} 1")
        return cls(
            weight_bytes=w / tp,
            kv_bytes_per_token=bytes_per_token_per_gpu(m, kv_dtype, tp),
            flops_per_token=2.0 * gemm_params / tp,
            lm_head_flops=2.0 * head / tp,
            attn_flops_per_context_token=4.0 * m.num_layers * m.num_attention_heads
            * m.head_dim / tp,
            peak_flops=peak * 1e12,
            hbm_bytes_per_s=g.hbm_bandwidth_tbps * 1e12,
            compute_efficiency=p.compute_efficiency,
            compute_ramp_tokens=p.compute_ramp_tokens,
            memory_efficiency=p.memory_efficiency,
            kv_memory_efficiency=p.kv_memory_efficiency,
            overhead_s=(p.prefill_first_overhead_ms if prefill_first else p.overhead_ms)
            / 1e3,
            per_seq_s=p.per_seq_ms / 1e3,
            overlap=p.overlap,
            attention_apart=p.attention_apart,
            tp=tp,
            allreduces_per_step=2 * m.num_layers if tp > 1 else 0,
            allreduce_bytes_per_token=2.0 * m.hidden_size,  # bf16 activations
            link_bytes_per_s=(g.interconnect_gbps or 0.0) * 1e9,
            link_efficiency=p.link_efficiency,
            allreduce_latency_s=2 * (tp - 1) * (p.nccl_allreduce_latency_us
                                                if nccl_allreduce(tp, g)
                                                else p.allreduce_latency_us) / 1e6,
            # vLLM sends the hidden state and the residual, bf16, stage to stage
            hop_bytes_per_token=2 * 2.0 * m.hidden_size if spec.pp > 1 else 0.0,
            hop_latency_s=p.pp_hop_ms / 1e3 if spec.pp > 1 else 0.0,
            routed_bytes=(w / tp * m.routed_expert_parameters / m.num_parameters
                          if m.num_routed_experts else 0.0),
            expert_share=(m.experts_per_token / m.num_routed_experts
                          if m.num_routed_experts else 0.0),
        )


def nccl_allreduce(tp: int, gpu: GpuSpec) -> bool:
    """Whether vLLM all-reduces through NCCL rather than its own kernel: more than two GPUs
    joined only by PCIe (a link under PCIE_MAX_GBPS). Pairs of GPUs joined by NVLink bridges
    are not a full mesh either, but the catalog cannot tell them from NVLink."""
    return tp > 2 and (gpu.interconnect_gbps or 0.0) < PCIE_MAX_GBPS


PROFILE_COLUMNS = ("prefill_tokens", "decode_seqs", "kv_tokens_read", "step_ms")
# optional: the passes over the model a row made, and of those the ones of 2+ tokens
# (llama.cpp's ubatches); without them each row is one pass
PROFILE_PASS_COLUMNS = ("passes", "multi_token_passes")
MAX_PROFILE_ROWS = 1_000_000


@dataclass(frozen=True, slots=True)
class ProfileStepModel:
    """Step time from a measured profile (e.g. a vLLM log's steps): a CSV of prefill_tokens,
    decode_seqs, kv_tokens_read and step_ms, fitted by least squares in relative error
    (steps span 10 ms decodes to 500 ms prefills) to step_ms = base + per prefill token +
    per decode sequence + per KV token read, each term at least 0 (non-negative least
    squares, SciPy's `nnls`), plus `multi_token_ms` on every step of two or more tokens
    where the profile has steps of one token and of more to tell it from the base. llama.cpp
    on a CPU runs a one-token batch through ggml's matrix-vector kernels and two or more
    through its matrix kernels: one decode stream's step took 4.2 ms, two streams' 12.5 ms
    and four's 14.2 ms (a 100 MB F16 model, one thread, docs/llm-measure.md), a jump no
    per-sequence cost fits. Measured steps are scattered, not a grid, so they are fitted,
    not interpolated; the fit's error on the profile itself is kept and reported."""

    base_ms: float
    per_prefill_token_ms: float
    per_decode_seq_ms: float
    per_kv_token_ms: float
    rows: int
    max_abs_error_pct: float
    source: str
    multi_token_ms: float = 0.0  # more on a step of two or more tokens than on one of one
    # more on the 1st, 2nd, ... step of decodes alone after a step with prompt tokens
    # (measured by `llm validate`; llm/llama_cpp.py adds them)
    after_prefill_ms: tuple[float, ...] = ()

    kind = "profile"

    def step_s(self, tokens: int, attn_context: float, kv_tokens_read: float,
               decode_seqs: int = 0, seqs: int = 0) -> float:
        return self.row_ms(tokens - decode_seqs, decode_seqs, kv_tokens_read, 1,
                           tokens >= 2) / 1e3

    def stages(self, step_s: float, tokens: int, seqs: int,
               pp: int) -> tuple[float, float, float, float]:
        """StepModel.stages for a measured step: its time split evenly, nothing apart."""
        return 0.0, step_s / pp, 0.0, 0.0

    def row_ms(self, prefill: float, decodes: float, kv: float, passes: float = 1,
               multi_passes: float = 1) -> float:
        """A profile row's time: `passes` over the model (`multi_passes` of 2+ tokens)
        holding these prefill tokens, decodes and KV tokens read in all."""
        return (self.base_ms * passes + self.per_prefill_token_ms * prefill
                + self.per_decode_seq_ms * decodes + self.per_kv_token_ms * kv
                + self.multi_token_ms * multi_passes)

    @classmethod
    def fit(cls, prefill: np.ndarray, decode: np.ndarray, kv: np.ndarray, step_ms: np.ndarray,
            source: str = "", relative: bool = False, passes: np.ndarray | None = None,
            multi_passes: np.ndarray | None = None) -> ProfileStepModel:
        """Least squares, in ms or (`relative`) in each step's share of its own time: the
        latter when steps span orders of magnitude (10 ms decodes beside 500 ms prefills),
        where plain least squares lets the long steps set the short ones' intercept.

        A row may be several passes over the model (llama.cpp's ubatches, llm/llama_cpp.py):
        `passes` of them, `multi_passes` of two or more tokens, each paying the base and
        the multi-token term, its other features summed over them. Default: one pass."""
        n_pass = np.ones(prefill.size) if passes is None else np.asarray(passes, np.float64)
        multi = (np.asarray((prefill + decode >= 2), np.float64) if multi_passes is None
                 else np.asarray(multi_passes, np.float64))
        x = np.column_stack([n_pass, prefill, decode, kv, multi]).astype(np.float64)
        y = np.asarray(step_ms, dtype=np.float64)
        w = 1.0 / np.maximum(y, 1e-9) if relative else np.ones_like(y)
        # the multi-token term only where passes of one token and longer ones both were
        # seen: otherwise it cannot be told from the base
        keep = [0, 1, 2, 3, 4] if (multi > 0).any() and (multi < n_pass).any() else [0, 1, 2, 3]
        from scipy.optimize import nnls  # here: the simulator alone never needs SciPy

        coef = np.zeros(5)
        if y.size:  # least squares with every term at least 0 (Lawson and Hanson)
            coef[keep], _ = nnls(x[:, keep] * w[:, None], y * w)
        err = np.abs(x @ coef - y) / np.maximum(y, 1e-9)
        return cls(float(coef[0]), float(coef[1]), float(coef[2]), float(coef[3]),
                   rows=int(y.size),
                   max_abs_error_pct=float(err.max() * 100) if y.size else 0.0, source=source,
                   multi_token_ms=float(coef[4]))

    @classmethod
    def from_csv(cls, path: str) -> ProfileStepModel:
        """Read and fit a step profile; every problem is one clear line."""
        from servelab.files import read_csv_columns

        cols = read_csv_columns(path, "--step-profile", PROFILE_COLUMNS,
                                max_rows=MAX_PROFILE_ROWS, optional=PROFILE_PASS_COLUMNS)
        prefill, decode, kv, ms = (cols[c] for c in PROFILE_COLUMNS)
        passes, multi = (cols.get(c) for c in PROFILE_PASS_COLUMNS)
        if (passes is None) != (multi is None):
            raise invalid("--step-profile", path, "both of passes and multi_token_passes, "
                          "or neither", "add the missing column or drop the other")
        for name, v in zip(PROFILE_COLUMNS + PROFILE_PASS_COLUMNS,
                           (prefill, decode, kv, ms, passes, multi), strict=True):
            if v is not None and not (np.isfinite(v).all() and (v >= 0).all()):
                raise invalid(f"--step-profile column {name}", path, "finite numbers >= 0",
                              "fix or drop the rows with negative or missing values")
        if passes is not None and multi is not None and not (
                (passes >= 1).all() and (multi <= passes).all()):
            raise invalid("--step-profile column passes", path, "at least 1 a row, and "
                          "multi_token_passes at most passes", "fix those rows")
        if ms.size < 4 or not (ms > 0).all():
            raise invalid("--step-profile", path, "at least 4 steps, each step_ms > 0",
                          "record more steps (prefills and decodes at several batch sizes)")
        if not ((prefill > 0).any() and (decode > 0).any()):
            raise invalid("--step-profile", path, "steps with prefill tokens and steps with "
                          "decode sequences", "record both kinds of step")
        return cls.fit(prefill, decode, kv, ms, source=path, relative=True, passes=passes,
                       multi_passes=multi)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    num_blocks: int  # KV blocks of one replica
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    prefix_tokens: int = 0
    prefix_hit_share: float = 0.0
    # vLLM V0 without chunked prefill and SGLang by default: a step that can admit a
    # waiting prompt runs only new prompts (whole); running decodes wait for it
    prefill_first: bool = False
    # vLLM 0.6's --num-scheduler-steps (with prefill_first): decodes in groups of this
    # many steps, prompts admitted and tokens sent only between groups (module docstring)
    num_scheduler_steps: int = 1
    # vLLM's --pipeline-parallel-size: the model's layers in this many stages, as many
    # batches in flight at once (V1's batch queue; module docstring)
    pipeline_parallel_size: int = 1
    # SGLang's admission and retraction (with prefill_first; module docstring): a prompt
    # comes in only while the cache holds it, its output and the running requests'
    # remaining output x new_token_ratio; a decode step that finds the cache full
    # retracts requests to the back of the queue
    reserve_output: bool = False

    def check(self) -> None:
        for name, v, lo, hi in (("num_blocks", self.num_blocks, 1, 100_000_000),
                                ("--block-size", self.block_size, 1, 1024),
                                ("--max-num-seqs", self.max_num_seqs, 1, 100_000),
                                ("--max-num-batched-tokens", self.max_num_batched_tokens, 1,
                                 10_000_000),
                                ("--prefix-tokens", self.prefix_tokens, 0,
                                 MAX_TOKENS_PER_REQUEST),
                                ("--num-scheduler-steps", self.num_scheduler_steps, 1,
                                 MAX_SCHEDULER_STEPS),
                                ("--pipeline-parallel-size", self.pipeline_parallel_size, 1,
                                 MAX_PIPELINE_STAGES)):
            if not lo <= v <= hi:
                raise invalid(name, v, f"a whole number from {lo:,} to {hi:,}",
                              f"give {name} within that range")
        if not 0 <= self.prefix_hit_share <= 1:
            raise invalid("--prefix-hit-share", self.prefix_hit_share, "a share from 0 to 1",
                          "e.g. --prefix-hit-share 0.5")
        if self.num_scheduler_steps > 1 and not self.prefill_first:
            raise invalid("--num-scheduler-steps", self.num_scheduler_steps, "1 with vLLM "
                          "V1's scheduler (V1 has no multi-step scheduling)",
                          "--scheduler prefill-first (vLLM 0.6 without chunked prefill), "
                          "or --num-scheduler-steps 1")
        if self.reserve_output and (not self.prefill_first or self.num_scheduler_steps > 1
                                    or self.pipeline_parallel_size > 1):
            raise invalid("--scheduler", "sglang", "prompts alone, one step at a time, in "
                          "one pipeline stage (SGLang's loop)",
                          "--num-scheduler-steps 1 and --pipeline-parallel-size 1")
        if self.pipeline_parallel_size > 1 and self.prefill_first:
            raise invalid("--pipeline-parallel-size", self.pipeline_parallel_size,
                          "1 with the prefill-first scheduler (pipeline parallelism is "
                          "modelled on vLLM V1's batch queue)",
                          "--scheduler v1, or --pipeline-parallel-size 1")


@dataclass(frozen=True, slots=True)
class Requests:
    arrival_s: np.ndarray
    prompt: np.ndarray  # tokens
    output: np.ndarray  # tokens to generate (>= 1)
    prefix_hit: np.ndarray  # bool: starts with the shared prefix


@dataclass(slots=True)
class ServingResult:
    sent_s: np.ndarray  # when each request reached the server (its arrival, open loop)
    ttft_s: np.ndarray  # NaN where not served
    tpot_s: np.ndarray  # NaN for a one-token output or not served
    e2e_s: np.ndarray
    preemptions: np.ndarray
    rejected: np.ndarray  # bool
    generated: np.ndarray  # output tokens produced
    steps: int
    busy_s: float
    end_s: float
    running_sum: float  # sum over steps of running requests (for the mean)
    prefill_tokens: int
    decode_tokens: int
    kv_time_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    kv_blocks: np.ndarray = field(default_factory=lambda: np.zeros(0))
    preempt_time_s: np.ndarray = field(default_factory=lambda: np.zeros(0))


def lognormal_lengths(mean: float, p99: float | None, n: int, rng: np.random.Generator,
                      field_name: str) -> np.ndarray:
    """Token counts: fixed at `mean` (p99 None or equal), or log-normal through mean and p99."""
    if not (math.isfinite(mean) and 1 <= mean <= MAX_TOKENS_PER_REQUEST):
        raise invalid(field_name, mean, f"tokens from 1 to {MAX_TOKENS_PER_REQUEST:,}",
                      f"e.g. {field_name} 512")
    if p99 is None or p99 == mean:
        return np.full(n, round(mean), dtype=np.int64)
    r = math.log(p99 / mean) if p99 > mean else -1.0
    if not (p99 <= MAX_TOKENS_PER_REQUEST and 0 < r <= Z99 * Z99 / 2):
        raise invalid(f"{field_name}-p99", p99, f"above the mean ({mean:g}) and at most "
                      f"{math.exp(Z99 * Z99 / 2):.1f} x it (a log-normal's limit)",
                      f"e.g. {field_name}-p99 {mean * 3:g}")
    sigma = Z99 - math.sqrt(Z99 * Z99 - 2 * r)
    mu = math.log(mean) - sigma * sigma / 2
    x = np.rint(rng.lognormal(mu, sigma, n))
    return np.clip(x, 1, MAX_TOKENS_PER_REQUEST).astype(np.int64)


class Sends:
    """When each request (in arrival order) reaches the server: at its drawn time, or
    with `max_concurrency` C > 0 a closed loop as `vllm bench serve --max-concurrency C`
    runs one: at its drawn time or when one of C clients frees (a request finishes or is
    refused), whichever is later. `arrival` holds the send times; `nxt` the next
    request not yet sent."""

    __slots__ = ("arrival", "clients", "drawn", "n", "nxt")

    def __init__(self, drawn: list[float], max_concurrency: int) -> None:
        self.drawn = drawn
        self.arrival = drawn[:]  # later than drawn where the closed loop held a request
        self.n = len(drawn)
        self.nxt = 0
        # the clients' free times, in order (completions come at non-decreasing times)
        self.clients: deque[float] | None = (
            deque([-math.inf] * min(max_concurrency, self.n)) if max_concurrency > 0
            else None)

    def next_at(self) -> float:
        """When the next request reaches the server if nothing else happens first; inf
        when every request is sent or every client is out."""
        if self.nxt >= self.n:
            return math.inf
        if self.clients is None:
            return self.arrival[self.nxt]
        return max(self.drawn[self.nxt], self.clients[0]) if self.clients else math.inf

    def take(self) -> int:
        """Send the next request (it is due): its index."""
        i = self.nxt
        self.nxt += 1
        if self.clients is not None:
            self.arrival[i] = max(self.drawn[i], self.clients.popleft())
        return i

    def free(self, at: float) -> None:
        """A request ended (or was refused) at `at`: its client may send again."""
        if self.clients is not None:
            self.clients.append(at)


def simulate_serving(req: Requests, cfg: SchedulerConfig,
                     model: StepModel | ProfileStepModel,
                     max_concurrency: int = 0) -> ServingResult:
    """One replica under vLLM v1's scheduler; see the module docstring. With
    `max_concurrency` > 0, at most that many requests are out at once (a closed loop)."""
    cfg.check()
    n = req.arrival_s.size
    B = cfg.block_size  # noqa: N806
    order = np.argsort(req.arrival_s, kind="stable")
    sends = Sends(req.arrival_s[order].tolist(), max_concurrency)
    prompt = req.prompt[order].tolist()
    output = req.output[order].tolist()
    hit = (req.prefix_hit[order] & cfg.enable_prefix_caching).tolist()
    prefix_blocks = (min(cfg.prefix_tokens, int(req.prompt.min()) if n else 0) // B
                     if cfg.enable_prefix_caching and cfg.prefix_tokens else 0)
    prefix_tok = prefix_blocks * B
    pool = cfg.num_blocks - (prefix_blocks if prefix_blocks and any(hit) else 0)
    gen = [0] * n
    computed = [0] * n
    held = [0] * n
    first = [math.nan] * n
    done = [math.nan] * n
    preempt = [0] * n
    rejected = [False] * n
    waiting: deque[int] = deque()
    running: list[int] = []
    free = pool
    t = 0.0
    steps = 0
    busy = 0.0
    running_sum = 0.0
    prefill_tok = decode_tok = 0
    kv_t: list[float] = []
    kv_b: list[int] = []
    pre_t: list[float] = []
    finished = 0

    def start_of(i: int) -> int:
        return prefix_tok if hit[i] else 0

    # SGLang's estimate of the output still to come (reserve_output): the running
    # requests' remaining max_tokens count at this ratio against the free cache
    ratio = SGLANG_INIT_NEW_TOKEN_RATIO
    reserved = 0.0  # tokens this step's admission holds back: running, then admitted

    # blocks a request's own tokens take beyond the shared prefix's; a request holding
    # `held` blocks needs none more while its tokens stay within (held + shared[i]) * B
    shared = [prefix_blocks if h else 0 for h in hit]

    def blocks_for(i: int, tokens: int) -> int:
        return max(0, -(-tokens // B) - shared[i])

    def fits(budget: int, whole: bool) -> tuple[int, int] | None:
        """The first waiting request's new tokens this step and the blocks they take,
        where budget, max_num_seqs and free blocks let it in; `whole`: a prompt that does
        not fit the rest of the budget waits for a step with room. None where it waits."""
        if not waiting or budget <= 0 or len(running) >= cfg.max_num_seqs:
            return None
        i = waiting[0]
        remaining = prompt[i] + gen[i] - computed[i]
        new = min(remaining, budget)
        if new < remaining and whole and remaining <= cfg.max_num_batched_tokens:
            return None
        if cfg.reserve_output and running and (
                remaining + output[i] + reserved >= free * B):
            # SGLang: its prompt and whole output, beside what is held back. Into an empty
            # cache it comes anyway: it fits (checked on arrival), as SGLang cuts a
            # request's max_tokens to what its cache holds
            return None
        need = blocks_for(i, computed[i] + new) - held[i]
        return None if need > free else (new, need)

    def hold_back() -> None:
        """SGLang's reservation for the running requests, before an admission (none to
        count where nothing waits)."""
        nonlocal reserved
        reserved = (ratio * sum(output[r] - gen[r] for r in running)
                    if cfg.reserve_output and waiting else 0.0)

    def admit(sched: list[tuple[int, int]], budget: int, whole: bool) -> int:
        """Admit waiting requests first come, first served while they fit (`fits`).
        Returns the budget left."""
        nonlocal free, reserved
        hold_back()
        while (fit := fits(budget, whole)) is not None:
            new, need = fit
            i = waiting.popleft()
            if cfg.reserve_output:  # its prompt and output count in full from here
                reserved += prompt[i] + gen[i] - computed[i] + output[i] - need * B
            free -= need
            held[i] += need
            running.append(i)
            sched.append((i, new))
            budget -= new
        return budget

    def admits() -> bool:
        """Whether this step's admission (`admit`) would take the first waiting request,
        with every running request decoding."""
        budget = cfg.max_num_batched_tokens - (0 if cfg.prefill_first else len(running))
        hold_back()
        return fits(budget, cfg.prefill_first or not cfg.enable_chunked_prefill) is not None

    def decode_run() -> int:
        """Steps in which nothing but the running requests' decodes can happen, taken at
        once (the module docstring's decode runs): every running request is decoding, none
        finishes, no block they take can run the pool dry (so none is preempted), no
        request arrives and none waiting could be admitted. Each step is priced and
        sampled exactly as the step-by-step loop does; only the per-request bookkeeping
        is done once for the run. Returns the steps taken (0: none could be)."""
        nonlocal t, busy, steps, running_sum, decode_tok, free, ratio
        if cfg.reserve_output and waiting:  # the ratio falls a step: one may come in
            return 0
        m = len(running)
        # a request arriving within the first step ends the run there: no run. A step's
        # time only grows with the KV it reads, so the step without any is a floor.
        if (m > cfg.max_num_batched_tokens
                or sends.next_at() <= t + model.step_s(m, float(m), 0.0, m, m) or admits()):
            return 0
        most = MAX_STEPS
        kv0 = 0
        for i in running:
            c = computed[i]
            if gen[i] == 0 or c != prompt[i] + gen[i] - 1:
                return 0
            most = min(most, output[i] - gen[i] - 1)  # its last token is the loop's
            kv0 += c
        if most < DECODE_RUN_MIN:
            return 0
        # the steps' times first, up to the one a request arrives at the start of (a
        # step's time rests on the KV it reads alone), so the blocks below are counted
        # for the steps the run can take, not for every step to the first finish
        due = sends.next_at()
        dts: list[float] = []
        at = t
        while len(dts) < most and due > at and steps + len(dts) < MAX_STEPS:
            kv = float(kv0 + len(dts) * m)
            dt = model.step_s(m, kv + m, kv, m, m)
            at += dt
            dts.append(dt)
        most = len(dts)
        # the blocks taken at each step of the run: request i takes one when its tokens
        # pass what its blocks hold, then every B steps; the run stops before the step
        # whose blocks would leave the pool short
        taken = [0] * most
        for i in running:
            for j in range((held[i] + shared[i]) * B - computed[i], most, B):
                taken[j] += 1
        left = free
        for j in range(most):
            if taken[j] > left:
                most = j
                break
            left -= taken[j]
            t += dts[j]
            busy += dts[j]
            kv_t.append(t)
            kv_b.append(pool - left)
        steps += most
        running_sum += most * m
        decode_tok += most * m
        free = left
        for i in running:
            c = computed[i] + most
            computed[i] = c
            gen[i] += most
            held[i] = max(held[i], blocks_for(i, c))
        ratio = max(ratio - SGLANG_NEW_TOKEN_RATIO_DECAY * most, SGLANG_MIN_NEW_TOKEN_RATIO)
        return most

    def evict(victim: int, to_front: bool) -> None:
        """A request out of the cache, to recompute what it had: vLLM's preemption puts it
        at the front of the queue, SGLang's retraction at the back."""
        nonlocal free
        free += held[victim]
        held[victim] = 0
        computed[victim] = start_of(victim)
        preempt[victim] += 1
        if to_front:
            waiting.appendleft(victim)
        else:
            waiting.append(victim)
        pre_t.append(t)

    def retract() -> None:
        """SGLang's decode step on a full cache: where the running requests' next tokens
        do not fit, retract those with the fewest output tokens (the longest prompt
        first among equals) to the back of the queue, until the rest have room for
        SGLANG_RETRACT_DECODE_STEPS more steps; the ratio then counts what the rest
        have made. Otherwise the ratio falls a step."""
        nonlocal free, ratio
        need = sum(blocks_for(i, computed[i] + 1) - held[i] for i in running)
        if need <= free:
            ratio = max(ratio - SGLANG_NEW_TOKEN_RATIO_DECAY, SGLANG_MIN_NEW_TOKEN_RATIO)
            return
        keep = sorted(running, key=lambda r: (gen[r], -prompt[r]), reverse=True)
        while len(keep) > 1 and (need > free or free * B
                                 < SGLANG_RETRACT_DECODE_STEPS * len(keep)):
            victim = keep.pop()
            need -= blocks_for(victim, computed[victim] + 1) - held[victim]
            evict(victim, to_front=False)
        kept = set(keep)
        running[:] = [r for r in running if r in kept]
        ratio = min(1.0, (sum(gen[r] for r in keep) + SGLANG_RETRACT_DECODE_STEPS * len(keep))
                    / sum(output[r] for r in keep))

    # pipeline parallelism (vLLM V1's batch queue): up to `lanes` batches in flight, a
    # request in at most one; each batch passes the stages in order, one at a time on each
    lanes = cfg.pipeline_parallel_size
    flying = [False] * n
    in_flight: deque[tuple[float, list[tuple[int, int]]]] = deque()  # (done at, batch)
    stage_free = [0.0] * lanes

    retry_at = 0  # the step from which a decode run is tried again, and the wait after
    backoff = 1
    group = cfg.num_scheduler_steps  # multi-step: decodes in groups of this many steps
    group_left = 0  # steps left in the group under way (no prompt admitted till then)
    group_done: list[int] = []  # finished within it: computed and sent to the group's end

    def land(sched: list[tuple[int, int]]) -> None:
        """A step's new tokens in the cache, at time t: a request whose prompt and output
        so far are all computed samples its next token; one that has all of its output
        finishes (sent at the multi-step group's end where one is under way)."""
        nonlocal free, finished
        for i, new in sched:
            flying[i] = False
            c = computed[i] + new
            computed[i] = c
            if c == prompt[i] + gen[i]:
                g = gen[i] = gen[i] + 1
                if g == 1:  # a preempted request recomputes; its first token stays
                    first[i] = t
                if g >= output[i]:
                    running.remove(i)
                    finished += 1
                    if group_left:  # computed to the group's end, sent with its tokens
                        group_done.append(i)
                    else:
                        free += held[i]
                        held[i] = 0
                        done[i] = t
                        sends.free(t)

    def land_oldest() -> None:
        """Wait for the oldest batch in flight and take its tokens (pipeline stages)."""
        nonlocal t
        at, batch = in_flight.popleft()
        t = max(t, at)
        land(batch)

    def end_group() -> None:
        nonlocal group_left, free
        group_left = 0
        for i in group_done:
            free += held[i]
            held[i] = 0
            done[i] = t
            sends.free(t)
        group_done.clear()

    while finished < n:
        while sends.next_at() <= t:
            i = sends.take()
            if blocks_for(i, prompt[i] + output[i]) > pool or (
                    (cfg.prefill_first or not cfg.enable_chunked_prefill)
                    and prompt[i] - start_of(i) > cfg.max_num_batched_tokens):
                rejected[i] = True
                finished += 1
                sends.free(sends.arrival[i])
                continue
            computed[i] = start_of(i)
            waiting.append(i)
        if not running and not waiting:
            if sends.nxt >= n:
                break
            t = max(t, sends.next_at())
            continue
        if in_flight and (len(in_flight) == lanes
                          or (not waiting and all(flying[i] for i in running))):
            # the queue is full, or nothing is left to schedule: wait for the oldest batch
            land_oldest()
            continue
        if running and steps >= retry_at and group == 1 and lanes == 1:
            took = decode_run()
            if took >= DECODE_RUN_MIN:
                backoff = 1
            else:
                # where runs cannot be had (a request arrives or finishes every step or
                # so) the tries back off, so the check costs the step loop little
                retry_at = steps + backoff
                backoff = min(2 * backoff, DECODE_RUN_BACKOFF)
            if took:
                continue
        steps += 1
        if steps > MAX_STEPS:
            raise invalid("simulation", f"{MAX_STEPS:,} steps", "fewer steps",
                          "fewer requests, or a higher max_num_batched_tokens")
        budget = cfg.max_num_batched_tokens
        sched: list[tuple[int, int]] = []  # (request, new tokens)
        preempted = False
        in_group = group_left > 0
        if cfg.reserve_output and not running:
            ratio = SGLANG_INIT_NEW_TOKEN_RATIO  # SGLang resets it when idle
        if cfg.prefill_first and not in_group:
            budget = admit(sched, budget, whole=True)
        if cfg.reserve_output and not sched and running:
            retract()
        k = len(running) if sched else 0  # a prefill-only step leaves the decodes waiting
        while k < len(running) and budget > 0:
            i = running[k]
            if flying[i]:  # in a batch under way: scheduled again once it is back
                k += 1
                continue
            c = computed[i]
            new = prompt[i] + gen[i] - c
            if new > budget:
                new = budget
            # the common case, a decode within the blocks it holds, without the division
            need = (0 if c + new <= (held[i] + shared[i]) * B
                    else blocks_for(i, c + new) - held[i])
            while need > free:
                # the most recently admitted (of those not in a batch under way)
                victim = running.pop() if lanes == 1 else running.pop(
                    max(v for v, r in enumerate(running) if not flying[r]))
                evict(victim, to_front=True)
                preempted = True
                if victim == i:
                    break
            else:
                free -= need
                held[i] += need
                sched.append((i, new))
                budget -= new
                k += 1
                continue
            break  # this request was preempted itself
        if not preempted and not cfg.prefill_first:
            budget = admit(sched, budget, whole=not cfg.enable_chunked_prefill)
        if not sched:
            if preempted:  # a request preempted itself; the next pass admits afresh
                steps -= 1
                continue
            if in_flight:  # nothing to add: the oldest batch's tokens first
                steps -= 1
                land_oldest()
                continue
            if sends.next_at() < math.inf:
                t = max(t, sends.next_at())
                continue
            raise invalid("simulation", "no request can be scheduled", "a pool that fits "
                          "one request", "more KV blocks")
        tokens = 0
        attn = 0.0
        kv_read = 0.0
        decodes = 0
        for i in group_done:  # finished mid-group: the GPU decodes them to its end
            c = computed[i]
            computed[i] = c + 1
            tokens += 1
            attn += c + 1
            kv_read += c
            decodes += 1
        for i, new in sched:
            c = computed[i]
            tokens += new
            attn += new * c + new * (new + 1) // 2
            kv_read += c
            if prompt[i] + gen[i] - c == 1 and gen[i] > 0:
                decodes += 1
            else:
                prefill_tok += new
        decode_tok += decodes - len(group_done)  # a finished one's tokens are dropped
        dt = model.step_s(tokens, attn, kv_read, decodes, len(sched) + len(group_done))
        running_sum += len(running) + len(group_done)
        if lanes > 1:
            # the host schedules it, then it passes the stages in order, each once the
            # batch ahead has left it; its tokens come back when the last is done
            host, stage, hop, tail = model.stages(dt, tokens, len(sched), lanes)
            at = t + host
            for j in range(lanes):
                at = stage_free[j] = max(at + (hop if j else 0.0), stage_free[j]) + stage
            in_flight.append((at + tail, sched))
            for i, _ in sched:
                flying[i] = True
            t += host
            busy += dt / lanes  # each GPU's share: its own stage
        else:
            t += dt
            busy += dt
            if group > 1:  # a step of decodes alone starts a group; a prompt step is one
                group_left = group_left - 1 if in_group else (
                    group - 1 if decodes == len(sched) else 0)  # (no riders between groups)
            land(sched)
            if group > 1 and (not group_left or not running):
                end_group()  # the group's last step, or nothing left to run in it
        kv_t.append(t)
        kv_b.append(pool - free)
    return serving_result(order, sends.arrival, first, done, output, preempt, rejected, gen,
                          kv_t, kv_b, pre_t, steps=steps, busy_s=busy, end_s=t,
                          running_sum=running_sum, prefill_tokens=prefill_tok,
                          decode_tokens=decode_tok)


def serving_result(order: np.ndarray, arrival: list[float], first: list[float],
                   done: list[float], output: list[int], preempt: list[int],
                   rejected: list[bool], gen: list[int], kv_t: list[float], kv_b: list[int],
                   pre_t: list[float], **totals: Any) -> ServingResult:
    """A simulation's per-request lists (in the arrival `order` it ran them) as a
    ServingResult in the requests' own order; `totals`: the run's counts (steps,
    busy_s, end_s, running_sum, prefill_tokens, decode_tokens)."""
    n = order.size
    arr = np.asarray(arrival)
    first_a = np.asarray(first)
    done_a = np.asarray(done)
    out_a = np.asarray(output, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out_a > 1, (done_a - first_a) / (out_a - 1), np.nan)
    inv = np.empty(n, dtype=np.int64)
    inv[order] = np.arange(n)
    thin = max(1, len(kv_t) // KV_SAMPLES)
    return ServingResult(
        sent_s=arr[inv], ttft_s=(first_a - arr)[inv], tpot_s=tpot[inv],
        e2e_s=(done_a - arr)[inv], preemptions=np.asarray(preempt, np.int64)[inv],
        rejected=np.asarray(rejected, bool)[inv], generated=np.asarray(gen)[inv],
        kv_time_s=np.asarray(kv_t[::thin]), kv_blocks=np.asarray(kv_b[::thin]),
        preempt_time_s=np.asarray(pre_t), **totals)


# -- the whole deployment -------------------------------------------------------------
MAX_SPAN_S = 1e8  # about three years of arrivals: the clock still resolves 0.1 us


@dataclass(frozen=True, slots=True)
class Workload:
    request_rate: float
    num_requests: int = 2000
    arrival: str = "poisson"
    prompt_tokens: float = 512
    prompt_tokens_p99: float | None = None
    output_tokens: float = 256
    output_tokens_p99: float | None = None
    seed: int = 0
    max_concurrency: int = 0  # > 0: a closed loop of that many clients (vLLM bench's)
    # vllm bench serve's --burstiness: gaps are gamma with this shape (1: Poisson; below 1
    # burstier, above 1 more even), the same mean rate
    burstiness: float = 1.0
    # (prompt, output) token counts read from a CSV, used in order and from the start
    # again when there are fewer rows than requests; instead of the fixed/log-normal ones
    lengths: tuple[np.ndarray, np.ndarray] | None = None

    def draw(self, prefix_hit_share: float = 0.0) -> Requests:
        if not 0 <= self.max_concurrency <= MAX_CONCURRENCY:
            raise invalid("--max-concurrency", self.max_concurrency,
                          f"0 (open loop) to {MAX_CONCURRENCY:,} requests out at once",
                          "e.g. --max-concurrency 8")
        closed_inf = self.max_concurrency > 0 and self.request_rate == math.inf
        if not (closed_inf or (math.isfinite(self.request_rate)
                               and 0 < self.request_rate <= 1e6)):
            raise invalid("--rate", self.request_rate, "requests per second above 0, up to "
                          "1e6 (inf only with --max-concurrency, as vLLM bench takes it)",
                          "e.g. --rate 10")
        if not 1 <= self.num_requests <= MAX_REQUESTS:
            raise invalid("--num-requests", self.num_requests, f"1 to {MAX_REQUESTS:,}",
                          "e.g. --num-requests 2000")
        if not closed_inf and self.num_requests / self.request_rate > MAX_SPAN_S:
            # past this a step's milliseconds vanish into the clock's float rounding
            raise invalid("--rate", self.request_rate, f"a rate whose {self.num_requests:,} "
                          f"requests arrive within {MAX_SPAN_S:.0e} s (at least "
                          f"{self.num_requests / MAX_SPAN_S:.2g}/s here)",
                          "a higher --rate, or fewer --num-requests")
        if self.arrival not in ("poisson", "constant"):
            raise invalid("--arrival", self.arrival, "poisson or constant",
                          "e.g. --arrival poisson")
        if not (math.isfinite(self.burstiness) and 0.01 <= self.burstiness <= 100):
            raise invalid("--burstiness", self.burstiness, "a gamma shape from 0.01 to 100 "
                          "(1: Poisson)", "e.g. --burstiness 1")
        rng = np.random.default_rng(self.seed)
        n = self.num_requests
        gaps = (np.zeros(n) if closed_inf  # every request ready at once; the loop paces
                else np.full(n, 1 / self.request_rate) if self.arrival == "constant"
                else rng.exponential(1 / self.request_rate, n) if self.burstiness == 1
                else rng.gamma(self.burstiness, 1 / (self.request_rate * self.burstiness), n))
        if self.lengths is not None:
            rows = np.arange(n) % self.lengths[0].size
            prompt, output = self.lengths[0][rows], self.lengths[1][rows]
        else:
            prompt = lognormal_lengths(self.prompt_tokens, self.prompt_tokens_p99, n, rng,
                                       "--prompt-tokens")
            output = lognormal_lengths(self.output_tokens, self.output_tokens_p99, n, rng,
                                       "--output-tokens")
        total = int(prompt.sum()) + int(output.sum())
        if total > MAX_TOTAL_TOKENS:
            raise invalid("--num-requests x tokens", f"{total:,} tokens",
                          f"at most {MAX_TOTAL_TOKENS:,} prompt and output tokens in all",
                          "fewer requests or shorter prompts and outputs")
        return Requests(np.cumsum(gaps), prompt, output, rng.random(n) < prefix_hit_share)


@dataclass(frozen=True, slots=True)
class ServingReport:
    model: str
    gpu: str
    tp: int
    replicas: int
    num_blocks_per_replica: int
    requests: dict[str, int]
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    e2e_ms: dict[str, float]
    input_tokens_per_s: float
    output_tokens_per_s: float
    mean_running: float
    gpu_busy: float
    preemptions: int
    cost_per_million_output_usd: float
    cost_per_million_input_usd: float
    step_model: dict[str, float]
    kv_usage: dict[str, list[float]]
    notes: tuple[str, ...] = ()
    # each request's figures (seconds) and lengths, and the run's span: what
    # `--save-result` writes in vLLM's keys; not part of the report's JSON
    per_request: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    pp: int = 1  # pipeline stages of a replica (a replica is tp x pp GPUs)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("per_request")
        d["notes"] = list(self.notes)
        out: dict[str, Any] = jsonable(d)
        return out


def request_goodput(per_request: dict[str, Any], slo_ms: dict[str, float]) -> float:
    """Served requests per second that meet every SLO given (`ttft`, `tpot`, `e2el`, ms),
    as `vllm bench serve --goodput` counts them (a one-token answer's TPOT is 0)."""
    ttft, e2e = per_request["ttft_s"], per_request["e2e_s"]
    served = np.isfinite(ttft)
    tpot = np.nan_to_num(per_request["tpot_s"], nan=0.0)
    meets = served.copy()
    for key, x in (("ttft", ttft), ("tpot", tpot), ("e2el", e2e)):
        if key in slo_ms:
            meets &= np.where(served, x, np.inf) <= slo_ms[key] / 1e3
    span = float(per_request["duration_s"])
    return float(meets.sum()) / span if span > 0 else 0.0


def _pcts(x: np.ndarray) -> dict[str, float]:
    x = x[np.isfinite(x)] * 1e3
    if x.size == 0:
        return {"p50": math.nan, "p90": math.nan, "p99": math.nan, "mean": math.nan}
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(x.mean())}


def serve_llm(spec: PoolSpec, workload: Workload, *, replicas: int = 1,
              enable_chunked_prefill: bool = True, enable_prefix_caching: bool = False,
              prefix_tokens: int = 0, prefix_hit_share: float = 0.0,
              compute_efficiency: float | None = None,
              memory_efficiency: float | None = None, overhead_ms: float | None = None,
              step_profile: ProfileStepModel | None = None,
              step_params: StepParams | None = None,
              prefill_first: bool = False, llama_cpp: bool = False,
              max_model_len: int = 0, num_scheduler_steps: int = 1,
              sglang: bool = False) -> ServingReport:
    """Simulate a vLLM deployment: `replicas` groups of `spec.tp` x `spec.pp` GPUs (pp
    pipeline stages of tp), requests split
    among them at random (a Poisson stream split at random stays Poisson). Step times
    come from the roofline, or from `step_profile` (a measured profile, fitted) when
    given: measured on one tensor-parallel group of this deployment. `llama_cpp`: each
    replica is llama.cpp's server instead (llm/llama_cpp.py), `max_num_seqs` slots of
    `context_tokens` each, `max_num_batched_tokens` its n_batch. `max_model_len` (vLLM's
    --max-model-len; 0: none): a request whose prompt and output pass it is refused before
    the engine, as vLLM's server refuses it (HTTP 400), and a pool that cannot hold one
    such request is an error, as vLLM's start-up is. `num_scheduler_steps` (vLLM 0.6's
    multi-step scheduling, with `prefill_first`): decodes in groups of that many steps.
    `sglang`: SGLang 0.3's loop, prompts alone (`prefill_first`) with its admission and
    retraction (SchedulerConfig.reserve_output)."""
    prefill_first = prefill_first or sglang
    if not 1 <= replicas <= 10_000:
        raise invalid("--replicas", replicas, "1 to 10,000", "e.g. --replicas 2")
    if workload.max_concurrency and replicas > 1:
        raise invalid("--max-concurrency", workload.max_concurrency, "one replica (how a "
                      "load balancer spreads a closed loop over replicas is not modelled)",
                      "--replicas 1, or an open-loop --rate without --max-concurrency")
    params = step_params or StepParams()
    given: dict[str, Any] = {k: v for k, v in (
        ("compute_efficiency", compute_efficiency), ("memory_efficiency", memory_efficiency),
        ("overhead_ms", overhead_ms)) if v is not None}
    params = replace(params, **given)
    params.check()
    heads = spec.model.num_attention_heads
    if heads % spec.tp:
        raise invalid("--tp", spec.tp, f"a divisor of the model's {heads} attention heads "
                      "(vLLM splits heads evenly over the tensor-parallel group)",
                      f"use --tp {max(d for d in range(1, spec.tp + 1) if heads % d == 0)}")
    pool = size_pool(spec)
    if pool.num_blocks < 1:
        raise invalid("KV pool", 0, "at least one block", "more GPUs (--tp), a smaller "
                      "model or KV dtype, or a higher --gpu-memory-utilization")
    check_max_model_len(max_model_len, spec, pool.num_blocks)
    if step_profile and spec.pp > 1:
        raise invalid("--pipeline-parallel-size", spec.pp, "1 with a measured step profile "
                      "(a profile's steps are whole passes; how they split into stages is "
                      "not measured)", "drop --step-profile, or --pipeline-parallel-size 1")
    if llama_cpp and spec.pp > 1:
        raise invalid("--pipeline-parallel-size", spec.pp, "1 with llama.cpp's server "
                      "(modelled on one GPU)", "--pipeline-parallel-size 1")
    model: StepModel | ProfileStepModel = step_profile or StepModel.roofline(
        spec, params, prefill_first)
    frontend_s = params.frontend_ms / 1e3
    cfg = SchedulerConfig(num_blocks=pool.num_blocks, block_size=spec.block_size,
                          max_num_seqs=spec.max_num_seqs,
                          max_num_batched_tokens=spec.max_num_batched_tokens,
                          enable_chunked_prefill=enable_chunked_prefill,
                          enable_prefix_caching=enable_prefix_caching,
                          prefix_tokens=prefix_tokens, prefix_hit_share=prefix_hit_share,
                          prefill_first=prefill_first,
                          num_scheduler_steps=num_scheduler_steps,
                          pipeline_parallel_size=spec.pp, reserve_output=sglang)
    from servelab.llm.rules import llama_cpp as llama_cpp_config
    from servelab.llm.rules import simulate

    if llama_cpp and num_scheduler_steps != 1:
        raise invalid("--num-scheduler-steps", num_scheduler_steps, "1 with llama.cpp's "
                      "server (it has no multi-step scheduling)",
                      "--scheduler prefill-first (vLLM 0.6), or --num-scheduler-steps 1")
    engine = (llama_cpp_config(spec.max_num_seqs, spec.context_tokens,
                               spec.max_num_batched_tokens) if llama_cpp else cfg)
    req = workload.draw(prefix_hit_share if enable_prefix_caching else 0.0)
    intake = (params.intake_ms > 0 or params.intake_per_token_us > 0) and (
        not workload.max_concurrency)
    which = np.random.default_rng(workload.seed + 1).integers(0, replicas, req.arrival_s.size)
    too_long = ((req.prompt + req.output > max_model_len) if max_model_len
                else np.zeros(req.arrival_s.size, bool))
    parts = []
    for r in range(replicas):
        sel = (which == r) & ~too_long
        if sel.any():
            arrive = req.arrival_s[sel]  # each replica its own API server
            if intake:  # the loop's time for each request: its own part and its prompt's
                arrive = intake_times(arrive, params.intake_ms / 1e3 + req.prompt[sel]
                                      * (params.intake_per_token_us / 1e6))
            sub = Requests(arrive, req.prompt[sel], req.output[sel], req.prefix_hit[sel])
            parts.append((sel, simulate(sub, engine, model, workload.max_concurrency)))
    n = req.arrival_s.size
    sent = req.arrival_s.astype(np.float64)
    ttft, tpot, e2e = (np.full(n, np.nan) for _ in range(3))
    rejected = np.zeros(n, bool)
    pre = 0
    busy = end = run_sum = 0.0
    steps = 0
    for sel, res in parts:
        held = res.sent_s - req.arrival_s[sel] if intake else 0.0  # the intake's hold
        ttft[sel], tpot[sel], e2e[sel] = (res.ttft_s + frontend_s + held, res.tpot_s,
                                          res.e2e_s + frontend_s + held)
        sent[sel] = req.arrival_s[sel] if intake else res.sent_s  # the client's send
        rejected[sel] = res.rejected
        pre += int(res.preemptions.sum())
        busy += res.busy_s
        end = max(end, res.end_s)
        run_sum += res.running_sum
        steps += res.steps
    no_room = rejected.copy()  # the engine's: a request no replica's pool can ever hold
    rejected |= too_long
    served = ~rejected
    span = end - float(sent.min()) if n else 0.0
    out_tps = float(req.output[served].sum()) / span if span > 0 else 0.0
    in_tps = float(req.prompt[served].sum()) / span if span > 0 else 0.0
    price = spec.gpu.price_per_gpu_hour_usd
    gpus = replicas * spec.tp * spec.pp
    per_hour = gpus * price
    if isinstance(model, ProfileStepModel):
        notes = [f"step time fitted to the measured profile {model.source} ({model.rows:,} "
                 f"steps; the fit is within {model.max_abs_error_pct:.1f}% of every one): "
                 f"{model.base_ms:.3g} ms + {model.per_prefill_token_ms:.3g} ms per prefill "
                 f"token + {model.per_decode_seq_ms:.3g} ms per decode sequence + "
                 f"{model.per_kv_token_ms:.3g} ms per KV token read"
                 + (f" + {model.multi_token_ms:.3g} ms a step of two or more tokens"
                    if model.multi_token_ms else "")]
    else:
        each = ("the larger" if math.isinf(params.overlap)
                else f"the {params.overlap:g}-norm")
        overlap = (f"{each} of the GEMMs' two sides plus {each} of attention's"
                   if params.attention_apart else f"{each} of the two")
        notes = ["step time is a roofline with stated efficiencies (compute "
                 f"{params.compute_efficiency:g}"
                 + (f" x M / (M + {params.compute_ramp_tokens:g}) for a step of M tokens"
                    if params.compute_ramp_tokens else "")
                 + f", memory {params.memory_efficiency:g} for "
                 f"weights and {params.kv_read_efficiency:g} for the KV cache, "
                 f"{overlap}; {model.overhead_s * 1e3:g} ms a step and "
                 f"{params.per_seq_ms:g} ms a sequence; {params.frontend_ms:g} ms outside "
                 "the steps a request"
                 + (f"; {spec.tp}-way all-reduces at {spec.gpu.interconnect_gbps:g} GB/s"
                           f", {model.link_efficiency:g} efficiency, "
                           f"{model.allreduce_latency_s * 1e6:g} us each"
                           + (" (through NCCL: vLLM's own kernel needs NVLink beyond two "
                              "GPUs)" if nccl_allreduce(spec.tp, spec.gpu) else "")
                           if spec.tp > 1 else "") + ")"]
        if spec.model.active_parameters:
            notes.append(f"mixture of experts: FLOPs count the "
                         f"{spec.model.active_parameters / 1e9:.1f}B active parameters; "
                         f"of the {spec.model.num_parameters / 1e9:.1f}B, a step reads "
                         "the dense ones and the experts its tokens were routed to (top "
                         f"{spec.model.experts_per_token} of "
                         f"{spec.model.num_routed_experts}, spread evenly)")
    if spec.pp > 1 and isinstance(model, StepModel):
        notes.append(f"pipeline parallel: {spec.pp} stages of {spec.tp} GPUs a replica, up "
                     f"to {spec.pp} batches in flight (vLLM V1's batch queue), a request in "
                     f"one at a time; each stage's send to the next "
                     f"{model.hop_latency_s * 1e3:g} ms and the hidden state's bytes"
                     + (" (--pp-hop-ms: fitted to one published run over two machines "
                        "under Ray, all it cost beyond the stages; one machine's is likely "
                        "far less)" if params.pp_hop_ms == PP_HOP_MS else ""))
    if intake:
        notes.append(f"the API server takes each request for {params.intake_ms:g} ms + "
                     f"{params.intake_per_token_us:g} us a prompt token on one event loop "
                     "before the engine sees it; requests that come while it is busy wait "
                     "and go on together (N at once: the sum of theirs)")
    if sglang:
        notes.append("SGLang 0.3's loop: prompts alone, each admitted while the KV cache "
                     "holds its prompt and max_tokens beside the running requests' remaining "
                     "max_tokens x new_token_ratio (0.7, falling 0.001 a decode step to 0.1); "
                     f"--max-num-seqs {spec.max_num_seqs} stands for its "
                     "max_running_requests (SGLang's own: its request pool, 2,048 slots or "
                     "more, or half the cache's tokens if fewer)")
    if spec.defaults:
        notes.append(f"vLLM V1's defaults for {spec.gpu.key} (vllm serve): "
                     + ", ".join(spec.defaults))
    if workload.lengths is not None:
        rows = workload.lengths[0].size
        notes.append(f"prompt and output lengths from the CSV's {rows:,} rows, in order"
                     + (", from the start again past its end" if rows < n else ""))
    if workload.max_concurrency:
        notes.append(f"closed loop: at most {workload.max_concurrency} requests out at once, "
                     "each sent when one finishes (vllm bench serve --max-concurrency); "
                     "TTFT and latency count from the send")
    if too_long.any():
        notes.append(f"{int(too_long.sum())} requests whose prompt and output pass "
                     f"--max-model-len {max_model_len:,} were refused before the engine, as "
                     "vLLM's server refuses them (HTTP 400)")
    if no_room.any():
        notes.append(f"{int(no_room.sum())} requests could never fit one replica's KV pool "
                     f"({pool.num_blocks:,} blocks of {spec.block_size}) and were rejected")
    if pre:
        notes.append(f"{pre} retractions (SGLang's: recomputed from the back of the queue)"
                     if sglang else
                     f"{pre} preemptions (recompute): the KV pool ran out under this load")
    first_res = parts[0][1] if parts else None
    return ServingReport(
        model=spec.model.key, gpu=spec.gpu.key, tp=spec.tp, replicas=replicas,
        num_blocks_per_replica=pool.num_blocks,
        requests={"arrived": n, "served": int(served.sum()), "rejected": int(rejected.sum()),
                  "too_long": int(too_long.sum()),  # of the rejected: past --max-model-len
                  "input_tokens": int(req.prompt[served].sum()),
                  "output_tokens": int(req.output[served].sum()),
                  "preempted": int(sum(int((res.preemptions > 0).sum()) for _, res in parts))},
        ttft_ms=_pcts(ttft), tpot_ms=_pcts(tpot), e2e_ms=_pcts(e2e),
        input_tokens_per_s=in_tps, output_tokens_per_s=out_tps,
        mean_running=run_sum / steps if steps else 0.0,
        gpu_busy=busy / (span * len(parts)) if span > 0 and parts else 0.0,
        preemptions=pre,
        cost_per_million_output_usd=per_hour / (out_tps * 3600) * 1e6 if out_tps else math.inf,
        cost_per_million_input_usd=per_hour / (in_tps * 3600) * 1e6 if in_tps else math.inf,
        step_model=_step_model_dict(model),
        kv_usage={"time_s": first_res.kv_time_s.tolist() if first_res else [],
                  "blocks": first_res.kv_blocks.tolist() if first_res else [],
                  "preempt_time_s": first_res.preempt_time_s.tolist() if first_res else []},
        notes=tuple(notes), pp=spec.pp,
        per_request={"ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "prompt": req.prompt,
                     "output": req.output, "duration_s": span},
    )


def check_max_model_len(max_model_len: int, spec: PoolSpec, num_blocks: int) -> None:
    """vLLM's start-up checks of --max-model-len: within the model's own context, and one
    request of that length fits a replica's KV pool."""
    if not max_model_len:
        return
    limit = spec.model.max_position_embeddings
    if not 1 <= max_model_len <= limit:
        raise invalid("--max-model-len", max_model_len, f"1 to the model's context, "
                      f"{limit:,} tokens (vLLM refuses a longer one)",
                      f"--max-model-len {limit}, or 0 for the model's own")
    held = num_blocks * spec.block_size
    if max_model_len > held:
        raise invalid("--max-model-len", max_model_len, f"at most the {held:,} tokens one "
                      "replica's KV pool holds (vLLM does not start: the model's max seq len "
                      "is larger than the KV cache can store)", "a smaller --max-model-len, "
                      "a higher --gpu-memory-utilization, or more GPUs a replica (--tp)")


def _step_model_dict(model: StepModel | ProfileStepModel) -> dict[str, Any]:
    one = {"kind": model.kind, "decode_step_ms_batch1": model.step_s(1, 1.0, 0.0, 1) * 1e3}
    if isinstance(model, ProfileStepModel):
        return {**one, "base_ms": model.base_ms,
                "per_prefill_token_ms": model.per_prefill_token_ms,
                "per_decode_seq_ms": model.per_decode_seq_ms,
                "per_kv_token_ms": model.per_kv_token_ms,
                "multi_token_ms": model.multi_token_ms, "profile_rows": model.rows,
                "fit_max_abs_error_pct": model.max_abs_error_pct, "source": model.source}
    return {**one, "weight_bytes_per_gpu": model.weight_bytes,
            "kv_bytes_per_token_per_gpu": model.kv_bytes_per_token,
            "flops_per_token_per_gpu": model.flops_per_token,
            "peak_tflops": model.peak_flops / 1e12,
            "hbm_tbps": model.hbm_bytes_per_s / 1e12,
            "allreduce_ms_batch1": model.allreduce_s(1) * 1e3,
            "compute_efficiency": model.compute_efficiency,
            "memory_efficiency": model.memory_efficiency,
            "kv_memory_efficiency": model.kv_read_efficiency,
            "overlap": model.overlap,
            "overhead_ms": model.overhead_s * 1e3, "per_seq_ms": model.per_seq_s * 1e3,
            "allreduce_latency_us_each": model.allreduce_latency_s * 1e6}


@dataclass(frozen=True, slots=True)
class LlmPlan:
    replicas: int | None  # None: no count up to the cap meets the SLOs
    gpus: int | None
    ttft_p99_slo_ms: float
    tpot_p99_slo_ms: float
    report: ServingReport | None
    search: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = jsonable({
            "replicas": self.replicas, "gpus": self.gpus,
            "ttft_p99_slo_ms": self.ttft_p99_slo_ms, "tpot_p99_slo_ms": self.tpot_p99_slo_ms,
            "search": self.search})
        out["report"] = self.report.to_dict() if self.report is not None else None
        return out


MAX_PLAN_REPLICAS = 1024


def plan_llm(spec: PoolSpec, workload: Workload, *, ttft_p99_ms: float, tpot_p99_ms: float,
             max_replicas: int = MAX_PLAN_REPLICAS, **options: Any) -> LlmPlan:
    """The fewest replicas (each of `spec.tp` x `spec.pp` GPUs) whose p99 TTFT and p99 TPOT meet the
    SLOs with every request served: doubling, then bisection (more replicas never hurt:
    each gets a smaller share of the same stream). Requests past --max-model-len are
    refused at any size, so they do not count against a plan (the report counts them)."""
    for name, v in (("--ttft-p99-ms", ttft_p99_ms), ("--tpot-p99-ms", tpot_p99_ms)):
        if not (math.isfinite(v) and 0 < v <= 3_600_000):
            raise invalid(name, v, "milliseconds above 0, up to an hour", f"e.g. {name} 500")
    if not 1 <= max_replicas <= MAX_PLAN_REPLICAS:
        raise invalid("--max-replicas", max_replicas, f"1 to {MAX_PLAN_REPLICAS}",
                      "e.g. --max-replicas 64")
    if workload.max_concurrency:
        raise invalid("[llm] max_concurrency", workload.max_concurrency, "0: a plan sizes "
                      "replicas for an open-loop request rate", "set max_concurrency = 0 and "
                      "give the request rate to plan for")
    tried: dict[int, ServingReport] = {}
    search: list[dict[str, Any]] = []
    verdict: dict[int, bool] = {}

    def meets(r: int) -> bool:
        if r not in verdict:
            rep = tried[r] = serve_llm(spec, workload, replicas=r, **options)
            verdict[r] = (rep.requests["rejected"] == rep.requests["too_long"]
                          and rep.ttft_ms["p99"] <= ttft_p99_ms
                          and rep.tpot_ms["p99"] <= tpot_p99_ms)
            search.append({"replicas": r, "ttft_p99_ms": rep.ttft_ms["p99"],
                           "tpot_p99_ms": rep.tpot_ms["p99"], "meets": verdict[r],
                           "cost_per_million_output_usd": rep.cost_per_million_output_usd})
        return verdict[r]

    best = fewest_meeting(meets, 1, max_replicas)
    if best is None:
        return LlmPlan(None, None, ttft_p99_ms, tpot_p99_ms, None, search)
    return LlmPlan(best, best * spec.tp * spec.pp, ttft_p99_ms, tpot_p99_ms, tried[best],
                   sorted(search, key=lambda s: s["replicas"]))
