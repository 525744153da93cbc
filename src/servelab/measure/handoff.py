"""Read how a server hands one batch over to the next from its trace: the instance's
turnaround and the completion race.

`replay-trace` showed two mechanisms of Triton's hand-off that the per-size batch times
of the server's statistics leave out (measure/replay.py; docs/load-and-validate.md, "The
batch race"):

- **the turnaround**: after a batch's COMPUTE_END the instance still answers and
  releases its requests, then takes and stages the next payload, before the next
  COMPUTE_START. It holds the instance, so a queue builds behind it, but no statistic
  counts it. It is read as the gap from a batch's end to the next batch's start, over
  the batches after which the next payload was already waiting (its oldest request's
  delay expired by then), so an idle instance's wait is not counted. A gap more than
  STALL_MIN_MS over its size's median is a stall of the whole server, not a turnaround
  (validate simulates the stalls apart), and is left out;
- **the completion race** (the scenario's `batcher_first`): at a completion the woken
  batcher thread may look before the freed instance takes the waiting payload, and grow
  it with what has queued since. The share is `race_share`'s, from the trace's own
  events.

Both are read from the warm-up's trace at each rate, so they are the server's at that
load, and neither is fitted to a figure the prediction is then judged on. Against the
integration test's Triton (2026-12-06, `bench/triton_frontend_bunching.py`) the Triton
rule on the client's send times gave the mean batch 2.9-3.6% short with each size's
compute alone, 2.1-2.6% short with the turnaround, and within 0.1-1.2% with the race too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from servelab.measure.replay import race_share, trace_batches
from servelab.measure.stall_fit import STALL_MIN_MS
from servelab.trace_file import TraceRequests

MIN_SIZE_GAPS = 5  # turnarounds after batches of one size before its mean is read
MIN_RACES = 20  # completion races judged before the share is read


@dataclass(frozen=True, slots=True)
class HandOff:
    """The hand-off between batches read from a trace. `turnaround_ms[k]` for every
    batch size 1..max_batch_size (index 0 unused): the size's mean where at least
    MIN_SIZE_GAPS were seen, elsewhere the count-weighted line through those (never
    below 0); all 0 where none was seen. `race`: the share of completion races the
    batcher thread won, None where fewer than MIN_RACES were judged (or not asked for)."""

    turnaround_ms: tuple[float, ...]
    gaps: int  # turnarounds read (batches after which the next payload was waiting)
    sizes_read: tuple[int, ...]  # the sizes whose own mean was taken
    race: float | None
    races_judged: int

    def at(self, k: int) -> float:
        """The turnaround (ms) after a batch of k requests (k clipped to 1..max)."""
        return self.turnaround_ms[min(max(k, 1), len(self.turnaround_ms) - 1)]

    def to_dict(self) -> dict[str, Any]:
        return {"turnaround_ms": {str(k): round(self.turnaround_ms[k], 6)
                                  for k in self.sizes_read},
                "turnaround_gaps": self.gaps, "batcher_first": self.race,
                "races_judged": self.races_judged}


def read_handoff(tr: TraceRequests, max_batch_size: int, delay_ns: int, instances: int = 1,
                 race: bool = True) -> HandOff | None:
    """The hand-off in a trace window of one model (see the module's docstring); None
    when the trace has no batch or a batch over `max_batch_size`. With more than one
    instance the trace does not say which batch followed which on an instance, so no
    turnaround is read (all 0). `race`: read the completion race too."""
    if tr.queue_ns.size == 0:
        return None
    tb = trace_batches(tr)
    if int(tb.size.max()) > max_batch_size:
        return None
    turn = np.zeros(max_batch_size + 1)
    gaps = 0
    sizes_read: tuple[int, ...] = ()
    if instances == 1 and tb.size.size > 1:
        waiting = tb.waiting_at_end(delay_ns)
        gap = np.maximum(tb.start_ns[1:] - tb.end_ns[:-1], 0)[waiting].astype(np.float64)
        size = tb.size[:-1][waiting]
        median = np.zeros(max_batch_size + 1)
        for k in np.unique(size):
            median[k] = np.median(gap[size == k])
        turnaround = gap <= median[size] + STALL_MIN_MS * 1e6  # (the rest: stalls)
        gap, size = gap[turnaround], size[turnaround]
        gaps = int(gap.size)
        count = np.bincount(size, minlength=max_batch_size + 1).astype(np.float64)
        total = np.bincount(size, weights=gap, minlength=max_batch_size + 1)
        seen = np.flatnonzero(count >= MIN_SIZE_GAPS)
        if seen.size:
            mean_ms = total[seen] / count[seen] / 1e6
            ks = np.arange(max_batch_size + 1, dtype=np.float64)
            if seen.size == 1:
                turn[:] = mean_ms[0]
            else:
                slope, icpt = np.polyfit(seen.astype(np.float64), mean_ms, 1,
                                         w=np.sqrt(count[seen]))
                turn = np.maximum(icpt + slope * ks, 0.0)
            turn[seen] = mean_ms
            sizes_read = tuple(int(k) for k in seen)
    share, judged = (race_share(tr, max_batch_size, delay_ns, instances, tb) if race
                     else (0.0, 0))
    return HandOff(tuple(float(x) for x in turn), gaps, sizes_read,
                   round(float(share), 3) if race and judged >= MIN_RACES else None,
                   int(judged))


def handoff_note(h: HandOff | None, at: str) -> list[str]:
    """What the warm-up's trace showed of the hand-off, and what was simulated."""
    if h is None:
        return []
    parts = []
    if h.sizes_read:
        shown = ", ".join(f"{h.at(k):.3f} ms after {k}" for k in h.sizes_read[:4])
        parts.append(f"a turnaround of {shown}"
                     + (" ..." if len(h.sizes_read) > 4 else "")
                     + f" ({h.gaps} batches read)")
    if h.race is not None:
        parts.append(f"the batcher thread winning {h.race:.0%} of {h.races_judged} "
                     "completion races")
    if not parts:
        return []
    return [f"{at} the warm-up's trace showed " + " and ".join(parts) + "; the prediction "
            "simulates them (without_handoff holds the prediction without them)"]
