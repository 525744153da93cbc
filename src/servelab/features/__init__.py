"""The feature store's Python API (the same functions `servelab features` calls).

    >>> from servelab import features as fs
    >>> repo = fs.load_repo("fraud")
    >>> train = fs.get_historical_features(repo, "fraud/data/labels.parquet",
    ...                                    ["service:fraud_model_v1"])
    >>> store = fs.open_store(repo)
    >>> fs.materialize(repo, store, incremental=True)

Imported lazily, so that `servelab plan` does not pay for DuckDB and Redis.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "load_repo": "servelab.features.definitions",
    "materialize": "servelab.features.materialization",
    "parity": "servelab.features.materialization",
    "get_historical_features": "servelab.features.offline",
    "get_online_features": "servelab.features.online",
    "open_store": "servelab.features.online",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value  # found directly from now on, the same object every time
        return value
    raise AttributeError(f"module 'servelab.features' has no attribute {name!r}")
