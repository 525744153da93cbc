"""`servelab serve` as a process, called with NVIDIA's own client (tritonclient.http and
.aio, unchanged): metadata, JSON and binary tensors, Triton's 503s, statistics and
metrics that add up, and a SIGTERM under load that loses no accepted request."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from servelab.batching.service import read_perf_analyzer_csv
from servelab.gateway.demo import mlp_reference, write_mlp
from tests.browser_support import free_port
from tests.services import server_process

httpclient = pytest.importorskip("tritonclient.http")
aioclient = pytest.importorskip("tritonclient.http.aio")
from tritonclient.utils import InferenceServerException  # noqa: E402

BIG = {"inputs": 512, "hidden": 4096, "outputs": 8}  # a few ms a batch on this CPU


@contextlib.contextmanager
def gateway(tmp_path: Path, *args: str, model: dict[str, int] | None = None,
            models: tuple[str, ...] | None = None
            ) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    if models is None:
        models = ("--model", f"mlp={write_mlp(tmp_path / 'm.onnx', **(model or {}))}")
    port = free_port()
    url = f"127.0.0.1:{port}"
    with server_process([sys.executable, "-m", "servelab", "serve", *models, "--port",
                         str(port), *args], f"http://{url}/v2/health/ready") as proc:
        yield proc, url


def request(x: np.ndarray, binary: bool) -> tuple[list, list]:  # type: ignore[type-arg]
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    return [inp], [httpclient.InferRequestedOutput("y", binary_data=binary)]


def test_metadata_config_index_and_inference_json_and_binary(tmp_path):
    with gateway(tmp_path, "--max-batch-size", "8", "--max-queue-delay-us", "500") as (_, url):
        c = httpclient.InferenceServerClient(url)
        assert c.is_server_live()
        assert c.is_server_ready()
        assert c.is_model_ready("mlp")
        meta = c.get_model_metadata("mlp")
        assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}]
        assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]
        cfg = c.get_model_config("mlp")
        assert cfg["max_batch_size"] == 8
        assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 500
        assert c.get_model_repository_index() == [
            {"name": "mlp", "version": "1", "state": "READY"}]
        x = np.random.default_rng(1).normal(size=(3, 16)).astype(np.float32)
        for binary in (False, True):
            inputs, outputs = request(x, binary)
            res = c.infer("mlp", inputs, outputs=outputs)
            np.testing.assert_allclose(res.as_numpy("y"), mlp_reference(x), rtol=1e-5,
                                       atol=1e-5)
        # No outputs asked: tritonclient asks for binary ones; still the same numbers.
        inp = httpclient.InferInput("x", [1, 16], "FP32")
        inp.set_data_from_numpy(x[:1])
        np.testing.assert_allclose(c.infer("mlp", [inp]).as_numpy("y"), mlp_reference(x[:1]),
                                   rtol=1e-5, atol=1e-5)
        with pytest.raises(InferenceServerException, match="unknown model"):
            c.get_model_metadata("nope")
        bad = httpclient.InferInput("x", [1, 3], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 3), np.float32))
        with pytest.raises(InferenceServerException, match="does not match"):
            c.infer("mlp", [bad])
        c.close()


def test_aio_client_concurrent_requests_batch_and_stats_add_up(tmp_path):
    with gateway(tmp_path, "--max-batch-size", "16", "--max-queue-delay-us", "2000") as (
            _, url):
        xs = np.random.default_rng(2).normal(size=(64, 1, 16)).astype(np.float32)

        async def run() -> list[np.ndarray]:
            c = aioclient.InferenceServerClient(url)
            try:
                outs = []
                for k in range(0, 64, 16):  # four waves of 16 concurrent requests
                    reqs = []
                    for x in xs[k:k + 16]:
                        inp = aioclient.InferInput("x", [1, 16], "FP32")
                        inp.set_data_from_numpy(x, binary_data=True)
                        reqs.append(c.infer("mlp", [inp]))
                    outs += [r.as_numpy("y") for r in await asyncio.gather(*reqs)]
                return outs
            finally:
                await c.close()

        outs = asyncio.run(run())
        for x, y in zip(xs, outs, strict=True):
            np.testing.assert_allclose(y, mlp_reference(x), rtol=1e-5, atol=1e-5)
        c = httpclient.InferenceServerClient(url)
        st = c.get_inference_statistics("mlp")["model_stats"][0]
        inf = st["inference_stats"]
        assert inf["success"]["count"] == 64
        assert inf["fail"]["count"] == 0
        assert st["inference_count"] == 64
        assert st["execution_count"] < 64  # concurrent requests were batched
        assert sum(b["compute_infer"]["count"] * b["batch_size"] for b in st["batch_stats"]) == 64
        text = httpx.get(f"http://{url}/metrics").text

        def metric(name: str, extra: str = "") -> float:
            m = re.search(rf'^{name}\{{model="mlp",{extra}version="1"\}} (\S+)$', text, re.M)
            assert m is not None, name
            return float(m.group(1))

        assert metric("nv_inference_request_success") == 64
        assert metric("nv_inference_count") == 64
        assert metric("nv_inference_exec_count") == st["execution_count"]
        assert metric("servelab_request_duration_seconds_count") == 64
        c.close()


def test_full_queue_and_timeouts_are_triton_503s(tmp_path):
    # One instance, max_batch_size 1, a queue of 1: a burst overflows it.
    with gateway(tmp_path, "--max-batch-size", "1", "--max-queue-size", "1",
                 "--max-queue-delay-us", "0", model=BIG) as (_, url):
        async def burst() -> list[object]:
            c = aioclient.InferenceServerClient(url)
            try:
                x = np.zeros((1, 512), np.float32)
                reqs = []
                for _ in range(40):
                    inp = aioclient.InferInput("x", [1, 512], "FP32")
                    inp.set_data_from_numpy(x, binary_data=True)
                    reqs.append(c.infer("mlp", [inp]))
                return await asyncio.gather(*reqs, return_exceptions=True)
            finally:
                await c.close()

        results = asyncio.run(burst())
        errors = [r for r in results if isinstance(r, Exception)]
        assert errors, "a queue of 1 should overflow under a burst of 40"
        assert all("Exceeds maximum queue size" in str(e) for e in errors), errors[:3]
        c = httpclient.InferenceServerClient(url)
        st = c.get_inference_statistics("mlp")["model_stats"][0]["inference_stats"]
        assert st["success"]["count"] + st["fail"]["count"] == 40
        assert st["fail"]["count"] == len(errors)
        text = httpx.get(f"http://{url}/metrics").text
        assert re.search(r'nv_inference_request_failure\{model="mlp",reason="REJECTED",'
                         rf'version="1"\}} {len(errors)}\n', text), text[:2000]
        c.close()
    # A timeout shorter than the batch window: a lone request times out.
    with gateway(tmp_path, "--max-queue-delay-us", "20000", "--timeout-us", "2000") as (
            _, url):
        c = httpclient.InferenceServerClient(url)
        inputs, outputs = request(np.zeros((1, 16), np.float32), True)
        with pytest.raises(InferenceServerException, match="Request timeout expired"):
            c.infer("mlp", inputs, outputs=outputs)
        c.close()


def test_sigterm_under_load_loses_no_accepted_request(tmp_path):
    with gateway(tmp_path, "--max-batch-size", "8", "--max-queue-delay-us", "1000",
                 model=BIG) as (proc, url):
        async def load() -> list[object]:
            async with httpx.AsyncClient(timeout=60) as client:
                body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 512],
                                    "data": [0.5] * 512}]}

                async def one(i: int) -> object:
                    await asyncio.sleep(i * 0.002)
                    try:
                        return await client.post(f"http://{url}/v2/models/mlp/infer",
                                                 json=body)
                    except httpx.HTTPError as exc:
                        return exc

                async def stop() -> None:
                    await asyncio.sleep(0.15)
                    proc.send_signal(signal.SIGTERM)

                results = await asyncio.gather(*(one(i) for i in range(150)), stop())
                return list(results[:-1])

        results = asyncio.run(load())
        answered = [r for r in results if isinstance(r, httpx.Response)]
        refused = [r for r in results if not isinstance(r, httpx.Response)]
        assert answered, "some requests were accepted before SIGTERM"
        assert all(r.status_code == 200 for r in answered), [
            (r.status_code, r.text[:100]) for r in answered if r.status_code != 200][:3]
        assert all(isinstance(r, httpx.TransportError) for r in refused)
        # uvicorn re-raises the signal once it has drained, so the exit says "terminated".
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)


def test_a_triton_model_repository_is_served_with_its_config(tmp_path):
    d = tmp_path / "repo" / "fraud"
    (d / "1").mkdir(parents=True)
    write_mlp(d / "1" / "model.onnx")
    (d / "config.pbtxt").write_text(
        'name: "fraud" max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 2 ] '
        'max_queue_delay_microseconds: 700 default_queue_policy { max_queue_size: 9 } } '
        'instance_group [ { count: 2 kind: KIND_CPU } ]')
    with gateway(tmp_path, models=("--model-repository", str(tmp_path / "repo"))) as (_, url):
        c = httpclient.InferenceServerClient(url)
        cfg = c.get_model_config("fraud")
        assert cfg["max_batch_size"] == 4
        assert cfg["dynamic_batching"]["preferred_batch_size"] == [2]
        assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 700
        assert cfg["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 9
        assert cfg["instance_group"][0]["count"] == 2
        x = np.ones((1, 16), np.float32)
        inputs, outputs = request(x, True)
        np.testing.assert_allclose(c.infer("fraud", inputs, outputs=outputs).as_numpy("y"),
                                   mlp_reference(x), rtol=1e-5, atol=1e-5)
        c.close()


def test_batches_are_counted_in_rows_and_a_model_without_dynamic_batching_is_not_batched(
        tmp_path):
    """Measured on Triton 2.51 (issue 31): 16 concurrent 4-row requests with
    max_batch_size 32 run as batches of at most 32 rows; without `dynamic_batching`
    each request runs alone. The gateway had run 64-row batches and batched both."""
    for name, batching in (("rows", "dynamic_batching { max_queue_delay_microseconds: "
                                    "50000 }"), ("alone", "")):
        d = tmp_path / "repo" / name
        (d / "1").mkdir(parents=True)
        write_mlp(d / "1" / "model.onnx")
        (d / "config.pbtxt").write_text(f'name: "{name}" max_batch_size: 32 {batching}')
    x = np.random.default_rng(2).normal(size=(4, 16)).astype(np.float32)

    async def burst(url: str, model: str) -> None:
        c = aioclient.InferenceServerClient(url)
        inputs, outputs = request(x, True)
        try:
            results = await asyncio.gather(*[c.infer(model, inputs, outputs=outputs)
                                             for _ in range(16)])
        finally:
            await c.close()
        for r in results:
            np.testing.assert_allclose(r.as_numpy("y"), mlp_reference(x), rtol=1e-5,
                                       atol=1e-5)

    with gateway(tmp_path, models=("--model-repository", str(tmp_path / "repo"))) as (_, url):
        c = httpclient.InferenceServerClient(url)
        assert "dynamic_batching" not in c.get_model_config("alone")
        for model in ("rows", "alone"):
            asyncio.run(burst(url, model))
        stats = {s["name"]: s for s in c.get_inference_statistics()["model_stats"]}
        c.close()
    rows = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["rows"]["batch_stats"]}
    assert stats["rows"]["inference_count"] == 64
    assert max(rows) <= 32, rows
    assert sum(size * n for size, n in rows.items()) == 64
    alone = {b["batch_size"]: b["compute_infer"]["count"]
             for b in stats["alone"]["batch_stats"]}
    assert alone == {4: 16}, alone
    assert stats["alone"]["execution_count"] == 16


def test_servelab_load_measures_the_gateway(tmp_path):
    import csv
    import json

    with gateway(tmp_path, "--max-queue-delay-us", "1000") as (_, url):
        out = subprocess.run(
            [sys.executable, "-m", "servelab", "load", "--url", f"http://{url}", "--model",
             "mlp", "--rates", "100,200", "--num-requests", "300", "--json", "--csv",
             str(tmp_path / "pa.csv")], capture_output=True, text=True, timeout=120,
            check=False)
        assert out.returncode == 0, out.stderr
        rows = json.loads(out.stdout)
        assert [r["offered_per_s"] for r in rows] == [100.0, 200.0]
        for r in rows:
            assert r["requests"] == r["ok"] == 300
            assert r["errors"] == 0
            assert r["mean_batch"] >= 1.0
            assert r["p50_ms"] <= r["p99_ms"]
        c = httpclient.InferenceServerClient(url)
        st = c.get_inference_statistics("mlp")["model_stats"][0]
        assert st["inference_stats"]["success"]["count"] == 600
        c.close()
        with (tmp_path / "pa.csv").open() as fh:
            table = list(csv.DictReader(fh))
        assert [r["Request Rate"] for r in table] == ["100", "200"]
        assert all(int(r["p99 latency"]) >= int(r["p50 latency"]) > 0 for r in table)
        closed = subprocess.run(
            [sys.executable, "-m", "servelab", "load", "--url", f"http://{url}", "--model",
             "mlp", "--concurrency", "1,4", "--num-requests", "200", "--binary", "--json",
             "--csv", str(tmp_path / "pa-closed.csv")],
            capture_output=True, text=True, timeout=120, check=False)
        assert closed.returncode == 0, closed.stderr
        # Both modes' CSVs read back as a profile point (the lowest load's server compute).
        for name, first in (("pa.csv", "Request Rate"), ("pa-closed.csv", "Concurrency")):
            with (tmp_path / name).open() as fh:
                low = next(csv.DictReader(fh))
            compute_us = sum(int(low[c]) for c in ("Server Compute Input",
                                                   "Server Compute Infer",
                                                   "Server Compute Output"))
            assert low[first] in ("100", "1")
            assert read_perf_analyzer_csv(tmp_path / name) == pytest.approx(compute_us / 1e3)
        c1, c4 = json.loads(closed.stdout)
        assert (c1["concurrency"], c4["concurrency"]) == (1, 4)
        assert c1["ok"] == c4["ok"] == 200
        assert c1["mean_batch"] == pytest.approx(1.0)  # one client: nothing to batch with
        assert c4["mean_batch"] > 1.0  # four clients: their requests share batches
        bad = subprocess.run([sys.executable, "-m", "servelab", "load", "--url",
                              f"http://{url}", "--model", "nope", "--qps", "10"],
                             capture_output=True, text=True, timeout=60, check=False)
        assert bad.returncode == 1
        assert "the server answered 404" in bad.stderr


def test_the_gateways_trace_replays_to_the_rule(tmp_path):
    """`serve --trace-file` writes Triton's trace format (500 requests a file at most,
    or what has waited half a second, the rest at shutdown); `replay-trace` reads it,
    and given the gateway's own queue-entry times and batch times the simulator's rule
    makes the batches the gateway made (measured
    within 0.1-2.2% at 20-80% load once a late timer no longer let later arrivals into
    a closed batch; 5-6% before)."""
    import json

    trace = tmp_path / "trace.json"
    with gateway(tmp_path, "--max-queue-delay-us", "2000", "--trace-file", str(trace),
                 model=BIG) as (_, url):
        out = subprocess.run(
            [sys.executable, "-m", "servelab", "load", "--url", f"http://{url}", "--model",
             "mlp", "--qps", "300", "--num-requests", "1200", "--json"],
            capture_output=True, text=True, timeout=120, check=False)
        assert out.returncode == 0, out.stderr
        [row] = json.loads(out.stdout)
        assert row["ok"] == 1200
    files = sorted(tmp_path.glob("trace.json.*"), key=lambda p: int(p.suffix[1:]))
    sizes = [len(json.loads(f.read_text())) for f in files]
    assert sum(sizes) == 1200
    assert max(sizes) <= 500
    assert len(files) >= 4  # at 300/s, 500 requests take 1.7 s: written by the half second
    rep = subprocess.run([sys.executable, "-m", "servelab", "replay-trace", *map(str, files),
                          "--max-batch-size", "32", "--max-queue-delay-us", "2000", "--json"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert rep.returncode == 0, rep.stderr
    r = json.loads(rep.stdout)
    assert r["model"] == "mlp"
    assert r["requests"] == 1200
    assert r["measured"]["mean_batch"] == pytest.approx(row["mean_batch"], rel=1e-9)
    assert abs(r["rules"]["triton"]["error"]["mean_batch"]) < 0.10, r["rules"]["triton"]


def test_sigterm_exits_promptly_after_bodies_parsed_off_the_event_loop(tmp_path):
    """Large and compressed bodies are parsed on the gateway's parse thread. That thread
    once kept the process from exiting after SIGTERM (the exit joined it for ever)."""
    import gzip
    import json
    import time

    x = np.ones((2, 16), np.float32).ravel().tolist()
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 16], "data": x}]}
    big = json.dumps({**doc, "id": "p" * 300_000}).encode()  # over the inline parse size
    with gateway(tmp_path, "--max-batch-size", "16384") as (proc, url):
        for body, headers in ((big, {}), (gzip.compress(json.dumps(doc).encode()),
                                          {"Content-Encoding": "gzip"})):
            r = httpx.post(f"http://{url}/v2/models/mlp/infer", content=body, headers=headers,
                           timeout=30)
            assert r.status_code == 200, r.text
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) in (0, -signal.SIGTERM)
        assert time.monotonic() - t0 < 10
