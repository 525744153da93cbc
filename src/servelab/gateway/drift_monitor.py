"""PSI on what the gateway serves: a sliding window of the last N served feature rows,
held against a reference (the training set), computed on a timer off the request path.

The request path only copies each batch's feature rows into a ring buffer under a
lock (microseconds). A thread wakes every `interval_s`, counts the window into the
reference's bins (`servelab.drift`, the same code as `servelab drift`), and publishes
per feature: the PSI, its chance level's 99th percentile, and the status (0 ok, 1 warn,
2 alert) as Prometheus gauges, plus the whole report at GET /v2/models/{m}/drift.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from servelab import drift
from servelab.errors import InputError, cut

MAX_WINDOW_ROWS = 10_000_000
MIN_INTERVAL_S = 0.1


class DriftMonitor:
    def __init__(self, model: str, names: tuple[str, ...], reference: Any, *,
                 window: int = 10_000, interval_s: float = 10.0,
                 bins: int = drift.DEFAULT_BINS, epsilon: float = drift.DEFAULT_EPSILON,
                 warn: float = drift.WARN, alert: float = drift.ALERT) -> None:
        drift.check_settings(bins, epsilon, warn, alert)
        if not 10 <= window <= MAX_WINDOW_ROWS:
            raise InputError(f"--drift-window = {window}: expected 10 to {MAX_WINDOW_ROWS:,} "
                             "served rows; fix: e.g. --drift-window 10000")
        if not MIN_INTERVAL_S <= interval_s <= 86_400:
            raise InputError(f"--drift-interval = {interval_s}: expected {MIN_INTERVAL_S} to "
                             "86,400 seconds; fix: e.g. --drift-interval 10")
        lacking = [n for n in names if n not in reference.column_names]
        if lacking:
            raise InputError(f"--drift-reference: no column(s) {lacking} for the served "
                             f"features (it has {cut(', '.join(reference.column_names), 200)});"
                             " fix: a training set built for this feature service")
        self.model = model
        self.names = names
        self.settings = (bins, epsilon, warn, alert)
        self.binnings = []
        self.ref_counts = []
        for n in names:
            values = drift.column_values(reference, n)
            if drift.is_categorical(values):
                raise InputError(f"--drift-reference: column {n!r} is not numeric, but the "
                                 "gateway serves it as a number; fix: the training set of "
                                 "this feature service")
            # The gateway serves features as float32: round the reference the same way, or
            # a value sitting exactly on a bin edge would change bins by rounding alone.
            values = values.astype(np.float32).astype(np.float64)
            b = drift.fit_binning(values, bins)
            self.binnings.append(b)
            self.ref_counts.append(drift.count(values, b)[0])
        self.ring = np.full((window, len(names)), np.nan)
        self.filled = 0
        self.pos = 0
        self.served = 0
        self.lock = threading.Lock()
        self.latest: drift.DriftReport | None = None
        self.computed_at = 0.0
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_report: list[Any] = []

    def add(self, rows: np.ndarray) -> None:
        """Feature rows as served (n x features), in the service's order."""
        n = rows.shape[0]
        if n == 0:
            return
        w = self.ring.shape[0]
        with self.lock:
            self.served += n
            if n >= w:
                self.ring[:] = rows[-w:]
                self.pos, self.filled = 0, w
                return
            end = self.pos + n
            if end <= w:
                self.ring[self.pos:end] = rows
            else:
                k = w - self.pos
                self.ring[self.pos:] = rows[:k]
                self.ring[: n - k] = rows[k:]
            self.pos = end % w
            self.filled = min(w, self.filled + n)

    def compute(self) -> drift.DriftReport:
        with self.lock:
            window = self.ring[: self.filled].copy()  # row order does not matter to PSI
        bins, epsilon, warn, alert = self.settings
        features = []
        for j, name in enumerate(self.names):
            b = self.binnings[j]
            cur, _ = drift.count(window[:, j], b)
            features.append(drift.result_from_counts(name, b, self.ref_counts[j], cur, 0,
                                                     epsilon, warn, alert))
        report = drift.DriftReport(features, bins, epsilon, warn, alert,
                                   window=f"last {window.shape[0]:,} served rows")
        self.latest = report
        self.computed_at = time.time()
        for callback in self.on_report:
            callback(report)
        return report

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "served_rows": self.served,
                               "window_rows": self.filled, "interval_s": self.interval_s,
                               "computed_at": self.computed_at or None}
        if self.latest is not None:
            out["report"] = self.latest.to_dict()
            out["alerts"] = [{"feature": f.feature, "status": f.status, "psi": f.psi}
                             for f in self.latest.features if f.status != "ok"]
        return out

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                if self.filled:
                    self.compute()

        self._thread = threading.Thread(target=loop, name=f"servelab-drift-{self.model}",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
