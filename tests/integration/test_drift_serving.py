"""Drift end to end: the example repo, a reference built point-in-time, the gateway
serving first the same population and then a stream whose avg_amount_7d has shifted in
the online store; the gateway's drift endpoint and /metrics, and `servelab drift` over
its served log, alert on that feature and on no other."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from servelab.features.definitions import load_repo
from servelab.features.offline import get_historical_features
from servelab.features.online import OnlineRow, open_store
from tests.integration.test_gateway_features import FEATURES, SERVICE, gateway, make_repo

WINDOW = 1000


def send(url: str, pairs: list[tuple[int, int]], rows_per_request: int = 25) -> None:
    for i in range(0, len(pairs), rows_per_request):
        part = pairs[i:i + rows_per_request]
        body = {"inputs": [
            {"name": "user_id", "datatype": "INT64", "shape": [len(part), 1],
             "data": [u for u, _ in part]},
            {"name": "merchant_id", "datatype": "INT64", "shape": [len(part), 1],
             "data": [m for _, m in part]}]}
        r = httpx.post(url + "/v2/models/fraud/infer", json=body, timeout=30)
        assert r.status_code == 200, r.text


def drift_state(url: str, served_at_least: int) -> dict:  # type: ignore[type-arg]
    """The gateway's drift report once it covers `served_at_least` rows."""
    deadline = time.monotonic() + 20
    while True:
        d = httpx.get(url + "/v2/models/fraud/drift", timeout=10).json()
        if d["served_rows"] >= served_at_least and d.get("computed_at") and \
                d["computed_at"] > d.get("_seen", 0) and "report" in d:
            time.sleep(0.8)  # one more computation after the last rows arrived
            return httpx.get(url + "/v2/models/fraud/drift", timeout=10).json()
        assert time.monotonic() < deadline, d
        time.sleep(0.2)


def test_a_shifted_feature_alerts_in_the_gateway_and_over_its_log(tmp_path):
    root = make_repo(tmp_path / "repo")
    repo = load_repo(root)
    labels = pq.read_table(root / "data" / "labels.parquet")
    pairs = list(zip(labels.column("user_id").to_pylist(),
                     labels.column("merchant_id").to_pylist(), strict=True))
    # The reference: the same entity population, point-in-time as of now (what a
    # training set built today for these rows holds).
    now = np.datetime64(int(time.time() * 1e6), "us")
    entity_rows = pa.table({"user_id": [u for u, _ in pairs],
                            "merchant_id": [m for _, m in pairs],
                            "event_timestamp": pa.array([now] * len(pairs), pa.timestamp("us"))})
    ref = get_historical_features(repo, entity_rows, [f"service:{SERVICE}"])
    pq.write_table(ref, tmp_path / "reference.parquet")
    rng = np.random.default_rng(0)
    stream = [pairs[i] for i in rng.integers(0, len(pairs), 3 * WINDOW)]
    log = tmp_path / "log"
    with gateway(root, "--drift-reference", str(tmp_path / "reference.parquet"),
                 "--drift-window", str(WINDOW), "--drift-interval", "0.3",
                 "--log-dir", str(log)) as (_, url):
        send(url, stream[:WINDOW])
        before = drift_state(url, WINDOW)
        assert before["window_rows"] == WINDOW
        assert before["alerts"] == [], before["alerts"]
        # Upstream, avg_amount_7d triples: new online rows, newer than the materialized ones.
        store = open_store(repo)
        view = repo.views["user_stats"]
        users = sorted({u for u, _ in pairs})
        stamp = int(time.time() * 1e6)
        current = store.read(view, [(u,) for u in users], list(view.feature_names), stamp)
        rows = []
        for u, v in zip(users, current, strict=True):
            values = dict(v.values)
            values["avg_amount_7d"] = values["avg_amount_7d"] * 3 + 50
            rows.append(OnlineRow((u,), stamp, stamp, values))
        store.write(view, rows)
        store.close()
        send(url, stream[WINDOW:])
        after = drift_state(url, 3 * WINDOW)
        assert [a["feature"] for a in after["alerts"]] == ["avg_amount_7d"], after["alerts"]
        assert after["alerts"][0]["status"] == "alert"
        metrics = httpx.get(url + "/metrics", timeout=10).text
        status = {m.group(1): float(m.group(2)) for m in re.finditer(
            r'servelab_feature_drift_status\{[^}]*feature="(\w+)"[^}]*\} ([0-9.]+)', metrics)}
        assert status == {"avg_amount_7d": 2.0, **{f: 0.0 for f in FEATURES
                                                   if f != "avg_amount_7d"}}
        assert "servelab_feature_psi{" in metrics
        no_drift = httpx.get(url + "/v2/models/nope/drift", timeout=10)
        assert no_drift.status_code == 404
    out = subprocess.run([sys.executable, "-m", "servelab", "drift", "--reference",
                          str(tmp_path / "reference.parquet"), "--current", str(log),
                          "--features", ",".join(FEATURES), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    got = {f["feature"]: f["status"] for f in report["features"]}
    assert got == {"avg_amount_7d": "alert", **{f: "ok" for f in FEATURES
                                                if f != "avg_amount_7d"}}, report
    assert sum(f["n_current"] for f in report["features"]) == 4 * 3 * WINDOW
    assert Path(log).exists()
