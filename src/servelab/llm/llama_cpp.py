"""llama.cpp's server, step by step: its slots, the batch each loop iteration builds, and
the micro-batches (ubatches) `llama_decode` cuts that batch into, each priced as a step.

What the server does, from the source servelab's tests build it from (llama-cpp-python
0.3.36's vendored llama.cpp; docs/llm-measure.md gives the measurements):

- **Slots** (`-np N`): each holds one request, and owns `-c / N` tokens of KV, so nothing
  is preempted. A request that finds every slot busy waits, first come first served.
  `get_available_slot` (tools/server/server-context.cpp) gives a request the idle slot
  used least recently: the least `t_last_used`, stamped when a slot is released,
  compared with `<=` over the slots in id order, so of slots never used the *highest* id
  wins. Slots released in one iteration are stamped in id order. (A slot whose cached
  prompt shares more than `--slot-prompt-similarity` of a new prompt is taken first;
  servelab's prompts are unique, so that rule is left out.)
- **The batch** (`update_slots`): one token for every generating slot, in slot order;
  then prompt tokens of the slots still on their prompt, in slot order, until the batch
  holds `n_batch` (`-b`, default 2,048) tokens; a prompt that does not fit goes on in
  the next iteration. The token sampled when a prompt's last token is decoded is the
  request's first output token. One `llama_decode` per iteration (the server's
  `llamacpp:n_decode_total` counts them: the simulator's `steps`).
- **Ubatches** (`llama_batch_allocr::split_equal(n_ubatch, sequential=true)`,
  src/llama-batch.cpp, used when the KV cache has a stream per slot: the default, not
  `--kv-unified`): scanning the batch in order, a ubatch takes the first sequence with
  tokens left, then each later sequence whose slot is the last taken one's plus one;
  from each it takes the same number of tokens, the fewest any of them has left, and at
  most `n_ubatch` (`-ub`, default 512) in all. Decodes on slots 0 and 2 with a prompt on
  slot 1 make three ubatches: slots 0 and 1 one token each, slot 2's token, then the
  rest of slot 1's prompt. Each ubatch is one pass over the model (it reads every
  weight), so the step model prices each ubatch and a step is their sum.
- A request whose prompt and output do not fit one slot's context is refused here (the
  server cuts or refuses it).
- **The steps after a prompt** run slower than the same steps later on: on this VM's
  llama-server the first step of decodes alone after a step with prompt tokens took about
  twice the model's time, the second 1.4-1.7 times, the third 1.2-1.3 (a 2-layer model,
  2 ms steps, 2026-12-04; a 15 ms step gained about 5%). The cause is not known (the
  CPU's caches or clock after a compute-heavy pass are candidates); `llm validate`
  measures it from its own decode runs (`ProfileStepModel.after_prefill_ms`) and the
  simulator adds it to the decode steps that follow each step with prompt tokens.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from servelab.errors import invalid
from servelab.llm.serving import (
    MAX_STEPS,
    ProfileStepModel,
    Requests,
    Sends,
    ServingResult,
    StepModel,
    serving_result,
)

LLAMA_CPP_N_BATCH = 2048  # llama.cpp's default -b
LLAMA_CPP_N_UBATCH = 512  # its default -ub
MAX_SLOTS = 4096
BLOCK_SIZE = 16  # the KV series counts 16-token blocks, as the vLLM rule's does


@dataclass(frozen=True, slots=True)
class LlamaCppConfig:
    slots: int
    ctx_per_slot: int
    n_batch: int = LLAMA_CPP_N_BATCH
    n_ubatch: int = LLAMA_CPP_N_UBATCH

    def check(self) -> None:
        for name, v, hi in (("slots", self.slots, MAX_SLOTS),
                            ("context per slot", self.ctx_per_slot, 10_000_000),
                            ("--max-num-batched-tokens (n_batch)", self.n_batch, 10_000_000),
                            ("n_ubatch (-ub)", self.n_ubatch, 10_000_000)):
            if not 1 <= v <= hi:
                raise invalid(name, v, f"1 to {hi:,}", "check the server's /props or the flag")
        if self.slots > self.n_ubatch:
            raise invalid("slots", self.slots, f"at most n_ubatch ({self.n_ubatch})",
                          "fewer slots (-np, --max-num-seqs), or a server with a larger -ub")


@dataclass(frozen=True, slots=True)
class Ubatch:
    """One pass over the model: its tokens, how many of them are prompt tokens, the
    decodes (one token each), the KV tokens its sequences read (their context before
    it), and the sequences that sample a token (decodes, and prompts it finishes)."""

    tokens: int
    prefill: int
    decodes: int
    kv_read: int
    attn: float
    sampled: int


@dataclass(frozen=True, slots=True)
class Seq:
    """One slot's part of a batch: its new tokens, the tokens in its KV before them,
    whether it is a decode, and whether it ends its prompt (samples a token)."""

    slot: int
    new: int
    context: int
    decode: bool
    samples: bool


def split_equal(batch: list[Seq], n_ubatch: int) -> list[Ubatch]:
    """The batch (in its order: decodes in slot order, then prompts in slot order) cut
    as `split_equal(n_ubatch, sequential=true)` cuts it (module docstring)."""
    if all(s.decode for s in batch):  # most steps: one token each, runs of slots
        return _decode_runs(batch)
    left = [s.new for s in batch]
    done = [0] * len(batch)
    out: list[Ubatch] = []
    while True:
        chosen: list[int] = []
        last = -2
        for j, s in enumerate(batch):
            if left[j] and (not chosen or s.slot == last + 1):
                chosen.append(j)
                last = s.slot
        if not chosen:
            return out
        take = max(1, min(min(left[j] for j in chosen), n_ubatch // len(chosen)))
        prefill = decodes = kv = sampled = 0
        attn = 0.0
        for j in chosen:
            s = batch[j]
            c = s.context + done[j]
            kv += c
            attn += take * c + take * (take + 1) / 2
            left[j] -= take
            done[j] += take
            if s.decode:
                decodes += 1
            else:
                prefill += take
            sampled += int(s.decode or (s.samples and not left[j]))
        out.append(Ubatch(take * len(chosen), prefill, decodes, kv, attn, sampled))


def _decode_runs(batch: list[Seq]) -> list[Ubatch]:
    """split_equal of a batch of decodes alone (in slot order, one token each, at most
    n_ubatch of them): a ubatch for each run of consecutive slots."""
    out: list[Ubatch] = []
    n = kv = 0
    last = -2
    for s in batch:
        if n and s.slot != last + 1:
            out.append(Ubatch(n, 0, n, kv, float(kv + n), n))
            n = kv = 0
        n += 1
        kv += s.context
        last = s.slot
    if n:
        out.append(Ubatch(n, 0, n, kv, float(kv + n), n))
    return out


def step_s(ubatches: list[Ubatch], model: StepModel | ProfileStepModel) -> float:
    """A step's time: each ubatch a pass over the model."""
    return sum(model.step_s(u.tokens, u.attn, u.kv_read, u.decodes, u.sampled)
               for u in ubatches)


def simulate_llama_cpp(req: Requests, cfg: LlamaCppConfig,
                       model: StepModel | ProfileStepModel, max_concurrency: int = 0
                       ) -> ServingResult:
    """One llama.cpp server (module docstring) on these requests; with `max_concurrency`
    > 0 a closed loop of that many clients, as `simulate_serving` runs one."""
    cfg.check()
    n = req.arrival_s.size
    order = np.argsort(req.arrival_s, kind="stable")
    sends = Sends(req.arrival_s[order].tolist(), max_concurrency)
    prompt = req.prompt[order].tolist()
    output = req.output[order].tolist()
    computed = [0] * n
    gen = [0] * n
    first = [math.nan] * n
    done = [math.nan] * n
    rejected = [False] * n
    holder: list[int] = [-1] * cfg.slots  # the request in each slot, -1 when idle
    # when each slot was last released: (time, order of release); never: below every time
    last_used: list[tuple[float, int]] = [(-math.inf, 0)] * cfg.slots
    released = 0
    waiting: deque[int] = deque()
    t = 0.0
    steps = 0
    busy = 0.0
    running_sum = 0.0
    prefill_tok = decode_tok = 0
    kv_t: list[float] = []
    kv_b: list[int] = []
    finished = 0
    after = getattr(model, "after_prefill_ms", ())  # the profile's; the roofline has none
    since = len(after)  # decode steps since the last step with prompt tokens

    while finished < n:
        while sends.next_at() <= t:
            i = sends.take()
            if prompt[i] + output[i] > cfg.ctx_per_slot:
                rejected[i] = True
                finished += 1
                sends.free(sends.arrival[i])
                continue
            waiting.append(i)
        while waiting:  # the least recently used idle slot; of equals, the highest id
            idle = [s for s in range(cfg.slots) if holder[s] < 0]
            if not idle:
                break
            s = min(idle, key=lambda k: (last_used[k], -k))
            holder[s] = waiting.popleft()
        batch = [Seq(s, 1, computed[i], True, True) for s, i in enumerate(holder)
                 if i >= 0 and gen[i] > 0]
        room = cfg.n_batch - len(batch)
        for s, i in enumerate(holder):
            if room <= 0:
                break
            if i >= 0 and gen[i] == 0:
                new = min(prompt[i] - computed[i], room)
                batch.append(Seq(s, new, computed[i], False, computed[i] + new == prompt[i]))
                room -= new
        if not batch:
            if sends.nxt >= n:
                break
            t = max(t, sends.next_at())
            continue
        steps += 1
        if steps > MAX_STEPS:
            raise invalid("simulation", f"{MAX_STEPS:,} steps", "fewer steps",
                          "fewer requests, or a higher n_batch")
        dt = step_s(split_equal(batch, cfg.n_ubatch), model)
        if after:  # the steps after a prompt (module docstring)
            if any(not b.decode for b in batch):
                since = 0
            else:
                if since < len(after):
                    dt += after[since] / 1e3
                since += 1
        t += dt
        busy += dt
        running_sum += sum(h >= 0 for h in holder)
        for b in batch:
            i = holder[b.slot]
            computed[i] += b.new
            if b.decode:
                decode_tok += 1
            else:
                prefill_tok += b.new
            if computed[i] < prompt[i]:
                continue
            gen[i] += 1
            if gen[i] == 1:
                first[i] = t
            if gen[i] >= output[i]:
                done[i] = t
                holder[b.slot] = -1
                released += 1
                last_used[b.slot] = (t, released)
                finished += 1
                sends.free(t)
        kv_t.append(t)
        kv_b.append(sum(-(-computed[i] // BLOCK_SIZE) for i in holder if i >= 0))
    return serving_result(order, sends.arrival, first, done, output, [0] * n, rejected, gen,
                          kv_t, kv_b, [], steps=steps, busy_s=busy, end_s=t,
                          running_sum=running_sum, prefill_tokens=prefill_tok,
                          decode_tokens=decode_tok)
