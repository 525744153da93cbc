"""Online features joined into a batch: requests carry entity keys, the gateway reads a
feature service's values from the online store (one round trip per view per batch) and
builds the model's input in the service's order.

A value that is missing or expired follows a stated policy: ``default`` (the feature's
default, 0, is used and counted) or ``reject`` (that request answers 400 naming the
feature and the key). Never a silent NaN.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from servelab.errors import InputError, StoreError
from servelab.features.definitions import FeatureView, Repo
from servelab.features.online import PRESENT, OnlineStore, open_store
from servelab.gateway.runner import TensorSpec


class MissingPolicy(Enum):
    DEFAULT = "default"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class JoinResult:
    """One batch's model input, and for each request its served values or its error."""

    features: np.ndarray  # (rows of the requests kept, n_features), float32
    kept: list[int]  # which requests have rows in `features`
    errors: dict[int, InputError]
    values: list[list[dict[str, Any]]]  # per request kept, per row: feature -> value served
    fetch_s: float
    missing: dict[tuple[str, str], int]  # (feature, status) -> count


class FeatureJoin:
    """A feature service of a repo, read from its online store for batches of entity keys."""

    def __init__(self, repo: Repo, service: str, store: str | None = None,
                 missing: MissingPolicy = MissingPolicy.DEFAULT,
                 clock_us: Callable[[], int] | None = None) -> None:
        if service not in repo.services:
            raise InputError(f"--feature-service = {service!r}: not in the repo; expected one "
                             f"of {', '.join(sorted(repo.services)) or '(none)'}")
        self.repo = repo
        self.service = service
        self.pairs = repo.resolve([f"service:{service}"])
        self.store_kind = store
        self.missing = missing
        self.clock_us = clock_us or (lambda: time.time_ns() // 1000)
        keys: list[str] = []
        for view, _ in self.pairs:
            for k in view.join_keys:
                if k not in keys:
                    keys.append(k)
        self.join_keys = tuple(keys)
        self.feature_names = tuple(f for _, f in self.pairs)
        for view, f in self.pairs:
            dtype = dict(view.features)[f]
            if not (dtype.startswith("int") or dtype.startswith("float") or dtype == "bool"):
                raise InputError(f"feature service {service!r}: {view.name}:{f} is {dtype}; "
                                 "fix: serve numeric features (encode strings in the repo)")
            if any(not dict(view.key_dtypes)[k].startswith("int") for k in view.join_keys):
                raise InputError(f"feature service {service!r}: view {view.name!r} has a "
                                 "non-integer join key; fix: use int64 join keys for serving")
        self._local = threading.local()
        self._stores: list[OnlineStore] = []
        self._lock = threading.Lock()

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        """What a request carries: one INT64 column per join key."""
        return tuple(TensorSpec(k, "INT64", (-1, 1)) for k in self.join_keys)

    def store(self) -> OnlineStore:
        """This thread's connection (SQLite connections stay on the thread that made them)."""
        s: OnlineStore | None = getattr(self._local, "store", None)
        if s is None:
            s = open_store(self.repo, self.store_kind)
            self._local.store = s
            with self._lock:
                self._stores.append(s)
        return s

    def close(self) -> None:
        with self._lock:
            for s in self._stores:
                s.close()
            self._stores.clear()

    def join(self, requests: list[dict[str, np.ndarray]]) -> JoinResult:
        """Read the batch's features: one read per view for every key in the batch."""
        t0 = time.perf_counter()
        rows: list[tuple[int, tuple[int, ...]]] = []  # (request, key tuple) per row
        for i, r in enumerate(requests):
            cols = [np.asarray(r[k]).reshape(-1) for k in self.join_keys]
            for j in range(cols[0].size):
                rows.append((i, tuple(int(c[j]) for c in cols)))
        now = self.clock_us()
        by_view: dict[str, tuple[FeatureView, list[str]]] = {}
        for view, f in self.pairs:
            by_view.setdefault(view.name, (view, []))[1].append(f)
        reads = []
        for view, feats in by_view.values():
            idx = [self.join_keys.index(k) for k in view.join_keys]
            reads.append((view, [tuple(key[x] for x in idx) for _, key in rows], feats))
        store = self.store()
        try:  # every view of the batch in one read (one round trip on Redis)
            got = dict(zip(by_view, store.read_columns_many(reads, now), strict=True))
        except StoreError:
            raise
        except Exception as exc:  # a backend error is the store's, not the request's
            raise StoreError(f"online store ({self.store_kind or self.repo.config.online}) "
                             f"read failed: {exc}") from exc
        fetch_s = time.perf_counter() - t0
        n = len(rows)
        x = np.zeros((n, len(self.pairs)), np.float32)
        errors: dict[int, InputError] = {}
        missing: dict[tuple[str, str], int] = {}
        served: list[dict[str, Any]] = [{} for _ in rows]  # per row
        for col, (view, f) in enumerate(self.pairs):
            view_cols, statuses = got[view.name]
            vals = view_cols[by_view[view.name][1].index(f)]
            for row, (req, key) in enumerate(rows):
                v, status = vals[row], statuses[row]
                if status == PRESENT and v is not None:
                    x[row, col] = float(v)
                    served[row][f] = v
                    continue
                status = status if status != PRESENT else "missing"
                missing[(f, status)] = missing.get((f, status), 0) + 1
                served[row][f] = None
                if self.missing is MissingPolicy.REJECT and req not in errors:
                    shown = ", ".join(f"{k}={key[self.join_keys.index(k)]}"
                                      for k in view.join_keys)
                    errors[req] = InputError(f"feature {view.name}:{f} for {shown} is {status} "
                                             "in the online store; fix: materialize the view, "
                                             "or serve with --missing default")
        keep_rows = [row for row, (req, _) in enumerate(rows) if req not in errors]
        kept = [i for i in range(len(requests)) if i not in errors]
        per_request: list[list[dict[str, Any]]] = [[] for _ in requests]
        for row, (req, _) in enumerate(rows):
            per_request[req].append(served[row])
        return JoinResult(x[keep_rows], kept, errors, [per_request[i] for i in kept], fetch_s,
                          missing)
