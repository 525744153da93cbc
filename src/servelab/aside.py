"""Two threads for work beside a run: arrivals drawn ahead of the engine, a Report's
percentiles on the second core. Compiled code and NumPy release the GIL, so on a
machine with two or more cores such work runs beside the calling thread's.

Started once: starting a thread costs a noticeable share of a short run (the figure is
in docs/performance.md). Two, for runs on two threads at once (the lab's). Daemon threads,
so a command's quick exit (``cli._leave`` joins every other thread) does not wait on
them; a job only runs while its caller waits for it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

_JOBS: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
_THREADS: list[threading.Thread] = []
_STARTING = threading.Lock()


def aside(job: Callable[[], Any]) -> Future[Any]:
    """Run `job` on one of the two threads; its Future holds the result or the error."""
    with _STARTING:
        if not _THREADS or not _THREADS[0].is_alive():  # none yet, or a forked child's
            _THREADS[:] = [threading.Thread(target=_work, name=f"servelab-aside-{i}",
                                            daemon=True) for i in range(2)]
            for t in _THREADS:
                t.start()
    done: Future[Any] = Future()
    _JOBS.put((job, done))
    return done


def _work() -> None:
    while True:
        job, done = _JOBS.get()
        try:
            result = job()
        except BaseException as exc:  # handed to the caller
            done.set_exception(exc)
        else:
            done.set_result(result)
