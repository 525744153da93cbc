"""KV-cache allocation, paged versus contiguous: a replay of one request stream.

The baselines are the PagedAttention paper's (Kwon et al., SOSP 2023, §2.3
and Fig. 2): an Orca-style server reserves, when it admits a request, a
contiguous chunk for the request's maximum possible length (``max``), for the
next power of two of its real length (``pow2``), or for exactly its real
length (``oracle``, which no real server knows). vLLM instead allocates
fixed-size blocks on demand (``paged``), and can share the blocks of a common
prompt prefix between requests (``paged_prefix``).

Time advances in decode iterations. Each iteration every running sequence
adds one token; then waiting requests are admitted first-come first-served
while memory allows (and ``max_num_seqs``). A paged sequence that needs a
block when none is free preempts the most recently admitted sequence, which
frees its blocks and later recomputes (vLLM's default). The memory at each
iteration is split into: token states; reserved slots a sequence will still
fill; internal fragmentation (slots it never will); external fragmentation
(free memory that the waiting request at the head cannot use because no
contiguous hole is large enough); and free memory.

The allocators keep their own books (``BlockPool``, ``FirstFitArena``) so
tests can assert conservation: every block or token slot is free or owned,
never both, never beyond the pool.
"""

from __future__ import annotations

import csv
import heapq
import io
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import numpy as np

from servelab.errors import invalid
from servelab.files import read_text


class Strategy(Enum):
    CONTIGUOUS_MAX = "contiguous_max"
    CONTIGUOUS_POW2 = "contiguous_pow2"
    CONTIGUOUS_ORACLE = "contiguous_oracle"
    PAGED = "paged"
    PAGED_PREFIX = "paged_prefix"

    @property
    def paged(self) -> bool:
        return self in (Strategy.PAGED, Strategy.PAGED_PREFIX)


# ---------------------------------------------------------------------------
# Allocators


class BlockPool:
    """Fixed-size blocks: a FIFO free list and reference counts (vLLM's BlockPool shape).

    Running out is a returned value (``allocate`` gives None), not an exception.
    """

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.free: deque[int] = deque(range(num_blocks))
        self.refs = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self.free)

    def allocate(self, n: int) -> list[int] | None:
        if n > len(self.free):
            return None
        out = [self.free.popleft() for _ in range(n)]
        for b in out:
            self.refs[b] = 1
        return out

    def share(self, blocks: list[int]) -> None:
        for b in blocks:
            assert self.refs[b] > 0, "sharing a free block"
            self.refs[b] += 1

    def release(self, blocks: list[int]) -> None:
        for b in blocks:
            assert self.refs[b] > 0, "double free"
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free.append(b)


class FirstFitArena:
    """A contiguous address space of token slots with first-fit allocation."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.holes: list[tuple[int, int]] = [(0, capacity)] if capacity > 0 else []  # (start, len)
        self.num_free = max(capacity, 0)  # the holes' total, kept as they change

    @property
    def largest_hole(self) -> int:
        return max((n for _, n in self.holes), default=0)

    def allocate(self, n: int) -> int | None:
        for i, (start, length) in enumerate(self.holes):
            if length >= n:
                if length == n:
                    del self.holes[i]
                else:
                    self.holes[i] = (start + n, length - n)
                self.num_free -= n
                return start
        return None

    def release(self, start: int, n: int) -> None:
        holes = self.holes
        self.num_free += n
        i = 0
        while i < len(holes) and holes[i][0] < start:
            i += 1
        assert i == 0 or holes[i - 1][0] + holes[i - 1][1] <= start, "overlapping free"
        assert i == len(holes) or start + n <= holes[i][0], "overlapping free"
        holes.insert(i, (start, n))
        if i + 1 < len(holes) and start + n == holes[i + 1][0]:  # merge right
            holes[i] = (start, n + holes[i + 1][1])
            del holes[i + 1]
        if i > 0 and holes[i - 1][0] + holes[i - 1][1] == start:  # merge left
            holes[i - 1] = (holes[i - 1][0], holes[i - 1][1] + holes[i][1])
            del holes[i]


# ---------------------------------------------------------------------------
# Workload


@dataclass(frozen=True, slots=True)
class LengthModel:
    """Prompt and output lengths, log-normal with the named trace's means."""

    name: str
    prompt_mean: float
    output_mean: float
    sigma: float
    source: str


# Means from the PagedAttention paper (Kwon et al. 2023), Fig. 11: ShareGPT prompts average
# 161.31 tokens and outputs 337.99; Alpaca 19.31 and 58.45. The log-normal shape and its
# sigma are servelab's assumption (the paper shows long-tailed histograms, not a fit).
LENGTH_MODELS = {
    "sharegpt": LengthModel("sharegpt", 161.31, 337.99, 1.0,
                            "PagedAttention paper Fig. 11 means; log-normal, sigma assumed"),
    "alpaca": LengthModel("alpaca", 19.31, 58.45, 0.8,
                          "PagedAttention paper Fig. 11 means; log-normal, sigma assumed"),
}


@dataclass(frozen=True, slots=True)
class Workload:
    arrival_step: np.ndarray  # iteration at which each request arrives (sorted)
    prompt: np.ndarray  # prompt tokens, shared prefix included
    output: np.ndarray  # tokens to generate
    prefix_tokens: int  # leading prompt tokens every request shares


def _lognormal_ints(rng: np.random.Generator, mean: float, sigma: float, n: int) -> np.ndarray:
    mu = math.log(mean) - sigma * sigma / 2  # so that the mean is `mean`
    return np.maximum(1, np.rint(rng.lognormal(mu, sigma, n))).astype(np.int64)


def synthetic_workload(name: str, num_requests: int, rate_per_step: float, max_len: int,
                       prefix_tokens: int, rng: np.random.Generator) -> Workload:
    """Poisson arrivals; prompt and output lengths from a named model, cut to max_len."""
    if name not in LENGTH_MODELS:
        raise invalid("--lengths", name, f"one of {', '.join(LENGTH_MODELS)} or a CSV trace",
                      "use --lengths sharegpt")
    lm = LENGTH_MODELS[name]
    prompt = _lognormal_ints(rng, lm.prompt_mean, lm.sigma, num_requests) + prefix_tokens
    output = _lognormal_ints(rng, lm.output_mean, lm.sigma, num_requests)
    return _finish(rng, num_requests, rate_per_step, prompt, output, max_len, prefix_tokens)


def read_lengths_csv(path: Path, max_rows: int, field: str = "--lengths",
                     max_tokens: int = 10**8) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output token counts from a CSV with prompt_tokens and output_tokens
    columns (its first `max_rows` rows); every problem is one line naming `field`."""
    text = read_text(path, field, what="CSV of prompt_tokens,output_tokens")
    try:
        rows = []
        for row in csv.DictReader(io.StringIO(text, newline="")):
            rows.append(row)
            if len(rows) >= max_rows:
                break
    except csv.Error as exc:
        raise invalid(field, str(path), "a CSV", f"fix the file ({exc})") from None
    if not rows or not {"prompt_tokens", "output_tokens"} <= set(rows[0]):
        raise invalid(field, str(path), "columns prompt_tokens and output_tokens",
                      "rename the CSV's columns")
    try:
        prompt = np.array([int(r["prompt_tokens"]) for r in rows], dtype=np.int64)
        output = np.array([int(r["output_tokens"]) for r in rows], dtype=np.int64)
    except (ValueError, TypeError, OverflowError):
        raise invalid(field, str(path), "whole token counts", "fix the rows") from None
    if (prompt < 1).any() or (output < 1).any() or (prompt > max_tokens).any() or (
            output > max_tokens).any():
        raise invalid(field, str(path), f"counts from 1 to {max_tokens:,}",
                      "drop empty or corrupt rows")
    return prompt, output


def trace_workload(path: Path, num_requests: int, rate_per_step: float, max_len: int,
                   prefix_tokens: int, rng: np.random.Generator) -> Workload:
    """Lengths from a CSV with prompt_tokens and output_tokens columns (first N rows)."""
    prompt, output = read_lengths_csv(path, num_requests)
    return _finish(rng, prompt.size, rate_per_step, prompt + prefix_tokens, output, max_len,
                   prefix_tokens)


def _finish(rng: np.random.Generator, n: int, rate: float, prompt: np.ndarray,
            output: np.ndarray, max_len: int, prefix: int) -> Workload:
    if prefix + 2 > max_len:
        raise invalid("--prefix-tokens", prefix, f"fewer than max_len - 1 ({max_len - 1})",
                      "shorten the shared prefix or raise --max-len")
    prompt = np.minimum(prompt, max_len - 1)
    output = np.minimum(output, max_len - prompt)  # a request never outgrows max_len
    steps = np.floor(np.cumsum(rng.exponential(1.0 / rate, n))).astype(np.int64)
    return Workload(steps, prompt, output, prefix)


# ---------------------------------------------------------------------------
# Simulation


@dataclass(slots=True)
class _Seq:
    rid: int
    final: int  # prompt + output
    length: int = 0  # token states stored when admitted
    start: int = -1  # contiguous: arena offset
    reserved: int = 0  # contiguous: slots reserved
    blocks: list[int] = field(default_factory=list)  # paged: own blocks
    first_step: int = 0  # the first iteration it decodes in (it adds a token each one)
    order: int = 0  # its admission's number: the running sequences' order
    due: int = 0  # the iteration of its next event (a block needed, or its last token)

    def length_at(self, step: int) -> int:
        """Token states stored before iteration `step`'s decode."""
        return self.length + step - self.first_step


@dataclass(frozen=True, slots=True)
class PagingResult:
    strategy: str
    pool_tokens: int
    block_size: int
    # Time-averaged shares of the pool, each set summing to 1: over the iterations when
    # requests were waiting (the pool is the bottleneck), and over the whole run.
    under_load: dict[str, float]
    overall: dict[str, float]
    load_steps: int
    mean_concurrency: float
    max_concurrency: int
    arrived: int
    completed: int
    rejected_too_long: int
    running_at_end: int
    waiting_at_end: int
    admissions: int
    preemptions: int
    steps: int
    mean_wait_steps: float | None  # None: nothing was admitted
    series: dict[str, list[float]]  # per sampled iteration, the shares above + concurrency


SERIES_MAX = 100_000  # iterations kept for the series (sampled down to series_points)
FREE = 4  # the "free" kind's place in a row
IDLE_ROW = (0.0, 0.0, 0.0, 0.0, 1.0, 0.0)  # an iteration with nothing in the system


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def simulate_paging(
    work: Workload,
    strategy: Strategy,
    pool_tokens: int,
    block_size: int = 16,
    max_len: int = 2048,
    max_num_seqs: int = 256,
    max_steps: int = 1_000_000,
    series_points: int = 200,
    on_progress: Callable[[int], object] | None = None,
) -> PagingResult:
    """Replay `work` against a pool of `pool_tokens` token slots under `strategy`."""
    paged = strategy.paged
    n = work.arrival_step.size
    num_blocks = pool_tokens // block_size
    capacity = num_blocks * block_size if paged else pool_tokens
    pool = BlockPool(num_blocks) if paged else None
    arena = None if paged else FirstFitArena(pool_tokens)
    share_prefix = strategy is Strategy.PAGED_PREFIX and work.prefix_tokens >= block_size
    prefix_full_blocks = work.prefix_tokens // block_size if share_prefix else 0
    prefix_blocks: list[int] = []  # the shared blocks while any sequence holds them

    final = (work.prompt + work.output).astype(np.int64)
    generated = np.zeros(n, dtype=np.int64)  # kept across a preemption (recompute)
    waiting: deque[int] = deque()
    # the running sequences by admission number, oldest first (the last: the most recent)
    running: dict[int, _Seq] = {}
    # (iteration, admission) of each running sequence's next event: the decode of every
    # other sequence is one more token, counted for all at once (`length_at`, `held_base`)
    events: list[tuple[int, int]] = []
    admitted_so_far = 0
    nxt = completed = rejected = admissions = preemptions = 0
    wait_total = 0
    kinds = ("token", "reserved", "internal", "external", "free")
    sums_k = [0.0] * len(kinds)  # each kind's share summed over the iterations
    load_k = [0.0] * len(kinds)  # ... over those with a request waiting
    load_steps = 0
    watermark = math.ceil(0.01 * num_blocks)  # vLLM's default admission watermark (1%)
    conc_sum = conc_max = 0
    rows: list[tuple[float, ...]] = []  # per iteration: the kinds' shares, concurrency
    step = 0

    def own_blocks_needed(tokens: int) -> int:
        return math.ceil(tokens / block_size) - prefix_full_blocks

    # What the running sequences hold, kept as they change rather than summed each step
    # (the replay's cost was that loop): min(allocated, final) and max(0, allocated -
    # final) summed, with `final` and `allocated` counted past the shared prefix; their
    # token states after iteration j's decode are held_base + (j + 1) x len(running).
    held_base = held_cap = held_internal = 0
    prefix_len = prefix_full_blocks * block_size if paged else 0

    def hold(s: _Seq, sign: int) -> None:
        """Add (+1) or take away (-1) a sequence's memory: its allocation past the prefix."""
        nonlocal held_cap, held_internal
        alloc = (len(s.blocks) * block_size) if paged else s.reserved
        final_own = s.final - prefix_len
        held_cap += sign * min(alloc, final_own)
        held_internal += sign * max(0, alloc - final_own)

    def next_event(s: _Seq, length: int) -> int:
        """The iteration of its next event, from `length` states before `s.due`'s decode:
        a block boundary (paged, before its last token), else its last token."""
        last = s.final - 1  # the length before the decode that completes it
        if paged:
            boundary = -(-length // block_size) * block_size
            if boundary < s.final:
                last = min(last, boundary)
        return s.first_step + (last - s.length)

    def leave(s: _Seq) -> None:
        """A running sequence leaves (done or preempted): its memory and its count go."""
        nonlocal held_base
        del running[s.order]
        held_base -= s.length - s.first_step
        hold(s, -1)
        free_seq(s)

    # The head of the queue that could not be admitted, until memory is freed: nothing
    # else makes room (decode only takes more), so it is not tried again before then.
    blocked_rid, blocked_need, freed = -1, 0, False

    def free_seq(s: _Seq) -> None:
        nonlocal freed
        freed = True
        if paged:
            assert pool is not None
            pool.release(s.blocks)
            if prefix_full_blocks:
                pool.release(prefix_blocks)
        else:
            assert arena is not None
            arena.release(s.start, s.reserved)

    def reservation(rid: int) -> int:
        if strategy is Strategy.CONTIGUOUS_MAX:
            return max_len
        if strategy is Strategy.CONTIGUOUS_POW2:
            return min(_pow2(int(final[rid])), max(max_len, int(final[rid])))
        return int(final[rid])

    def try_admit(rid: int) -> _Seq | None:
        tokens = int(work.prompt[rid] + generated[rid])
        seq = _Seq(rid, int(final[rid]), length=tokens)
        if paged:
            assert pool is not None
            shared = bool(prefix_full_blocks) and bool(prefix_blocks) and pool.refs[
                prefix_blocks[0]] > 0
            need = own_blocks_needed(tokens) + (prefix_full_blocks if not shared else 0)
            if pool.num_free - need < watermark:
                return None
            got = pool.allocate(need)
            assert got is not None
            if prefix_full_blocks:
                if shared:
                    pool.share(prefix_blocks)
                else:
                    prefix_blocks[:] = got[:prefix_full_blocks]
                    got = got[prefix_full_blocks:]
            seq.blocks = got
        else:
            assert arena is not None
            seq.reserved = reservation(rid)
            start = arena.allocate(seq.reserved)
            if start is None:
                return None
            seq.start = start
        return seq

    while (completed + rejected < n) and step < max_steps:
        if not running and not waiting and nxt < n and work.arrival_step[nxt] > step:
            # Nothing in the system until the next arrival: the pool is all free meanwhile.
            skip = min(int(work.arrival_step[nxt]), max_steps) - step
            sums_k[FREE] += skip
            room = min(skip, SERIES_MAX - len(rows))
            rows.extend([IDLE_ROW] * room)
            step += skip
            continue
        while nxt < n and work.arrival_step[nxt] <= step:
            waiting.append(nxt)
            nxt += 1
        # Decode: every running sequence adds a token (oldest first). Only those with an
        # event now need a turn of their own: a block at a boundary (which, when none is
        # free, preempts the most recently admitted), or their last token.
        while events and events[0][0] <= step:
            _, order = heapq.heappop(events)
            s = running.get(order)
            if s is None or s.due != step:  # it left (done or preempted) since
                continue
            length = s.length_at(step)
            if paged and length % block_size == 0 and length < s.final:
                assert pool is not None
                got = pool.allocate(1)
                while got is None:
                    victim = running[next(reversed(running))]  # the most recently admitted
                    leave(victim)
                    generated[victim.rid] = victim.length_at(step) - int(work.prompt[victim.rid])
                    waiting.appendleft(victim.rid)
                    preemptions += 1
                    if victim is s:
                        break
                    got = pool.allocate(1)
                if got is None:  # s preempted itself
                    continue
                hold(s, -1)
                s.blocks.extend(got)
                hold(s, +1)
            if length + 1 >= s.final:
                leave(s)
                completed += 1
                continue
            s.due = next_event(s, length + 1)
            heapq.heappush(events, (s.due, order))
        # Admit, first come first served, while memory and max_num_seqs allow.
        head_blocked_need = 0
        while waiting and len(running) < max_num_seqs:
            rid = waiting[0]
            if rid == blocked_rid and not freed:  # as it was: still no room
                head_blocked_need = blocked_need
                break
            too_long = (own_blocks_needed(int(final[rid])) + prefix_full_blocks > num_blocks
                        if paged else reservation(rid) > pool_tokens)
            if too_long:
                waiting.popleft()
                rejected += 1
                continue
            seq = try_admit(rid)
            if seq is None:
                head_blocked_need = blocked_need = 0 if paged else reservation(rid)
                blocked_rid, freed = rid, False
                break
            waiting.popleft()
            seq.first_step, seq.order = step + 1, admitted_so_far
            admitted_so_far += 1
            running[seq.order] = seq
            held_base += seq.length - seq.first_step
            hold(seq, +1)
            seq.due = next_event(seq, seq.length)
            heapq.heappush(events, (seq.due, seq.order))
            admissions += 1
            wait_total += step - int(work.arrival_step[rid])
        # Where the memory is, this iteration.
        held_len = held_base + (step + 1) * len(running)
        tokens = held_len - prefix_len * len(running)  # each one's own token states
        reserved = held_cap - tokens
        internal = held_internal
        if prefix_len and running:  # the shared prefix's states, held once
            tokens += prefix_len
        free = (pool.num_free * block_size) if pool is not None else (
            arena.num_free if arena is not None else 0)
        external = free if (head_blocked_need and free >= head_blocked_need) else 0
        free -= external
        used = tokens + reserved + internal + external + free
        assert used == capacity, (used, capacity)
        shares = (tokens / capacity, reserved / capacity, internal / capacity,
                  external / capacity, free / capacity)
        for k, v in enumerate(shares):
            sums_k[k] += v
        if waiting:
            load_steps += 1
            for k, v in enumerate(shares):
                load_k[k] += v
        conc_sum += len(running)
        conc_max = max(conc_max, len(running))
        if len(rows) < SERIES_MAX:
            rows.append((*shares, float(len(running))))
        step += 1
        if on_progress is not None and step % 1000 == 0:
            on_progress(completed + rejected)

    steps = max(step, 1)
    stride = max(1, len(rows) // series_points)
    sampled = rows[::stride]
    series = {k: [r[i] for r in sampled] for i, k in enumerate((*kinds, "concurrency"))}
    sums = dict(zip(kinds, sums_k, strict=True))
    load_sums = dict(zip(kinds, load_k, strict=True))
    return PagingResult(
        strategy=strategy.value,
        pool_tokens=capacity,
        block_size=block_size if paged else 1,
        under_load={k: v / load_steps for k, v in load_sums.items()} if load_steps else {
            k: v / steps for k, v in sums.items()},
        overall={k: v / steps for k, v in sums.items()},
        load_steps=load_steps,
        mean_concurrency=conc_sum / steps,
        max_concurrency=conc_max,
        arrived=nxt,
        completed=completed,
        rejected_too_long=rejected,
        running_at_end=len(running),
        waiting_at_end=len(waiting) + (n - nxt),
        admissions=admissions,
        preemptions=preemptions,
        steps=step,
        mean_wait_steps=wait_total / admissions if admissions else None,
        series=series,
    )
