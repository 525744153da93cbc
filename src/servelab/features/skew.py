"""Training/serving skew: for each row the gateway served, the point-in-time value the
offline store gives at that request's time, beside the value that was served.

A store that was materialized correctly gives 0 mismatches; one that was not
re-materialized after new source data arrived serves stale values, and the check
names the features and shows examples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.errors import InputError
from servelab.features.definitions import Repo

MAX_EXAMPLES = 5


@dataclass(frozen=True, slots=True)
class SkewReport:
    service: str
    rows: int
    mismatches: dict[str, int]
    examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(self.mismatches.values())

    def to_dict(self) -> dict[str, Any]:
        return {"service": self.service, "rows": self.rows, "ok": self.ok,
                "mismatches": self.mismatches,
                "mismatch_share": {f: (n / self.rows if self.rows else 0.0)
                                   for f, n in self.mismatches.items()},
                "examples": self.examples}


def _same(a: Any, b: Any) -> bool:
    """Served and offline agree: both absent (None/NaN), or equal numbers."""
    def absent(v: Any) -> bool:
        return v is None or (isinstance(v, float) and math.isnan(v))

    if absent(a) or absent(b):
        return absent(a) and absent(b)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))
    return bool(a == b)


def read_log(log_dir: str | Path) -> Any:
    from servelab.gateway.log import read_served

    return read_served(log_dir)


def skew(repo: Repo, log_dir: str | Path, service: str | None = None,
         engine: str | None = None) -> SkewReport:
    """Served values against offline point-in-time values at each request's time."""
    import pyarrow as pa

    from servelab.features.offline import get_historical_features

    log = read_log(log_dir)
    cols = set(log.column_names)
    if service is None:
        fits = [s for s, fs in repo.services.items()
                if {f for _, f in repo.resolve([f"service:{s}"])} <= cols]
        if len(fits) != 1:
            raise InputError(f"--service: the log matches {fits or 'no'} feature services; "
                             "fix: name one with --service")
        service = fits[0]
    pairs = repo.resolve([f"service:{service}"])
    feats = [f for _, f in pairs]
    keys = sorted({k for v, _ in pairs for k in v.join_keys})
    need = [*keys, *feats, "request_time"]
    missing = [c for c in need if c not in cols]
    if missing:
        raise InputError(f"--log: columns {missing} missing for service {service!r}; fix: "
                         "check the log belongs to a model serving that service")
    rows = pa.table({**{k: log.column(k) for k in keys},
                     "event_timestamp": log.column("request_time"),
                     "_row": pa.array(range(log.num_rows), pa.int64())})
    offline = get_historical_features(repo, rows, [f"service:{service}"], engine=engine)
    offline = offline.sort_by("_row")
    served = log.select(feats).to_pylist()
    truth = offline.select(feats).to_pylist()
    mismatches = dict.fromkeys(feats, 0)
    examples: list[dict[str, Any]] = []
    key_rows = log.select([*keys, "request_time"]).to_pylist()
    for s_row, o_row, k_row in zip(served, truth, key_rows, strict=True):
        for f in feats:
            if not _same(s_row[f], o_row[f]):
                mismatches[f] += 1
                if len(examples) < MAX_EXAMPLES:
                    examples.append({**{k: k_row[k] for k in keys},
                                     "request_time": str(k_row["request_time"]),
                                     "feature": f, "served": s_row[f], "offline": o_row[f]})
    return SkewReport(service, log.num_rows, mismatches, examples)
