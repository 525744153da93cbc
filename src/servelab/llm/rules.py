"""The scheduling rules of the LLM servers servelab validates against, each named and
mapped onto the one continuous-batching scheduler `simulate_serving` runs.

**vLLM v1** (`vllm-v1`): the scheduler as `serving.py`'s docstring gives it, with the
server's `max_num_seqs`, `max_num_batched_tokens`, block size and KV blocks.

**llama.cpp server** (`llama.cpp`), as `tools/server/server.cpp`'s `update_slots` runs it:

- `-np N` slots, each holding one request; a request that finds every slot busy waits,
  first come first served, and takes the first slot to free.
- Each loop iteration builds one batch: first one token for every slot that is
  generating, then prompt tokens of slots still processing their prompt, in slot order,
  until the batch holds `n_batch` (`-b`, default 2,048) tokens. A prompt longer than the
  room left goes on in the next iteration (chunked). One `llama_decode` per iteration.
- The token sampled when a prompt's last chunk is decoded is the first output token.
- Each slot owns `n_ctx / N` tokens of KV (`-c`), fixed: no request takes another's, so
  nothing is ever preempted.

That is vLLM's rule with `max_num_seqs` = slots, `max_num_batched_tokens` = `n_batch`,
chunked prefill on, no prefix caching (a slot's own prompt cache is left out: servelab's
prompts are unique), and a KV pool of slots × per-slot context that never runs short for
requests that fit a slot. What differs and is not modelled: prompt chunks go in slot
order, not arrival order (the same while requests take slots in arrival order), and a
request longer than its slot's context is cut by the server, not refused.
"""

from __future__ import annotations

from enum import StrEnum

from servelab.errors import invalid
from servelab.llm.serving import SchedulerConfig

BLOCK_SIZE = 16
LLAMA_CPP_N_BATCH = 2048  # llama.cpp's default -b


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


def llama_cpp(slots: int, ctx_per_slot: int, n_batch: int = LLAMA_CPP_N_BATCH
              ) -> SchedulerConfig:
    """llama.cpp's server as the shared scheduler runs it (see the module docstring)."""
    for name, v, hi in (("slots", slots, 4096), ("context per slot", ctx_per_slot, 10_000_000),
                        ("--max-num-batched-tokens (n_batch)", n_batch, 10_000_000)):
        if not 1 <= v <= hi:
            raise invalid(name, v, f"1 to {hi:,}", "check the server's /props or the flag")
    return SchedulerConfig(num_blocks=slots * -(-ctx_per_slot // BLOCK_SIZE),
                           block_size=BLOCK_SIZE, max_num_seqs=slots,
                           max_num_batched_tokens=n_batch, enable_chunked_prefill=True)


def vllm_v1(num_blocks: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
            enable_prefix_caching: bool = False) -> SchedulerConfig:
    """vLLM v1 with the server's own limits."""
    return SchedulerConfig(num_blocks=num_blocks, block_size=block_size,
                           max_num_seqs=max_num_seqs,
                           max_num_batched_tokens=max_num_batched_tokens,
                           enable_chunked_prefill=True,
                           enable_prefix_caching=enable_prefix_caching)
