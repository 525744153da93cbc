"""Stalls: the whole server pausing now and then, and the time warp that simulates it.

A server process stops from time to time as a whole: a garbage collection, the
operating system giving its core to another process, a page fault in a cold part of
memory. While it is stopped its front end reads nothing, its batcher closes no batch
and the batch in progress does not advance. On servelab's gateway at 80% of its
saturation on the 2-core VM that is what the latency tail is made of: replaying the
gateway's own trace with its measured batch times in their order gave the queue's p99
within 6%, with the same times resampled 16-22% short (docs/load-and-validate.md). A
stall both slows the batches it falls in and bunches the arrivals that came during it,
so it cannot be a spread of batch times alone.

The simulator takes stalls as a time warp. The server has its own clock, which stops
during a stall. Stall k starts at server time ``sigma[k]`` and lasts ``length[k]`` ns
of real time; the gaps between stall starts on the server's clock are exponential
(``stalls_per_s`` of the server's running time) and the lengths are drawn from the
measured ones. Everything the server does (front end, batcher, answers) is simulated
on the server's clock, unchanged; arrivals go in through `to_server` (one that comes
during a stall is seen when it ends) and every instant the server made comes back out
through `to_real` (an instant at a stall's start is after that stall). A batch a stall
falls in reads longer by the stall, as a real server's statistics count it.
"""

from __future__ import annotations

import numpy as np

from servelab.errors import InputError

# Stalls one run may hold: the run is refused above this rather than allocating them.
MAX_STALLS = 1_000_000
# Stalls are drawn in chunks of 4,096, then as many as are drawn already (doubling): a
# fixed schedule, so a seed gives the same stalls however far a run reaches.
_FIRST_CHUNK = 4_096


def check_count(per_s: float, span_ns: float, field: str) -> None:
    """Refuse a run whose stalls would pass MAX_STALLS (rate x the run's span)."""
    count = per_s * span_ns / 1e9
    if count > MAX_STALLS:
        raise InputError(
            f"{field} = {per_s:g}: over a run of {span_ns / 1e9:.3g} s that is about "
            f"{count:,.0f} stalls; expected at most {MAX_STALLS:,}; fix: a lower rate of "
            "stalls, or fewer requests")


class Stalls:
    """A run's stalls (server-clock starts and real lengths, int64 ns), drawn as far as
    asked: `cover` extends them past a server instant."""

    def __init__(self, per_s: float, lengths_ms: tuple[float, ...],
                 rng: np.random.Generator) -> None:
        if not per_s > 0 or not lengths_ms:
            raise ValueError("stalls need a rate above 0 and at least one length")
        self.per_s = per_s
        self._lengths_ns = np.rint(np.asarray(lengths_ms, np.float64) * 1e6).astype(np.int64)
        self._rng = rng
        self.sigma = np.zeros(0, np.int64)  # starts on the server's clock
        self.length = np.zeros(0, np.int64)  # real ns
        self._after = np.zeros(0, np.int64)  # real ns of stall up to and including each
        self._last = 0.0  # the last start drawn, server seconds

    def cover(self, server_ns: int) -> None:
        """Draw stalls until one starts after `server_ns` on the server's clock."""
        while self.sigma.size == 0 or self.sigma[-1] <= server_ns:
            if self.sigma.size >= MAX_STALLS:
                raise InputError(f"the run needs more than {MAX_STALLS:,} stalls; fix: a "
                                 "lower rate of stalls, or fewer requests")
            chunk = min(max(_FIRST_CHUNK, self.sigma.size), MAX_STALLS)
            starts = self._last + np.cumsum(self._rng.standard_exponential(chunk) / self.per_s)
            self._last = float(starts[-1])
            lengths = self._lengths_ns[self._rng.integers(0, self._lengths_ns.size, chunk)]
            total = int(self._after[-1]) if self._after.size else 0
            self.sigma = np.concatenate([self.sigma, np.rint(starts * 1e9).astype(np.int64)])
            self.length = np.concatenate([self.length, lengths])
            self._after = np.concatenate([self._after, total + np.cumsum(lengths)])

    def to_server(self, real_ns: np.ndarray) -> np.ndarray:
        """Server-clock instants of real ones (sorted or not): an instant during a stall is
        the stall's start on the server's clock."""
        real_ns = np.asarray(real_ns, np.int64)
        if real_ns.size:
            self.cover(int(real_ns.max()))  # the server's clock is never ahead of the real
        before = self._after - self.length  # stall time before each stall starts
        starts = self.sigma + before  # real starts
        k = np.searchsorted(starts, real_ns, side="right") - 1  # last stall started
        kk = np.maximum(k, 0)
        inside = (k >= 0) & (real_ns < starts[kk] + self.length[kk])
        out = real_ns - np.where(k >= 0, self._after[kk], 0)
        out[inside] = self.sigma[kk[inside]]
        result: np.ndarray = out
        return result

    def to_real(self, server_ns: np.ndarray) -> np.ndarray:
        """Real instants of server-clock ones: each plus every stall that started at or
        before it on the server's clock."""
        server_ns = np.asarray(server_ns, np.int64)
        if server_ns.size:
            self.cover(int(server_ns.max()))
        k = np.searchsorted(self.sigma, server_ns, side="right")
        out: np.ndarray = server_ns + np.where(k > 0, self._after[np.maximum(k - 1, 0)], 0)
        return out

    def share_paused(self, server_ns: int) -> float:
        """The share of real time spent stalled up to a server instant."""
        k = int(np.searchsorted(self.sigma, server_ns, side="right"))
        paused = int(self._after[k - 1]) if k else 0
        return paused / (server_ns + paused) if server_ns + paused > 0 else 0.0
