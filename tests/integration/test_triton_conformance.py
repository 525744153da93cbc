"""The gateway held against Triton 2.51's own `tritonserver` on the same model
repository, with NVIDIA's client: each case runs on both servers and must give the same
answers, status codes and statistics (issue 31's conformance suite; tests/tritonserver.py
starts the real server from the wheel scripts/test.sh installs)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from servelab.gateway.demo import mlp_reference
from tests.integration.test_validate_triton import pytriton_python
from tests.services import free_port, server_process
from tests.tritonserver import tritonserver, write_model

httpclient = pytest.importorskip("tritonclient.http")
aioclient = pytest.importorskip("tritonclient.http.aio")

pytestmark = pytest.mark.skipif(pytriton_python() is None,
                                reason="no .venv-pytriton (bash scripts/test.sh builds it)")


@contextlib.contextmanager
def both(repo: Path, work: Path, triton_args: tuple[str, ...] = (),
         servelab_args: tuple[str, ...] = ()) -> Iterator[dict[str, tuple[str, str, str]]]:
    """The gateway on repo/onnx and tritonserver on repo/python: {server: (HTTP address,
    metrics address, gRPC address)}, each host:port (both with a metrics port and a gRPC
    port of their own)."""
    port, metrics_port, grpc_port = free_port(), free_port(), free_port()
    with tritonserver(repo / "python", work, *triton_args) as triton, server_process(
            [sys.executable, "-m", "servelab", "serve", "--model-repository",
             str(repo / "onnx"), "--port", str(port), "--metrics-port", str(metrics_port),
             "--grpc-port", str(grpc_port), *servelab_args],
            f"http://127.0.0.1:{port}/v2/health/ready"):
        yield {"servelab": (f"127.0.0.1:{port}", f"127.0.0.1:{metrics_port}",
                            f"127.0.0.1:{grpc_port}"), "triton": triton}


def burst(url: str, model: str, x: np.ndarray, n: int) -> None:
    """n concurrent requests of x; every answer checked against the MLP."""
    async def go() -> None:
        c = aioclient.InferenceServerClient(url)
        inp = aioclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        try:
            results = await asyncio.gather(*[c.infer(model, [inp]) for _ in range(n)])
        finally:
            await c.close()
        for r in results:
            np.testing.assert_allclose(r.as_numpy("y"), mlp_reference(x), rtol=1e-5,
                                       atol=1e-5)

    asyncio.run(go())


def batch_rows(url: str, model: str) -> dict[int, int]:
    """Executions per batch size (rows) from the server's statistics."""
    c = httpclient.InferenceServerClient(url)
    try:
        st = c.get_inference_statistics(model)["model_stats"][0]
    finally:
        c.close()
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in st["batch_stats"]}


def test_batches_counted_in_rows_and_no_batching_without_dynamic_batching(tmp_path):
    """16 concurrent 4-row requests, max_batch_size 32, a 50 ms window: no batch over 32
    rows on either server; without dynamic_batching, each request alone on both."""
    write_model(tmp_path / "repo", "rows", "max_batch_size: 32 dynamic_batching { "
                "max_queue_delay_microseconds: 50000 }")
    write_model(tmp_path / "repo", "alone", "max_batch_size: 32")
    x = np.random.default_rng(3).normal(size=(4, 16)).astype(np.float32)
    seen = {}
    with both(tmp_path / "repo", tmp_path) as urls:
        for server, (url, _, _) in urls.items():
            c = httpclient.InferenceServerClient(url)
            assert "dynamic_batching" not in c.get_model_config("alone"), server
            c.close()
            burst(url, "rows", x, 16)
            burst(url, "alone", x, 16)
            seen[server] = (batch_rows(url, "rows"), batch_rows(url, "alone"))
    for server, (rows, alone) in seen.items():
        assert sum(size * n for size, n in rows.items()) == 64, (server, rows)
        assert max(rows) <= 32, (server, rows)
        assert alone == {4: 16}, (server, alone)


def test_versions_status_codes_failure_accounting_and_metrics(tmp_path):
    """A model in version folder 3: the version each path reports, what an absent version
    answers, 400s that are not counted as failures, and Triton's metric families (types
    and the failure reasons, at 0 before any failure)."""
    write_model(tmp_path / "repo", "m", "max_batch_size: 8 dynamic_batching { }", version=3)
    x = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 16],
                                "data": [0.5] * 32}]})
    bad_shape = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3],
                                        "data": [1.0] * 6}]})
    too_big = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [9, 16],
                                      "data": [1.0] * 144}]})
    cases = [("GET", "/v2/models/m", None), ("GET", "/v2/models/m/ready", None),
             ("GET", "/v2/models/m/versions/3/ready", None),
             ("GET", "/v2/models/m/versions/1/ready", None),
             ("GET", "/v2/models/m/versions/3", None), ("GET", "/v2/models/m/versions/1", None),
             ("GET", "/v2/models/m/versions/1/stats", None),
             ("POST", "/v2/repository/index", None),
             ("POST", "/v2/models/m/infer", x), ("POST", "/v2/models/m/versions/3/infer", x),
             ("POST", "/v2/models/m/versions/1/infer", x),
             ("POST", "/v2/models/m/infer", bad_shape), ("POST", "/v2/models/m/infer", too_big),
             ("POST", "/v2/models/nope/infer", x)]
    seen: dict[str, list] = {}
    with both(tmp_path / "repo", tmp_path) as urls:
        for server, (url, metrics_url, _) in urls.items():
            before = families(httpx.get(f"http://{metrics_url}/metrics").text)
            got = []
            for method, path, body in cases:
                r = httpx.request(method, f"http://{url}{path}", content=body)
                doc = r.json() if r.content else None
                got.append((r.status_code, versions_in(doc)))
            st = httpx.get(f"http://{url}/v2/models/m/stats").json()["model_stats"][0]
            counts = {k: v["count"] for k, v in st["inference_stats"].items()
                      if k in ("success", "fail")}
            foreign = httpx.get(f"http://{metrics_url}/metrics",
                                headers={"Host": "evil.example"}).status_code
            seen[server] = [got, st["version"], counts, before, foreign]
    assert seen["servelab"][0] == seen["triton"][0], list(zip(
        cases, seen["servelab"][0], seen["triton"][0], strict=True))
    assert seen["servelab"][1:3] == seen["triton"][1:3] == ["3", {"success": 2, "fail": 0}]
    ours, theirs = seen["servelab"][3], seen["triton"][3]
    assert seen["servelab"][4] == 403  # the metrics port checks the Host too
    assert theirs.keys() >= TRITON_FAMILIES, sorted(theirs)
    for name in TRITON_FAMILIES:
        assert ours.get(name) == theirs[name], (name, ours.get(name), theirs[name])


def test_version_policies_serve_the_versions_triton_serves(tmp_path):
    """Versions 1, 2 and 3 of a model under each version_policy (all, latest 2,
    specific [1, 2], the default): which versions each path serves, reports and counts,
    over HTTP and gRPC, the same on both servers."""
    policies = {"all": "version_policy: { all { } }",
                "two": "version_policy: { latest { num_versions: 2 } }",
                "spec": "version_policy: { specific { versions: [1, 2] } }", "dflt": ""}
    for name, policy in policies.items():
        for v in (1, 2, 3):
            write_model(tmp_path / "repo", name, f"{policy} max_batch_size: 8 "
                        "dynamic_batching { }", version=v)
    x = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16],
                                "data": [0.5] * 16}]})
    grpcclient = pytest.importorskip("tritonclient.grpc")
    seen: dict[str, list] = {}
    with both(tmp_path / "repo", tmp_path) as urls:
        for server, (url, metrics_url, grpc_url) in urls.items():
            got: list[object] = [versions_in(httpx.post(f"http://{url}/v2/repository/index"
                                                        ).json())]
            g = grpcclient.InferenceServerClient(grpc_url)
            for path in ("/v2/repository/models/all/load", "/v2/repository/models/all/unload",
                         "/v2/repository/models/nope/load"):  # the model control mode NONE
                got.append((path, httpx.post(f"http://{url}{path}").status_code))
            got.append(grpc_outcome(lambda g=g: g.load_model("all")))
            got.append(grpc_outcome(lambda g=g: g.unload_model("all")))
            for name in policies:
                for path in ("", "/versions/1", "/versions/2", "/versions/3"):
                    r = httpx.get(f"http://{url}/v2/models/{name}{path}")
                    got.append((path, r.status_code, versions_in(r.json())))
                    r = httpx.get(f"http://{url}/v2/models/{name}{path}/ready")
                    got.append((path, "ready", r.status_code))
                    r = httpx.post(f"http://{url}/v2/models/{name}{path}/infer", content=x)
                    got.append((path, "infer", r.status_code,
                                r.json().get("model_version")))
                    v = path.rsplit("/", 1)[-1]
                    got.append((path, "grpc", g.is_model_ready(name, v),
                                grpc_outcome(lambda name=name, v=v, g=g: g.get_model_metadata(
                                    name, v, as_json=True)["versions"])))
                cf = httpx.get(f"http://{url}/v2/models/{name}/config").json()
                got.append(cf["version_policy"])
                st = httpx.get(f"http://{url}/v2/models/{name}/stats").json()["model_stats"]
                got.append(sorted((s["version"], s["inference_stats"]["success"]["count"])
                                  for s in st))
            g.close()
            success = families(httpx.get(f"http://{metrics_url}/metrics").text)[
                "nv_inference_request_success"]
            got.append(success)
            seen[server] = got
    ours, theirs = seen["servelab"], seen["triton"]
    for a, b in zip(ours, theirs, strict=True):
        assert a == b, (a, b)
    assert [m["version"] for m in ours[0] if m["name"] == "all"] == ["1", "2", "3"]
    assert [m["version"] for m in ours[0] if m["name"] == "dflt"] == ["3"]


# The families both servers have on CPU (Triton's summaries, cache and CPU/GPU gauges are
# not asked of servelab here).
TRITON_FAMILIES = {"nv_inference_request_success", "nv_inference_request_failure",
                   "nv_inference_count", "nv_inference_exec_count",
                   "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                   "nv_inference_compute_input_duration_us",
                   "nv_inference_compute_infer_duration_us",
                   "nv_inference_compute_output_duration_us",
                   "nv_inference_pending_request_count"}


def families(text: str) -> dict[str, tuple[str, frozenset]]:
    """Per metric family: its type and its series (labels and value), from the text."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(text):
        out[fam.name] = (fam.type, frozenset((tuple(sorted(s.labels.items())), s.value)
                                             for s in fam.samples))
    return out


def versions_in(doc: object) -> object:
    """What a JSON answer says of versions (the rest differs in wording, not meaning)."""
    if isinstance(doc, list):
        return [versions_in(d) for d in doc]
    if isinstance(doc, dict):
        return {k: v for k, v in doc.items() if k in ("versions", "model_version", "version",
                                                      "name", "state")}
    return doc


def test_compressed_bodies_and_answers(tmp_path):
    """tritonclient's request_compression_algorithm and response_compression_algorithm
    (gzip, deflate) give the same answers on both servers; an encoding neither knows and a
    body that is not gzip are refused by both (gzip sent as deflate is taken by both). On
    the gateway a small body that
    inflates past the model's largest valid request is a 413, read no further."""
    import gzip
    import zlib

    write_model(tmp_path / "repo", "m", "max_batch_size: 8 dynamic_batching { }")
    x = np.random.default_rng(4).normal(size=(3, 16)).astype(np.float32)
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 16],
                                   "data": x.ravel().tolist()}]}).encode()
    raw_cases = [("br", body), ("gzip", b"not gzip at all"), ("deflate", gzip.compress(body))]
    seen: dict[str, list[int]] = {}
    with both(tmp_path / "repo", tmp_path) as urls:
        for server, (url, _, _) in urls.items():
            c = httpclient.InferenceServerClient(url)
            inp = httpclient.InferInput("x", [3, 16], "FP32")
            inp.set_data_from_numpy(x, binary_data=True)
            for request_alg in (None, "gzip", "deflate"):
                for response_alg in (None, "gzip", "deflate"):
                    res = c.infer("m", [inp], request_compression_algorithm=request_alg,
                                  response_compression_algorithm=response_alg)
                    np.testing.assert_allclose(res.as_numpy("y"), mlp_reference(x),
                                               rtol=1e-5, atol=1e-5)
            c.close()
            seen[server] = [httpx.post(f"http://{url}/v2/models/m/infer", content=b,
                                       headers={"Content-Encoding": enc}).status_code
                            for enc, b in raw_cases]
            r = httpx.post(f"http://{url}/v2/models/m/infer", content=zlib.compress(body),
                           headers={"Content-Encoding": "deflate",
                                    "Accept-Encoding": "gzip"})
            assert r.status_code == 200, (server, r.text)
            assert r.headers["content-encoding"] == "gzip", server  # (httpx inflates it)
            assert r.json()["outputs"][0]["name"] == "y"
        bomb = gzip.compress(b"{" + b" " * (8 * 1024 * 1024) + b"}")  # 8 KiB sent
        r = httpx.post(f"http://{urls['servelab'][0]}/v2/models/m/infer", content=bomb,
                       headers={"Content-Encoding": "gzip"}, timeout=30)
        assert r.status_code == 413, r.text
        assert "inflates past" in r.json()["error"]
    # The same, but for an unknown encoding: Triton's 501 is a server error; the gateway
    # answers 415, as RFC 9110 has it (a deliberate difference, docs/gateway.md).
    assert seen["triton"] == [501, 400, 200], seen
    assert seen["servelab"] == [415, 400, 200], seen


def test_classification_extension(tmp_path):
    """An output asked for with class_count k: per row the top k as "score:index"
    strings, highest first, in JSON and binary; k past the classes gives them all; k 0
    the raw output. Indices equal on both servers; scores to the printed digits."""
    write_model(tmp_path / "repo", "m", "max_batch_size: 8 dynamic_batching { }")
    x = np.random.default_rng(5).normal(size=(3, 16)).astype(np.float32)
    seen: dict[str, list] = {}
    with both(tmp_path / "repo", tmp_path) as urls:
        for server, (url, _, _) in urls.items():
            c = httpclient.InferenceServerClient(url)
            inp = httpclient.InferInput("x", [3, 16], "FP32")
            inp.set_data_from_numpy(x)
            got = []
            for k in (1, 3, 9, 0):
                for binary in (True, False):
                    out = httpclient.InferRequestedOutput("y", binary_data=binary,
                                                          class_count=k)
                    r = c.infer("m", [inp], outputs=[out])
                    meta = r.get_output("y")
                    got.append((k, binary, meta["datatype"], meta["shape"],
                                r.as_numpy("y")))
            c.close()
            seen[server] = got
    for ours, theirs in zip(seen["servelab"], seen["triton"], strict=True):
        assert ours[:4] == theirs[:4], (ours, theirs)
        if ours[0] == 0:
            np.testing.assert_allclose(ours[4], theirs[4], rtol=1e-5, atol=1e-5)
            continue
        for a, b in zip(ours[4].reshape(-1), theirs[4].reshape(-1), strict=True):
            sa, ia = (a.decode() if isinstance(a, bytes) else a).split(":")
            sb, ib = (b.decode() if isinstance(b, bytes) else b).split(":")
            assert ia == ib
            assert abs(float(sa) - float(sb)) <= 2e-6
    k3 = seen["servelab"][2]
    assert k3[3] == [3, 3]
    top = np.argsort(-mlp_reference(x), axis=1)[:, 0]
    assert [int(s.split(b":")[1]) for s in k3[4][:, 0]] == top.tolist()


SUMMARIES = ("nv_inference_request_summary_us", "nv_inference_queue_summary_us",
             "nv_inference_compute_input_summary_us", "nv_inference_compute_infer_summary_us",
             "nv_inference_compute_output_summary_us")


def test_latency_summaries(tmp_path):
    """Triton's --metrics-config summary_latencies=true and the gateway's
    --summary-latencies: the same summary families, series and counts (a request each),
    NaN quantiles before any request and finite ones after."""
    from prometheus_client.parser import text_string_to_metric_families

    write_model(tmp_path / "repo", "m", "max_batch_size: 8 dynamic_batching { }")
    x = np.ones((2, 16), np.float32)
    seen = {}
    with both(tmp_path / "repo", tmp_path, ("--metrics-config", "summary_latencies=true"),
              ("--summary-latencies",)) as urls:
        for server, (url, metrics_url, _) in urls.items():
            def summaries() -> dict[str, object]:
                fams = {f.name: f for f in text_string_to_metric_families(
                    httpx.get(f"http://{metrics_url}/metrics").text)}  # noqa: B023
                return {n: (fams[n].type, sorted((s.name, tuple(sorted(s.labels.items())),
                                                  s.value if s.name.endswith("_count")
                                                  else math.isfinite(s.value))
                                                 for s in fams[n].samples))
                        for n in SUMMARIES}

            before = summaries()
            c = httpclient.InferenceServerClient(url)
            inp = httpclient.InferInput("x", [2, 16], "FP32")
            inp.set_data_from_numpy(x)
            for _ in range(5):
                c.infer("m", [inp])
            c.close()
            seen[server] = (before, summaries())
    assert seen["servelab"] == seen["triton"], seen
    _, after = seen["servelab"]
    assert all(typ == "summary" for typ, _ in after.values())


def test_classification_labels_from_the_label_file(tmp_path):
    """An output's label_filename: "score:index:label" where the file has a label at that
    index, "score:index" where its line is empty or missing, on both servers."""
    write_model(tmp_path / "repo", "m", "max_batch_size: 8 dynamic_batching { }")
    for kind in ("onnx", "python"):
        d = tmp_path / "repo" / kind / "m"
        cfg = d / "config.pbtxt"
        cfg.write_text(cfg.read_text().replace(
            "dims: [ 4 ] }", 'dims: [ 4 ] label_filename: "labels.txt" }'))
        (d / "labels.txt").write_text("cat\ndog\n\n")  # index 2 empty, 3 past the end
    x = np.random.default_rng(6).normal(size=(4, 16)).astype(np.float32)
    seen = {}
    with both(tmp_path / "repo", tmp_path) as urls:
        for server, (url, _, _) in urls.items():
            c = httpclient.InferenceServerClient(url)
            inp = httpclient.InferInput("x", [4, 16], "FP32")
            inp.set_data_from_numpy(x)
            r = c.infer("m", [inp], outputs=[httpclient.InferRequestedOutput(
                "y", binary_data=False, class_count=4)])
            c.close()
            seen[server] = [s.split(":", 1)[1] for s in r.as_numpy("y").reshape(-1)]
    assert seen["servelab"] == seen["triton"], seen
    assert {s for s in seen["servelab"] if s.count(":")} <= {"0:cat", "1:dog"}


def grpc_outcome(call: Callable[[], object]) -> object:
    """What a gRPC call answered: its value, or its status code's name (the wording of
    the message differs between the servers, the code must not)."""
    from tritonclient.utils import InferenceServerException

    try:
        return call()
    except InferenceServerException as exc:
        return str(exc.status())


def grpc_cases(url: str, x: np.ndarray) -> list[object]:
    """Every case of the gRPC test on the server at url: what each call answered."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    c = grpcclient.InferenceServerClient(url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(c._channel)

    def inp(shape: tuple[int, ...]) -> object:
        i = grpcclient.InferInput("x", list(shape), "FP32")
        i.set_data_from_numpy(np.ones(shape, np.float32) if shape != x.shape else x)
        return i

    def meta(version: str = "") -> object:
        m = c.get_model_metadata("m", version, as_json=True)
        return (m["name"], m["versions"], [(t["name"], t["datatype"], t["shape"])
                                           for t in m["inputs"] + m["outputs"]])

    def config() -> object:
        cf = c.get_model_config("m", as_json=True)["config"]
        return (cf["name"], cf["max_batch_size"],
                [(t["name"], t["data_type"], t["dims"]) for t in cf["input"] + cf["output"]])

    def infer(model: str = "m", version: str = "", shape: tuple[int, ...] = x.shape
              ) -> object:
        r = c.infer(model, [inp(shape)], model_version=version, request_id="r7")
        resp = r.get_response(as_json=True)
        return (resp["model_name"], resp["model_version"], resp["id"],
                [(o["name"], o["datatype"], o["shape"]) for o in resp["outputs"]],
                r.as_numpy("y"))

    def classes() -> object:
        out = grpcclient.InferRequestedOutput("y", class_count=2)
        r = c.infer("m", [inp(x.shape)], outputs=[out])
        return [[s.split(b":")[1] for s in row] for row in r.as_numpy("y")]

    def typed(values: list[float]) -> object:
        req = service_pb2.ModelInferRequest(model_name="m")
        t = req.inputs.add(name="x", datatype="FP32", shape=[2, 16])
        t.contents.fp32_contents.extend(values)
        try:
            r = stub.ModelInfer(req)
        except Exception as exc:  # grpc.RpcError
            return str(exc.code())
        return np.frombuffer(r.raw_output_contents[0], np.float32).reshape(2, 4)

    def stream() -> object:
        answers: list[object] = []
        c.start_stream(callback=lambda result, error: answers.append(
            (result.as_numpy("y") if result is not None else None,
             None if error is None else "error")))
        for shape in (x.shape, x.shape, (2, 3), x.shape):
            c.async_stream_infer("m", [inp(shape)])
        c.stop_stream()
        return answers

    got = [grpc_outcome(f) for f in (
        c.is_server_live, c.is_server_ready, lambda: c.is_model_ready("m"),
        lambda: c.is_model_ready("m", "3"), lambda: c.is_model_ready("m", "1"),
        lambda: c.is_model_ready("nope"), meta, lambda: meta("3"), lambda: meta("1"),
        lambda: c.get_model_metadata("nope"), config, infer, lambda: infer(version="3"),
        lambda: infer(version="1"), lambda: infer("nope"), lambda: infer(shape=(2, 3)),
        lambda: infer(shape=(9, 16)), classes, lambda: typed(x.reshape(-1).tolist()),
        lambda: typed([1.0] * 5), stream,
        lambda: c.get_inference_statistics("m", "1", as_json=True),
        lambda: [(m["name"], m["version"], m["state"]) for m in
                 c.get_model_repository_index(as_json=True)["models"]])]
    st = c.get_inference_statistics("m", as_json=True)["model_stats"][0]
    got.append((st["version"], st["inference_stats"]["success"].get("count", 0),
                st["inference_stats"]["fail"].get("count", 0)))
    c.close()
    return got


def test_grpc_answers_as_tritons(tmp_path):
    """Triton's gRPC service (tritonclient.grpc, and its raw stub for typed contents):
    health, metadata, config, infer raw and typed, classification, streams (a failure
    answered in the stream, which goes on), versions, status codes and statistics."""
    write_model(tmp_path / "repo", "m", "max_batch_size: 8 dynamic_batching { }", version=3)
    x = np.random.default_rng(9).normal(size=(2, 16)).astype(np.float32)
    with both(tmp_path / "repo", tmp_path) as urls:
        seen = {server: grpc_cases(grpc_url, x) for server, (_, _, grpc_url) in urls.items()}
    ours, theirs = seen["servelab"], seen["triton"]
    # live, ready, m ready, m v3 ready, m v1 not, nope not; 7 served (the stream's 3),
    # none failed (refused requests are not failures, on either side)
    assert ours[:6] == [True, True, True, True, False, False]
    assert ours[-1] == ("3", "7", 0)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if isinstance(a, tuple) and a and isinstance(a[-1], np.ndarray):  # an inference
            assert a[:-1] == b[:-1], (i, a, b)
            np.testing.assert_allclose(a[-1], b[-1], rtol=1e-5, atol=1e-5)
        elif isinstance(a, np.ndarray):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        elif i == 20:  # the stream: answers as they complete (in no promised order)
            assert sorted(e is None for _, e in a) == sorted(e is None for _, e in b) == [
                False, True, True, True], (a, b)
            for (ya, _), (yb, _) in zip(a, b, strict=True):
                if ya is not None and yb is not None:
                    np.testing.assert_allclose(ya, yb, rtol=1e-5, atol=1e-5)
        else:
            assert a == b, (i, a, b)
    np.testing.assert_allclose(ours[11][-1], mlp_reference(x), rtol=1e-5, atol=1e-5)
