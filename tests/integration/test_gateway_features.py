"""The gateway with a feature service: requests carry entity keys, features come from
the online store (SQLite, and a real Redis that goes down and comes back), the served
log holds what was served, and the skew check finds a store that was not
re-materialized after new source data arrived."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from servelab.features.definitions import load_repo
from servelab.features.example import generate
from servelab.features.materialization import materialize, to_us
from servelab.features.online import get_online_features, open_store
from servelab.features.skew import skew
from servelab.features.train import train
from tests.browser_support import free_port
from tests.services import server_process

SERVICE = "fraud_model_v1"
FEATURES = ["txn_count_7d", "avg_amount_7d", "failed_logins_1d", "risk_score"]


def make_repo(root: Path, online: str = "sqlite", redis_url: str | None = None) -> Path:
    today = np.datetime64("today", "D").astype("datetime64[us]")
    generate(root, users=40, merchants=8, days=5, labels=3000,
             start=today - np.timedelta64(5, "D"))
    if online == "redis":
        toml = (root / "feature_repo.toml").read_text().replace(
            'online = "sqlite"', f'online = "redis"\nredis_url = "{redis_url}"')
        (root / "feature_repo.toml").write_text(toml)
    repo = load_repo(root)
    s = open_store(repo)
    s.apply(list(repo.views.values()))
    materialize(repo, s)
    s.close()
    train(repo, SERVICE, root / "data" / "labels.parquet", "is_fraud", root / "model.onnx")
    return root


@contextlib.contextmanager
def gateway(root: Path, *args: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with server_process([sys.executable, "-m", "servelab", "serve", "--model",
                         f"fraud={root / 'model.onnx'}", "--feature-repo", str(root),
                         "--feature-service", SERVICE, "--port", str(port),
                         "--max-queue-delay-us", "500", *args],
                        url + "/v2/health/ready") as proc:
        yield proc, url


def infer(url: str, users: list[int], merchants: list[int]) -> httpx.Response:
    body = {"inputs": [
        {"name": "user_id", "datatype": "INT64", "shape": [len(users), 1], "data": users},
        {"name": "merchant_id", "datatype": "INT64", "shape": [len(merchants), 1],
         "data": merchants}]}
    return httpx.post(url + "/v2/models/fraud/infer", json=body, timeout=30)


def expected(root: Path, users: list[int], merchants: list[int]) -> np.ndarray:
    """The model run in-process on what `features get-online` returns now."""
    import onnxruntime as ort

    repo = load_repo(root)
    s = open_store(repo)
    cols = get_online_features(repo, s, [f"service:{SERVICE}"],
                               {"user_id": users, "merchant_id": merchants},
                               to_us(datetime.now(UTC)))
    s.close()
    x = np.array([[cols[f][i] or 0 for f in FEATURES] for i in range(len(users))],
                 np.float32)
    sess = ort.InferenceSession(str(root / "model.onnx"), providers=["CPUExecutionProvider"])
    out: np.ndarray = sess.run(None, {"features": x})[0]
    return out


def test_entity_keys_get_their_online_features_and_the_log_holds_them(tmp_path):
    root = make_repo(tmp_path / "repo")
    users, merchants = [1, 2, 3, 40], [1, 2, 8, 5]
    with gateway(root, "--log-dir", str(tmp_path / "log")) as (_, url):
        meta = httpx.get(url + "/v2/models/fraud").json()
        assert [i["name"] for i in meta["inputs"]] == ["user_id", "merchant_id"]
        r = infer(url, users, merchants)
        assert r.status_code == 200, r.text
        got = np.array(r.json()["outputs"][0]["data"], np.float32).reshape(-1, 1)
        np.testing.assert_allclose(got, expected(root, users, merchants), rtol=1e-5)
        # An unknown merchant: served with the default and counted, never a NaN.
        r = infer(url, [1], [999])
        assert r.status_code == 200
        assert np.isfinite(r.json()["outputs"][0]["data"]).all()
        text = httpx.get(url + "/metrics").text
        assert 'servelab_feature_missing_total{feature="risk_score",model="fraud",' \
               'status="missing",version="1"} 1.0' in text
        assert "servelab_feature_fetch_seconds_count" in text
    log = pa.concat_tables([pq.read_table(f) for f in (tmp_path / "log").glob("*.parquet")])
    assert log.num_rows == 5
    rows = log.to_pylist()
    repo = load_repo(root)
    s = open_store(repo)
    cols = get_online_features(repo, s, [f"service:{SERVICE}"],
                               {"user_id": users, "merchant_id": merchants},
                               to_us(datetime.now(UTC)))
    s.close()
    for i in range(4):
        assert [rows[i][f] for f in FEATURES] == [cols[f][i] for f in FEATURES]
    assert rows[4]["risk_score"] is None
    # The store is as materialized: the served values are the offline point-in-time ones.
    report = skew(repo, tmp_path / "log", SERVICE)
    assert report.rows == 5
    assert report.ok, report.to_dict()
    # New source data arrives (a user_stats update just before the requests) but nobody
    # re-materializes: the online store served stale values, and skew says so.
    first = min(r["request_time"] for r in rows)
    src = pq.read_table(root / "data" / "user_stats.parquet")
    new = src.slice(0, 1).to_pylist()[0]
    before = first.replace(tzinfo=None) - timedelta(seconds=1)
    new.update(user_id=1, txn_count_7d=new["txn_count_7d"] + 1000, event_ts=before,
               created_ts=before)
    pq.write_table(pa.concat_tables([src, pa.Table.from_pylist([new], schema=src.schema)]),
                   root / "data" / "user_stats.parquet")
    stale = skew(load_repo(root), tmp_path / "log", SERVICE)
    assert not stale.ok
    assert stale.mismatches["txn_count_7d"] >= 1
    assert stale.mismatches["risk_score"] == 0
    assert any(e["feature"] == "txn_count_7d" and e["user_id"] == 1 for e in stale.examples)
    out = subprocess.run([sys.executable, "-m", "servelab", "features", "skew", "--repo",
                          str(root), "--log", str(tmp_path / "log"), "--json",
                          "--fail-on-mismatch"], capture_output=True, text=True, check=False)
    assert out.returncode == 1
    assert json.loads(out.stdout)["mismatches"]["txn_count_7d"] >= 1


def test_missing_features_can_be_rejected(tmp_path):
    root = make_repo(tmp_path / "repo")
    with gateway(root, "--missing", "reject") as (_, url):
        r = infer(url, [1, 2], [1, 999])
        assert r.status_code == 400
        msg = r.json()["error"]
        assert "merchant_risk:risk_score for merchant_id=999 is missing" in msg
        assert infer(url, [1], [1]).status_code == 200


def test_a_redis_that_goes_down_gives_clear_errors_and_the_gateway_recovers(tmp_path):
    from tests.services import redis_server

    with redis_server() as url:
        if url is None:
            pytest.skip("redis-server is not installed (apt-get install redis-server)")
        root = make_repo(tmp_path / "repo", "redis", url)
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        with gateway(root) as (_, gw):
            assert infer(gw, [1], [1]).status_code == 200
            # Stop that redis-server (the fixture would only stop it at the end).
            import redis as redis_py

            with contextlib.suppress(redis_py.exceptions.ConnectionError):
                redis_py.Redis(port=port).shutdown(nosave=True)
            time.sleep(0.5)
            t0 = time.monotonic()
            r = infer(gw, [1], [1])
            assert r.status_code == 503, r.text
            assert "Redis unreachable" in r.json()["error"]
            assert time.monotonic() - t0 < 10
            # It comes back (empty: no persistence): re-materialize, and requests work.
            proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind",
                                     "127.0.0.1", "--save", "", "--appendonly", "no"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                for _ in range(50):
                    with contextlib.suppress(Exception):
                        redis_py.Redis(port=port).ping()
                        break
                    time.sleep(0.1)
                repo = load_repo(root)
                s = open_store(repo)
                s.apply(list(repo.views.values()))
                materialize(repo, s)
                s.close()
                r = infer(gw, [1], [1])
                assert r.status_code == 200, r.text
                np.testing.assert_allclose(
                    np.array(r.json()["outputs"][0]["data"], np.float32).reshape(-1, 1),
                    expected(root, [1], [1]), rtol=1e-5)
            finally:
                proc.terminate()
                proc.wait(timeout=10)
