"""The feature store's Python API (the same functions `servelab features` calls).

    >>> from servelab import features as fs
    >>> repo = fs.load_repo("fraud")
    >>> train = fs.get_historical_features(repo, "fraud/data/labels.parquet",
    ...                                    ["service:fraud_model_v1"])
    >>> store = fs.open_store(repo)
    >>> fs.materialize(repo, store, incremental=True)
"""

from servelab.features.definitions import load_repo
from servelab.features.materialize import materialize, parity
from servelab.features.offline import get_historical_features
from servelab.features.online import get_online_features, open_store

__all__ = ["get_historical_features", "get_online_features", "load_repo", "materialize",
           "open_store", "parity"]
