"""The gateway's gRPC side: generated and hostile ModelInferRequests are parsed or
refused with an InputError (never another exception); a real gRPC server over a real
ONNX model answers tritonclient.grpc, refuses a message past its limit and a full queue
with Triton's status codes, and goes on serving. (Held against Triton's own gRPC
service in tests/integration/test_triton_conformance.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servelab.errors import InputError
from servelab.gateway.app import Metrics, ServedModel, by_model
from servelab.gateway.demo import mlp_reference, write_mlp
from servelab.gateway.grpc_service import create_grpc_server, parse_grpc_request
from servelab.gateway.runner import OnnxModel, TensorSpec
from servelab.scenario import BatchingPolicy
from tests.services import free_port

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import service_pb2  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

SPECS = (TensorSpec("a", "FP32", (-1, 3)), TensorSpec("b", "INT8", (-1, 2)))
MODEL = SimpleNamespace(model=SimpleNamespace(name="m"), inputs=SPECS,
                        policy=SimpleNamespace(max_batch_size=4))
DATATYPES = ["FP32", "INT8", "INT64", "FP16", "BYTES", "BOOL", "", "fp32"]


@st.composite
def requests(draw: st.DrawFn) -> service_pb2.ModelInferRequest:
    req = service_pb2.ModelInferRequest(model_name="m")
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 3))):
        t = req.inputs.add(name=draw(st.sampled_from(["a", "b", "c", ""])),
                           datatype=draw(st.sampled_from(DATATYPES)),
                           shape=draw(st.lists(st.integers(-2, 6), max_size=4)))
        if raw:
            req.raw_input_contents.append(draw(st.binary(max_size=64)))
        else:
            which = draw(st.sampled_from(["fp32", "int", "int64", "bool", "none"]))
            n = draw(st.integers(0, 30))
            if which == "fp32":
                t.contents.fp32_contents.extend(draw(st.lists(
                    st.floats(width=32), min_size=n, max_size=n)))
            elif which == "int":
                t.contents.int_contents.extend(draw(st.lists(
                    st.integers(-(2**31), 2**31 - 1), min_size=n, max_size=n)))
            elif which == "int64":
                t.contents.int64_contents.extend(draw(st.lists(
                    st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n)))
            elif which == "bool":
                t.contents.bool_contents.extend(draw(st.lists(st.booleans(), min_size=n,
                                                              max_size=n)))
    if draw(st.booleans()):  # a stray raw entry, or one too few
        req.raw_input_contents.append(draw(st.binary(max_size=16)))
    for _ in range(draw(st.integers(0, 2))):
        o = req.outputs.add(name=draw(st.sampled_from(["y", "z"])))
        kind = draw(st.sampled_from(["none", "int", "string", "bool"]))
        if kind == "int":
            o.parameters["classification"].int64_param = draw(st.integers(-5, 2**40))
        elif kind == "string":
            o.parameters["classification"].string_param = "3"
        elif kind == "bool":
            o.parameters["classification"].bool_param = True
    return req


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_generated_requests_parse_or_are_refused_with_a_clear_line(req):
    try:
        r = parse_grpc_request(req, MODEL)
    except InputError as exc:
        msg = str(exc)
        assert "\n" not in msg
        assert 0 < len(msg) < 500
        return
    assert set(r.inputs) == {"a", "b"}
    assert 1 <= r.rows <= 4
    assert r.inputs["a"].shape == (r.rows, 3)
    assert r.inputs["a"].dtype == np.float32
    assert r.inputs["b"].shape == (r.rows, 2)
    assert r.inputs["b"].dtype == np.int8


def test_typed_contents_are_held_to_the_datatypes_range():
    req = service_pb2.ModelInferRequest(model_name="m")
    a = req.inputs.add(name="a", datatype="FP32", shape=[1, 3])
    a.contents.fp32_contents.extend([1.0, 2.0, 3.0])
    b = req.inputs.add(name="b", datatype="INT8", shape=[1, 2])
    b.contents.int_contents.extend([5, 300])
    with pytest.raises(InputError, match="out of INT8's range -128 to 127"):
        parse_grpc_request(req, MODEL)
    b.contents.int_contents[1] = -7
    r = parse_grpc_request(req, MODEL)
    assert r.inputs["b"].tolist() == [[5, -7]]
    np.testing.assert_array_equal(r.inputs["a"], [[1.0, 2.0, 3.0]])


@contextlib.contextmanager
def grpc_gateway(tmp_path, policy: BatchingPolicy) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A real gRPC server over the 16-64-4 MLP on its own event loop thread."""
    metrics = Metrics()
    served = ServedModel(OnnxModel(write_mlp(tmp_path / "m.onnx"), "mlp"), policy, 1, metrics)
    app = SimpleNamespace(state=SimpleNamespace(models=by_model([served])))
    port = free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop: list[asyncio.Event] = []

    async def main() -> None:
        server = create_grpc_server(app, "127.0.0.1", port, 100, 64 * 1024 * 1024)
        await server.start()
        stop.append(asyncio.Event())
        started.set()
        await stop[0].wait()
        await server.stop(1)

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(10)
        assert not thread.is_alive()
        loop.close()


def test_a_message_past_the_limit_and_a_full_queue_are_refused_and_serving_goes_on(tmp_path):
    x = np.random.default_rng(1).normal(size=(2, 16)).astype(np.float32)
    policy = BatchingPolicy(max_batch_size=8, max_queue_size=1,
                            max_queue_delay_microseconds=200_000)
    with grpc_gateway(tmp_path, policy) as url:
        c = grpcclient.InferenceServerClient(url)
        inp = grpcclient.InferInput("x", [2, 16], "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_allclose(c.infer("mlp", [inp]).as_numpy("y"), mlp_reference(x),
                                   rtol=1e-5, atol=1e-5)
        # 5 MiB: past the 4 MiB floor, the MLP's largest valid request being far less
        big = grpcclient.InferInput("x", [8, 16], "FP32")
        big.set_data_from_numpy(np.ones((8, 16), np.float32))
        big._raw_content = b"\0" * (5 * 1024 * 1024)
        with pytest.raises(InferenceServerException) as err:
            c.infer("mlp", [big])
        assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        # a queue of 1 and a 200 ms window: of 6 sent at once, some wait their turn,
        # the rest are refused as Triton refuses them
        results: list = []
        all_back = threading.Event()

        def back(result, error) -> None:  # type: ignore[no-untyped-def]
            results.append(error)
            if len(results) == 6:
                all_back.set()

        for _ in range(6):
            c.async_infer("mlp", [inp], back)
        assert all_back.wait(10), results
        codes = sorted(str(e.status()) if e is not None else "OK" for e in results)
        assert "StatusCode.UNAVAILABLE" in codes, codes
        assert "OK" in codes, codes
        assert all(e is None or "Exceeds maximum queue size" in e.message() for e in results)
        np.testing.assert_allclose(c.infer("mlp", [inp]).as_numpy("y"), mlp_reference(x),
                                   rtol=1e-5, atol=1e-5)
        c.close()
