"""The fewest of something (GPUs, replicas) that meets a test which, once met, stays met."""

from __future__ import annotations

from collections.abc import Callable


def fewest_meeting(meets: Callable[[int], bool], start: int, cap: int) -> int | None:
    """The least n in [start, cap] with meets(n): doubling from `start` until one meets,
    then bisection between the last that failed and it. None if even `cap` fails.
    `meets` is called at most once per n that matters; callers cache its answers."""
    lo, hi = start - 1, start  # lo fails (or is below start), hi is the candidate
    while not meets(hi):
        if hi >= cap:
            return None
        lo, hi = hi, min(cap, hi * 2)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid
    return hi
