"""The gateway's v2 routes in-process: generated and hostile bodies get one JSON line
with Triton's status codes, never a 500; good bodies answer the model's numbers."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servelab.gateway.app import Metrics, ServedModel, create_gateway
from servelab.gateway.demo import mlp_reference, write_mlp
from servelab.gateway.runner import OnnxModel
from servelab.scenario import BatchingPolicy

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient


@pytest.fixture(scope="module")
def client(tmp_path_factory):  # type: ignore[no-untyped-def]
    path = write_mlp(tmp_path_factory.mktemp("m") / "m.onnx")
    metrics = Metrics()
    served = ServedModel(OnnxModel(path, "mlp"), BatchingPolicy(max_batch_size=8), 1, metrics)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with TestClient(create_gateway([served], metrics=metrics),
                        base_url="http://127.0.0.1") as c:
            yield c


def one_line(r) -> str:  # type: ignore[no-untyped-def]
    msg = r.json()["error"]
    assert "\n" not in msg
    assert 0 < len(msg) < 500
    return str(msg)


def test_json_and_binary_bodies(client):
    x = np.arange(32, dtype=np.float32).reshape(2, 16) / 10
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 16],
                        "data": x.reshape(-1).tolist()}]}
    r = client.post("/v2/models/mlp/infer", json=body)
    assert r.status_code == 200, r.text
    y = np.array(r.json()["outputs"][0]["data"], np.float32).reshape(2, 4)
    np.testing.assert_allclose(y, mlp_reference(x), rtol=1e-5, atol=1e-5)
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 16],
                                   "parameters": {"binary_data_size": 128}}],
                       "parameters": {"binary_data_output": True}}).encode()
    r = client.post("/v2/models/mlp/infer", content=head + x.tobytes(),
                    headers={"Inference-Header-Content-Length": str(len(head))})
    assert r.status_code == 200
    n = int(r.headers["inference-header-content-length"])
    meta = json.loads(r.content[:n])
    assert meta["outputs"][0]["parameters"]["binary_data_size"] == 32
    np.testing.assert_allclose(np.frombuffer(r.content[n:], np.float32).reshape(2, 4),
                               mlp_reference(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("body", "headers", "status", "needle"), [
    (b"{not json", {}, 400, "not valid JSON"),
    (b'{"inputs": 5}', {}, 400, "inputs"),
    (b'{"inputs": [{"name": "z"}]}', {}, 400, "unexpected inference input"),
    (b'{"inputs": [{"name": "x", "datatype": "INT8", "shape": [1, 16], "data": []}]}', {},
     400, "datatype"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [1]}]}', {},
     400, "values for shape"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [9, 16], "data": []}]}', {},
     400, ""),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [100000000, 16]}]}', {},
     400, "elements"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], '
     b'"parameters": {"binary_data_size": 64}}]}', {"Inference-Header-Content-Length": "95"},
     400, ""),
    (b'{}', {"Inference-Header-Content-Length": "abc"}, 400, "Inference-Header"),
    (b'{}', {"Inference-Header-Content-Length": "999"}, 400, "Inference-Header"),
])
def test_bad_bodies_are_400(client, body, headers, status, needle):
    r = client.post("/v2/models/mlp/infer", content=body, headers=headers)
    assert r.status_code == status, r.text
    assert needle in one_line(r)


def test_unknown_model_and_foreign_host(client):
    assert client.post("/v2/models/nope/infer", json={}).status_code == 404
    r = client.get("/v2", headers={"host": "evil.example"})
    assert r.status_code == 403
    assert "answers only" in one_line(r)


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(10**20), 10**20),
              st.floats(allow_nan=False), st.text(max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)


@settings(max_examples=int(os.environ.get("SERVELAB_FUZZ_EXAMPLES", "80")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.one_of(json_values, st.fixed_dictionaries({
    "inputs": st.lists(st.fixed_dictionaries({
        "name": st.sampled_from(["x", "y", ""]),
        "datatype": st.sampled_from(["FP32", "INT64", "BYTES"]),
        "shape": st.lists(st.integers(-2, 20), max_size=3),
        "data": json_values}), max_size=2)})))
def test_generated_bodies_never_500(client, doc):
    r = client.post("/v2/models/mlp/infer", content=json.dumps(doc).encode())
    assert r.status_code in (200, 400), (r.status_code, r.text[:300])
    if r.status_code == 400:
        one_line(r)
