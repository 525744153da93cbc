"""The scheduling rules of the LLM servers servelab validates against, each named and
each with the simulator that runs it (`simulate`).

**vLLM v1** (`vllm-v1`): the scheduler as `serving.py`'s docstring gives it, with the
server's `max_num_seqs`, `max_num_batched_tokens`, block size and KV blocks.

**llama.cpp server** (`llama.cpp`): its own simulator, `llama_cpp.simulate_llama_cpp`,
whose docstring gives the rule: `-np` slots that each own their KV (nothing preempted),
a slot per request by least recent use, one batch an iteration (decodes in slot order,
then prompts in slot order up to `-b`), cut into ubatches of consecutive slots, each a
pass over the model.
"""

from __future__ import annotations

from enum import StrEnum

from servelab.errors import invalid
from servelab.llm.llama_cpp import (
    LLAMA_CPP_N_BATCH,
    LLAMA_CPP_N_UBATCH,
    LlamaCppConfig,
    simulate_llama_cpp,
)
from servelab.llm.serving import (
    ProfileStepModel,
    Requests,
    SchedulerConfig,
    ServingResult,
    StepModel,
    simulate_serving,
)

__all__ = ["LLAMA_CPP_N_BATCH", "LLAMA_CPP_N_UBATCH", "SchedulingRule", "llama_cpp",
           "simulate", "vllm_v1"]


class SchedulingRule(StrEnum):
    VLLM_V1 = "vllm-v1"
    LLAMA_CPP = "llama.cpp"

    @classmethod
    def parse(cls, text: str) -> SchedulingRule:
        try:
            return cls(text)
        except ValueError:
            raise invalid("--rule", text, "vllm-v1 or llama.cpp",
                          "use --rule llama.cpp for llama-server, vllm-v1 for vLLM") from None


def llama_cpp(slots: int, ctx_per_slot: int, n_batch: int = LLAMA_CPP_N_BATCH,
              n_ubatch: int = LLAMA_CPP_N_UBATCH) -> LlamaCppConfig:
    """llama.cpp's server with its slots, context per slot, -b and -ub."""
    cfg = LlamaCppConfig(slots, ctx_per_slot, n_batch, n_ubatch)
    cfg.check()
    return cfg


def vllm_v1(num_blocks: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
            enable_prefix_caching: bool = False) -> SchedulerConfig:
    """vLLM v1 with the server's own limits."""
    return SchedulerConfig(num_blocks=num_blocks, block_size=block_size,
                           max_num_seqs=max_num_seqs,
                           max_num_batched_tokens=max_num_batched_tokens,
                           enable_chunked_prefill=True,
                           enable_prefix_caching=enable_prefix_caching)


def simulate(req: Requests, cfg: SchedulerConfig | LlamaCppConfig,
             model: StepModel | ProfileStepModel, max_concurrency: int = 0) -> ServingResult:
    """The requests through the engine `cfg` describes: llama.cpp's server or vLLM v1."""
    if isinstance(cfg, LlamaCppConfig):
        return simulate_llama_cpp(req, cfg, model, max_concurrency)
    return simulate_serving(req, cfg, model, max_concurrency)
