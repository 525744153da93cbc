"""The lab's "Features and drift" section: the example fraud repo, built once in a
temporary folder on first use (a few seconds), its point-in-time training set as the
reference, and the feature store's parity check. A page moves sliders that reshape a
sample drawn from the reference (mean shift, spread, missing share, share of a new
category) and gets back the PSI per bin, the chance level and the status: the same
`servelab.drift` code as `servelab drift` and the gateway.

No path ever comes from the page: the repo lives where this module puts it.
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from servelab import drift
from servelab.errors import invalid

SERVICE = "fraud_model_v1"
# The service's numeric features and two categorical ones from the same views.
FEATURES = ["user_stats:txn_count_7d", "user_stats:avg_amount_7d",
            "user_stats:failed_logins_1d", "merchant_risk:risk_score",
            "user_stats:country", "merchant_risk:category"]
MAX_ROWS = 100_000
FEATURE_NAMES = [ref.split(":")[1] for ref in FEATURES]


class DriftIn(BaseModel):
    feature: str = Field(max_length=100)
    mean_shift: float = Field(0.0, ge=-5, le=5)  # in the reference's standard deviations
    spread: float = Field(1.0, ge=0.1, le=10)  # scale around the reference's median
    missing: float = Field(0.0, ge=0, le=0.9)  # share of the current sample made missing
    new_category: float = Field(0.0, ge=0, le=0.9)  # share given a category never seen
    rows: int = Field(2000, ge=20, le=MAX_ROWS)
    seed: int = Field(0, ge=0, le=2**31)


def check_feature(name: str | None, field: str = "[lab.drift] feature") -> None:
    """A feature the section can show (None: not given)."""
    if name is not None and name not in FEATURE_NAMES:
        raise invalid(field, name, f"one of {', '.join(FEATURE_NAMES)}",
                      "pick a feature of the example repo")


class DriftLab:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self.reference: dict[str, np.ndarray] = {}
        self.parity: dict[str, Any] = {}

    def ready(self) -> None:
        """Build the example repo, its training set and the parity check, once."""
        with self._lock:
            if self.reference:
                return
            from servelab.features.definitions import load_repo
            from servelab.features.example import generate
            from servelab.features.materialization import materialize, parity
            from servelab.features.offline import get_historical_features
            from servelab.features.online import open_store

            self._dir = tempfile.TemporaryDirectory(prefix="servelab-lab-features-")
            root = Path(self._dir.name)
            today = np.datetime64("today", "D").astype("datetime64[us]")
            generate(root, users=400, merchants=60, days=10, labels=4000,
                     start=today - np.timedelta64(10, "D"))
            repo = load_repo(root)
            store = open_store(repo)
            try:
                store.apply(list(repo.views.values()))
                materialize(repo, store)
                report = parity(repo, store, sample=100)
            finally:
                store.close()
            table = get_historical_features(repo, root / "data" / "labels.parquet", FEATURES)
            for ref in FEATURES:
                name = ref.split(":")[1]
                self.reference[name] = drift.column_values(table, name)
            self.parity = {**report.to_dict(), "views": len(repo.views),
                           "training_rows": table.num_rows}

    def meta(self) -> dict[str, Any]:
        self.ready()
        return {"features": [{"name": n, "kind": "categorical" if drift.is_categorical(v)
                              else "numeric"} for n, v in self.reference.items()],
                "parity": self.parity}

    def compute(self, q: DriftIn) -> dict[str, Any]:
        self.ready()
        check_feature(q.feature, "feature")
        ref = self.reference[q.feature]
        rng = np.random.default_rng(q.seed)
        cur = ref[rng.integers(0, ref.size, q.rows)].copy()
        if drift.is_categorical(ref):
            cur[rng.random(q.rows) < q.new_category] = "never-seen"
            cur[rng.random(q.rows) < q.missing] = None
        else:
            finite = ref[np.isfinite(ref)]
            median = float(np.median(finite)) if finite.size else 0.0
            sd = float(finite.std()) if finite.size else 0.0
            cur = median + (cur - median) * q.spread + q.mean_shift * sd
            cur[rng.random(q.rows) < q.missing] = np.nan
        f = drift.feature_drift(q.feature, ref, cur)
        out = drift.DriftReport([f], drift.DEFAULT_BINS, drift.DEFAULT_EPSILON, drift.WARN,
                                drift.ALERT).to_dict()
        return {**out["features"][0], "epsilon": out["epsilon"], "warn": out["warn"],
                "alert": out["alert"], "parity": self.parity}

    def close(self) -> None:
        if self._dir is not None:
            self._dir.cleanup()
