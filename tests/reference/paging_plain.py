"""The KV paging replay written plainly, as it stood before it was made event-driven
(servelab.llm.paging, 2026-12-05): every running sequence decodes one token a step in a
loop, and each step's memory is summed over them. Slow, and simple enough to read
against the KV paging paper; tests/unit/test_paging_reference.py holds the fast replay to
it, result for result."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from servelab.llm.paging import PagingResult, Strategy, Workload


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

    @property
    def num_free(self) -> int:
        return sum(n for _, n in self.holes)

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
                return start
        return None

    def release(self, start: int, n: int) -> None:
        holes = self.holes
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


@dataclass(slots=True)
class _Seq:
    rid: int
    final: int  # prompt + output
    length: int = 0  # token states stored
    start: int = -1  # contiguous: arena offset
    reserved: int = 0  # contiguous: slots reserved
    blocks: list[int] = field(default_factory=list)  # paged: own blocks


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
    running: list[_Seq] = []
    nxt = completed = rejected = admissions = preemptions = 0
    wait_total = 0
    kinds = ("token", "reserved", "internal", "external", "free")
    sums = dict.fromkeys(kinds, 0.0)
    load_sums = dict.fromkeys(kinds, 0.0)
    load_steps = 0
    watermark = math.ceil(0.01 * num_blocks)  # vLLM's default admission watermark (1%)
    conc_sum = conc_max = 0
    series: dict[str, list[float]] = {k: [] for k in (*sums, "concurrency")}
    step = 0

    def own_blocks_needed(tokens: int) -> int:
        return math.ceil(tokens / block_size) - prefix_full_blocks

    def free_seq(s: _Seq) -> None:
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
            sums["free"] += skip
            room = min(skip, 100_000 - len(series["token"]))
            for key in series:
                series[key].extend([1.0 if key == "free" else 0.0] * room)
            step += skip
            continue
        while nxt < n and work.arrival_step[nxt] <= step:
            waiting.append(nxt)
            nxt += 1
        # Decode: every running sequence adds a token (oldest first).
        i = 0
        while i < len(running):
            s = running[i]
            if paged and s.length % block_size == 0 and s.length < s.final:
                assert pool is not None
                got = pool.allocate(1)
                while got is None:
                    victim = running.pop()  # the most recently admitted
                    free_seq(victim)
                    generated[victim.rid] = victim.length - int(work.prompt[victim.rid])
                    waiting.appendleft(victim.rid)
                    preemptions += 1
                    if victim is s:
                        break
                    got = pool.allocate(1)
                if got is None:  # s preempted itself
                    continue
                s.blocks.extend(got)
            s.length += 1
            if s.length >= s.final:
                free_seq(s)
                running.pop(i)
                completed += 1
                continue
            i += 1
        # Admit, first come first served, while memory and max_num_seqs allow.
        head_blocked_need = 0
        while waiting and len(running) < max_num_seqs:
            rid = waiting[0]
            too_long = (own_blocks_needed(int(final[rid])) + prefix_full_blocks > num_blocks
                        if paged else reservation(rid) > pool_tokens)
            if too_long:
                waiting.popleft()
                rejected += 1
                continue
            seq = try_admit(rid)
            if seq is None:
                head_blocked_need = 0 if paged else reservation(rid)
                break
            waiting.popleft()
            running.append(seq)
            admissions += 1
            wait_total += step - int(work.arrival_step[rid])
        # Where the memory is, this iteration.
        tokens = reserved = internal = 0
        for s in running:
            alloc = (len(s.blocks) * block_size) if paged else s.reserved
            own_len = s.length - (prefix_full_blocks * block_size if paged else 0)
            tokens += own_len
            reserved += min(alloc, s.final - (s.length - own_len)) - own_len
            internal += max(0, alloc - (s.final - (s.length - own_len)))
        if paged and prefix_full_blocks and running:
            tokens += prefix_full_blocks * block_size
        free = (pool.num_free * block_size) if pool is not None else (
            arena.num_free if arena is not None else 0)
        external = free if (head_blocked_need and free >= head_blocked_need) else 0
        free -= external
        used = tokens + reserved + internal + external + free
        assert used == capacity, (used, capacity)
        parts = dict(zip(kinds, (tokens, reserved, internal, external, free), strict=True))
        for key, v in parts.items():
            sums[key] += v / capacity
        if waiting:
            load_steps += 1
            for key, v in parts.items():
                load_sums[key] += v / capacity
        conc_sum += len(running)
        conc_max = max(conc_max, len(running))
        if len(series["token"]) < 100_000:
            for key, v in parts.items():
                series[key].append(v / capacity)
            series["concurrency"].append(float(len(running)))
        step += 1
        if on_progress is not None and step % 1000 == 0:
            on_progress(completed + rejected)

    steps = max(step, 1)
    stride = max(1, len(series["token"]) // series_points)
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
        series={k: v[::stride] for k, v in series.items()},
    )
