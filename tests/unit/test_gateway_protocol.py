"""The gateway's v2 routes in-process: generated and hostile bodies get one JSON line
with Triton's status codes, never a 500; good bodies answer the model's numbers."""

from __future__ import annotations

import gzip
import json
import os
import warnings
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servelab.errors import InputError
from servelab.gateway.app import Metrics, ServedModel, create_gateway
from servelab.gateway.demo import mlp_reference, write_mlp
from servelab.gateway.protocol import parse_request, top_classes
from servelab.gateway.runner import OnnxModel, TensorSpec
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


def _one(data: object, datatype: str = "FP32") -> bytes:
    return json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": [1, 16],
                                   "data": data}]}).encode()


@pytest.mark.parametrize(("body", "needle"), [
    (_one(["0.5"] * 16), "value \"0.5\" is not valid FP32 data"),  # Triton: not a number
    (_one([True] * 16), "value true is not valid FP32 data"),
    (_one([None] * 16), "value null"),
    (_one([{"v": 0.5}] * 16), "value {\"v\": 0.5}"),
    (_one([1e39] * 16), "out of FP32's range"),  # would silently become inf
    (_one([1.0] * 15 + [-1e39]), "out of FP32's range"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": '
     b'[NaN, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]}]}', "not valid JSON"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": '
     b'[Infinity, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]}]}', "not valid JSON"),
    (_one([0.5] * 16).replace(b'"data"', b'"parameters": {"binary_data_size": true}, '
                                         b'"x_data"'), "binary_data_size"),
    (_one(0.5), "data must be a list"),
])
def test_tensor_data_is_taken_as_triton_takes_it(client, body, needle):
    """No silent conversion: a string, a boolean, a fraction for an integer, a value
    outside the datatype's range, NaN or Infinity is a 400 naming the value."""
    r = client.post("/v2/models/mlp/infer", content=body)
    assert r.status_code == 400, r.text
    assert needle in one_line(r)


def test_integers_fit_floats_and_nested_rows_are_row_major(client):
    x = (np.arange(32, dtype=np.float32).reshape(2, 16) - 7)
    flat = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 16],
                        "data": [int(v) for v in x.reshape(-1)]}]}
    nested = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 16],
                          "data": x.tolist()}]}
    a = client.post("/v2/models/mlp/infer", json=flat)
    b = client.post("/v2/models/mlp/infer", json=nested)
    assert a.status_code == b.status_code == 200, (a.text, b.text)
    assert a.json()["outputs"] == b.json()["outputs"]
    y = np.array(a.json()["outputs"][0]["data"], np.float32).reshape(2, 4)
    np.testing.assert_allclose(y, mlp_reference(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("datatype", "good", "bad", "needle"), [
    ("INT64", [7, -3], [7.9, 1], "no fractions"),  # 7.9 would have become 7
    ("INT64", [2**63 - 1, 0], [2**63, 0], "out of INT64's range"),
    ("INT8", [127, -128], [128, 0], "out of INT8's range"),
    ("UINT8", [255, 0], [-1, 0], "out of UINT8's range"),
    ("INT32", [1, 2], [True, 2], "value true"),
    ("BOOL", [True, False], [1, 0], "expected true/false"),
    ("FP16", [65504.0, 1], [70000.0, 1], "out of FP16's range"),
])
def test_each_datatype_takes_only_its_own_json_values(datatype, good, bad, needle):
    from servelab.errors import InputError
    from servelab.gateway.protocol import parse_request
    from servelab.gateway.runner import TensorSpec

    specs = (TensorSpec("t", datatype, (-1, 2)),)

    def parse(data: list[object]) -> np.ndarray:
        body = json.dumps({"inputs": [{"name": "t", "datatype": datatype, "shape": [1, 2],
                                       "data": data}]}).encode()
        return parse_request(body, None, "m", specs, 4).inputs["t"]

    arr = parse(good)
    assert arr.dtype == specs[0].dtype
    assert arr.reshape(-1).tolist() == good
    with pytest.raises(InputError, match=needle.replace("(", r"\(").replace("'", "'")):
        parse(bad)


@pytest.mark.parametrize(("datatype", "value", "kept"), [
    # FP32's largest value, and the largest double that still rounds to it
    ("FP32", 3.4028234663852886e38, True), ("FP32", 3.4028235677973362e38, True),
    ("FP32", 3.4028235677973366e38, False),  # half a unit above: rounds to infinity
    ("FP32", -3.4028235677973366e38, False), ("FP32", 2**200, False),
    ("FP16", 65519.99, True), ("FP16", 65520.0, False), ("FP16", -65520, False),
    ("FP64", 1.7976931348623157e308, True), ("FP64", 10**400, False),
])
def test_a_float_is_kept_exactly_when_it_rounds_to_a_finite_value(datatype, value, kept):
    """The edge of each float type's range: a JSON number is taken when it rounds to a
    finite value of the datatype, and refused where it would become infinity."""
    from servelab.errors import InputError
    from servelab.gateway.protocol import parse_request
    from servelab.gateway.runner import TensorSpec

    specs = (TensorSpec("t", datatype, (-1, 1)),)
    body = json.dumps({"inputs": [{"name": "t", "datatype": datatype, "shape": [1, 1],
                                   "data": [value]}]}).encode()
    if kept:
        arr = parse_request(body, None, "m", specs, 4).inputs["t"]
        assert arr.dtype == specs[0].dtype
        assert arr[0, 0] == np.asarray(float(value)).astype(specs[0].dtype)
        assert np.isfinite(arr).all()
    else:
        with pytest.raises(InputError, match=f"out of {datatype}'s range"):
            parse_request(body, None, "m", specs, 4)


def test_a_models_body_limit_is_its_largest_valid_request():
    """The limit holds the largest request that can be valid, pretty-printed JSON of the
    longest numbers included, and nothing near 64 MB for a small model."""
    from servelab.gateway.protocol import MAX_BODY_BYTES, max_request_bytes, parse_request
    from servelab.gateway.runner import TensorSpec

    specs = (TensorSpec("x", "FP64", (-1, 16)), TensorSpec("k", "INT64", (-1, 1)))
    limit = max_request_bytes(specs, 8)
    doc = {"id": "a" * 1000, "inputs": [
        {"name": "x", "datatype": "FP64", "shape": [8, 16],
         "data": [[-2.2250738585072014e-308] * 16] * 8},
        {"name": "k", "datatype": "INT64", "shape": [8, 1], "data": [[-(2**63)]] * 8}],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}
    body = json.dumps(doc, indent=8).encode()
    assert len(body) <= limit < 1024 * 1024
    assert parse_request(body, None, "m", specs, 8).rows == 8
    assert max_request_bytes((TensorSpec("x", "FP32", (-1, -1)),), 8) == MAX_BODY_BYTES
    assert max_request_bytes((TensorSpec("x", "FP32", (-1, 10**6)),), 1024) == MAX_BODY_BYTES


def test_a_body_over_the_models_limit_is_413_before_it_is_read(client):
    r = client.post("/v2/models/mlp/infer", content=b"[" * 200_000)
    assert r.status_code == 413
    assert "fewer rows per request" in one_line(r)
    assert r.headers["connection"] == "close"
    # Other routes take no body at all worth speaking of.
    assert client.post("/v2/repository/index", content=b"x" * (2 * 1024 * 1024)
                       ).status_code == 413


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 12), st.integers(1, 20), st.integers(0, 2**31))
def test_classification_is_the_top_k_per_row(rows, classes, k, seed):
    arr = np.random.default_rng(seed).normal(size=(rows, classes)).astype(np.float32)
    arr[:, 0] = arr[:, -1]  # a tie: the lower index first
    got = top_classes("y", arr, k)
    assert got.shape == (rows, min(k, classes))
    for row, labels in zip(arr, got, strict=True):
        idx = [int(s.split(b":")[1]) for s in labels]
        scores = [float(s.split(b":")[0]) for s in labels]
        assert sorted(range(classes), key=lambda i: (-row[i], i))[:len(idx)] == idx
        assert scores == [float(f"{float(row[i]):f}") for i in idx]


def test_classification_parameter_is_checked():
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2],
                                   "data": [1.0, 2.0]}],
                       "outputs": [{"name": "y", "parameters": {"classification": -1}}]})
    spec = (TensorSpec("x", "FP32", (-1, 2)),)
    with pytest.raises(InputError, match="classification = -1"):
        parse_request(body.encode(), None, "m", spec, 8)
    with pytest.raises(InputError, match="shape \\[batch, classes\\]"):
        top_classes("y", np.zeros((2, 3, 4), np.float32), 2)


def test_latency_summaries_are_bounded_and_their_quantiles_exact_over_the_window():
    from servelab.gateway.app import SUMMARY_MAX_SAMPLES, _quantiles, _Summary

    s = _Summary()
    rng = np.random.default_rng(1)
    values = rng.exponential(1000.0, 3 * SUMMARY_MAX_SAMPLES)
    for i, v in enumerate(values):
        s.observe(float(v), 1, now=i * 1e-3)
    s.observe(5.0, 10**9, now=60.0)  # a huge batch: its samples are capped too
    assert s.count == values.size + 10**9
    assert len(s.values) == len(s.times) == SUMMARY_MAX_SAMPLES
    window = s.window(now=60.0)
    assert np.all(window == 5.0)
    assert _quantiles(window) == [5.0] * 5
    fresh = _Summary()
    for i, v in enumerate(values[:100]):
        fresh.observe(float(v), 1, now=float(i))
    got = _quantiles(fresh.window(now=100.0))  # samples older than 60 s are gone
    assert got == pytest.approx(np.quantile(values[40:100], [0.5, 0.9, 0.95, 0.99, 0.999]))
    assert all(np.isnan(_quantiles(fresh.window(now=1e6))))


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(max_size=4096),
                 st.binary(max_size=20_000).map(gzip.compress),
                 st.binary(max_size=20_000).map(zlib.compress)),
       st.sampled_from(["gzip", "deflate", "br", "x-gzip", ""]), st.integers(1, 16_384))
def test_any_compressed_body_inflates_within_its_limit_or_is_one_clear_error(body, enc, limit):
    from servelab.gateway.app import decompressed

    try:
        out: bytes | str = decompressed(body, enc, limit)
    except InputError as exc:
        out = str(exc)
    if isinstance(out, str):  # the error: one line with its fix
        assert "\n" not in out
        assert "fix:" in out
    else:
        assert len(out) <= limit
