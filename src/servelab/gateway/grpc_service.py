"""The gateway's gRPC side: the KServe v2 gRPC service as Triton serves it
(`inference.GRPCInferenceService`, Triton's grpc_service.proto, whose generated
messages and servicer come with tritonclient), so `tritonclient.grpc` works unchanged.

It runs on the HTTP side's event loop and answers through the same models, batchers,
statistics and metrics (`app.run_request`): a request sent over gRPC is counted as one
sent over HTTP is. Health, server and model metadata, model config, statistics, the
repository index, infer and stream infer are served; load and unload answer
UNAVAILABLE as Triton's default model control mode does; shared memory, trace and log
settings are not offered (UNIMPLEMENTED, the service's default answer), as the HTTP
side does not advertise them either.

Safe as the HTTP side is: it binds where --host says (loopback by default); a message
longer than the largest valid request of the served models is refused by gRPC itself
(RESOURCE_EXHAUSTED) before it is handed over; at most --max-connections calls run at
once (RESOURCE_EXHAUSTED beyond); requests held in flight are bounded in bytes as HTTP
bodies are (UNAVAILABLE beyond); a stream holds at most STREAM_INFLIGHT requests at a
time. A browser cannot speak gRPC to it (a cross-origin application/grpc POST needs a
preflight the server never grants), so the Host check has no gRPC twin."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from servelab.errors import InputError, cut
from servelab.gateway.app import (
    EXTENSIONS,
    MODEL_CONTROL_REFUSED,
    Failure,
    ModelVersions,
    ServedModel,
    every_version,
    run_request,
    unknown_model,
    unknown_version,
)
from servelab.gateway.protocol import (
    MAX_CLASSES,
    InferRequest,
    batch_rows,
    check_input,
    requested_outputs,
)

STREAM_INFLIGHT = 256  # requests of one stream being answered at once
GRPC_MESSAGE_FLOOR = 4 * 1024 * 1024  # gRPC's own default limit, the least allowed
# The typed `contents` field each datatype is sent in (FP16 and BF16 go raw only).
CONTENTS_FIELD = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
                  "INT32": "int_contents", "INT64": "int64_contents",
                  "UINT8": "uint_contents", "UINT16": "uint_contents",
                  "UINT32": "uint_contents", "UINT64": "uint64_contents",
                  "FP32": "fp32_contents", "FP64": "fp64_contents"}


def _code(status: int) -> grpc.StatusCode:
    """The gRPC status Triton gives for what its HTTP side answers with `status`."""
    return {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
            413: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE
            }.get(status, grpc.StatusCode.INTERNAL)


class GrpcError(Exception):
    """An answer other than OK: the HTTP status it stands for and the message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _contents(t: Any, spec_datatype: str, dtype: np.dtype, count: int) -> np.ndarray:
    """A tensor sent in its typed `contents` field: exactly `count` values, each in the
    datatype's range (refused, never wrapped, as the JSON side refuses)."""
    field = CONTENTS_FIELD.get(spec_datatype)
    if field is None:
        raise InputError(f"input {t.name!r}: {spec_datatype} data goes in "
                         "raw_input_contents only; fix: send the tensor raw")
    values = getattr(t.contents, field)
    if len(values) != count:
        raise InputError(f"input {t.name!r}: {len(values)} values in contents.{field} for "
                         f"shape of {count} elements")
    kind = dtype.kind
    src = np.asarray(values, dtype=np.float64 if kind == "f" else
                     bool if kind == "b" else np.int64 if field.startswith("int")
                     else np.uint64)
    if kind in "iu":
        info = np.iinfo(dtype)
        if count and (int(src.min()) < info.min or int(src.max()) > info.max):
            raise InputError(f"input {t.name!r}: a value is out of {spec_datatype}'s range "
                             f"{info.min} to {info.max}")
    return src.astype(dtype, copy=False)


def parse_grpc_request(msg: Any, sm: ServedModel) -> InferRequest:
    """A ModelInferRequest to validated input arrays, with the HTTP side's checks: names,
    datatypes and shapes as the model declares them, one batch dimension of 1 to
    max_batch_size rows; data raw (`raw_input_contents`, one entry per input, as Triton
    requires when it is used) or typed (`contents`)."""
    model = sm.model.name
    specs = {t.name: t for t in sm.inputs}
    raw = msg.raw_input_contents
    if raw and len(raw) != len(msg.inputs):
        raise InputError(f"request: {len(raw)} raw_input_contents for {len(msg.inputs)} "
                         "inputs; expected one per input when any is sent raw")
    arrays: dict[str, np.ndarray] = {}
    for i, t in enumerate(msg.inputs):
        shape = [int(d) for d in t.shape]
        spec, count = check_input(t.name, t.datatype, shape, specs, model)
        if spec.name in arrays:
            raise InputError(f"input {spec.name!r}: given twice")
        dtype = spec.dtype
        if raw:
            if t.HasField("contents"):
                raise InputError(f"input {spec.name!r}: both contents and "
                                 "raw_input_contents; fix: send one")
            if len(raw[i]) != count * dtype.itemsize:
                raise InputError(f"input {spec.name!r}: {len(raw[i])} raw bytes for "
                                 f"{count} x {dtype.itemsize}")
            arr = np.frombuffer(raw[i], dtype=dtype, count=count)
        else:
            arr = _contents(t, spec.datatype, dtype, count)
        arrays[spec.name] = arr.reshape(shape)
    rows = batch_rows(arrays, specs, model, sm.policy.max_batch_size)
    outs = []
    for o in msg.outputs:
        p = o.parameters.get("classification")
        k = 0
        if p is not None:
            k = p.int64_param if p.WhichOneof("parameter_choice") == "int64_param" else -1
            if not 0 <= k <= MAX_CLASSES:
                raise InputError(f"output {cut(o.name, 60)!r}: parameters.classification: "
                                 f"expected a whole number 0 to {MAX_CLASSES}; fix: ask for "
                                 "the top k classes with k >= 1 (0: the raw output)")
        outs.append((o.name, True, k))
    return InferRequest(msg.id or None, arrays, tuple(outs), True, rows)


def build_grpc_response(sm: ServedModel, req: InferRequest, values: dict[str, np.ndarray]
                        ) -> Any:
    """The ModelInferResponse: every output raw in raw_output_contents, as Triton sends
    them; a classification as BYTES ("score:index[:label]" strings, each after its
    4-byte little-endian length)."""
    resp = service_pb2.ModelInferResponse(model_name=sm.model.name, model_version=sm.version,
                                          id=req.id or "")
    for o in requested_outputs(sm.model.name, req, sm.model.outputs, values, sm.class_labels):
        resp.outputs.add(name=o.name, datatype=o.datatype, shape=list(o.values.shape))
        resp.raw_output_contents.append(o.raw())
    return resp


def _answers(method: Callable[..., Any]) -> Callable[..., Any]:
    """A unary method whose GrpcError becomes the call's status and message."""
    @functools.wraps(method)
    async def call(self: Any, request: Any, context: Any) -> Any:
        try:
            return await method(self, request, context)
        except GrpcError as exc:
            await context.abort(_code(exc.status), exc.message)

    return call


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """The servicer: each method as Triton's gRPC front end answers it; the ones the
    gateway does not offer answer UNIMPLEMENTED."""

    def __init__(self, app: Any, max_inflight_bytes: int) -> None:
        self.models: dict[str, ModelVersions] = app.state.models
        self.max_inflight_bytes = max_inflight_bytes
        self.inflight_bytes = 0

    # -- lookups -----------------------------------------------------------------------
    def _model(self, name: str, version: str = "") -> ServedModel:
        mv = self.models.get(name)
        if mv is None:
            raise GrpcError(404, unknown_model(name))
        sm = mv.get(version)
        if sm is None:
            raise GrpcError(404, unknown_version(name, version))
        return sm

    # -- health and metadata -----------------------------------------------------------
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=bool(self.models))

    async def ModelReady(self, request: Any, context: Any) -> Any:
        mv = self.models.get(request.name)
        ready = mv is not None and mv.get(request.version) is not None
        return service_pb2.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerMetadataResponse(
            name="servelab", version="0.1.0",
            extensions=list(EXTENSIONS))

    @_answers
    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        sm = self._model(request.name, request.version)
        # every version it serves, or the one asked for, as Triton lists them
        versions = [request.version] if request.version else self.models[request.name].versions
        return json_format.ParseDict(sm.metadata_json(versions),
                                     service_pb2.ModelMetadataResponse())

    @_answers
    async def ModelConfig(self, request: Any, context: Any) -> Any:
        sm = self._model(request.name, request.version)
        config = json_format.ParseDict(sm.config_json(), model_config_pb2.ModelConfig())
        return service_pb2.ModelConfigResponse(config=config)

    @_answers
    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        if request.name:
            mv = self.models.get(request.name)
            if mv is None:
                raise GrpcError(400, f"requested model '{cut(request.name, 80)}' is not "
                                     "available")
            sm = mv.get(request.version)
            if sm is None:
                raise GrpcError(400, "requested model version is not available for model "
                                     f"'{cut(request.name, 80)}'")
            chosen = [sm] if request.version else list(mv.by_version.values())
        else:
            chosen = every_version(self.models)
        return json_format.ParseDict({"model_stats": [m.stats_json() for m in chosen]},
                                     service_pb2.ModelStatisticsResponse())

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        r = service_pb2.RepositoryIndexResponse()
        for n, mv in self.models.items():
            for v in mv.versions:
                r.models.add(name=n, version=v, state="READY")
        return r

    # -- inference ---------------------------------------------------------------------
    async def _infer(self, msg: Any) -> Any:
        """One ModelInferRequest to its response, or GrpcError."""
        sm = self._model(msg.model_name, msg.model_version)
        t0 = time.monotonic_ns()
        size = sum(map(len, msg.raw_input_contents))
        if self.inflight_bytes + size > self.max_inflight_bytes:
            raise GrpcError(503, "the gateway holds too many request bytes now; fix: try "
                                 "again shortly")
        self.inflight_bytes += size
        try:
            try:
                req = parse_grpc_request(msg, sm)
            except InputError as exc:  # refused before the model: no failure counted
                raise GrpcError(400, str(exc)) from None
            out = await run_request(sm, req, t0,
                                    lambda values: build_grpc_response(sm, req, values))
        finally:
            self.inflight_bytes -= size
        if isinstance(out, Failure):
            raise GrpcError(out.status, out.message)
        return out

    @_answers
    async def ModelInfer(self, request: Any, context: Any) -> Any:
        return await self._infer(request)

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[Any], context: Any
                               ) -> AsyncIterator[Any]:
        """Each request answered as it completes (a failure as an error_message in the
        stream, which stays open, as Triton's does); at most STREAM_INFLIGHT of the
        stream's requests are in flight: reading waits for room."""
        done: asyncio.Queue[Any] = asyncio.Queue()
        room = asyncio.Semaphore(STREAM_INFLIGHT)
        tasks: set[asyncio.Task[None]] = set()

        async def one(msg: Any) -> None:
            try:
                resp = await self._infer(msg)
                await done.put(service_pb2.ModelStreamInferResponse(infer_response=resp))
            except GrpcError as exc:
                await done.put(service_pb2.ModelStreamInferResponse(
                    error_message=exc.message,
                    infer_response=service_pb2.ModelInferResponse(
                        model_name=msg.model_name, model_version=msg.model_version,
                        id=msg.id)))
            finally:
                room.release()

        async def read() -> None:
            async for msg in request_iterator:
                await room.acquire()
                task = asyncio.ensure_future(one(msg))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:  # the client closed its side: answer what it sent
                await asyncio.gather(*list(tasks))
            await done.put(None)

        reader = asyncio.ensure_future(read())
        try:
            while (item := await done.get()) is not None:
                yield item
        finally:
            reader.cancel()
            for task in list(tasks):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader


async def _not_offered(self: Any, request: Any, context: Any) -> Any:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, "servelab's gateway does not offer "
                        "this (shared memory, trace and log settings)")


async def _no_model_control(self: Any, request: Any, context: Any) -> Any:
    await context.abort(grpc.StatusCode.UNAVAILABLE, MODEL_CONTROL_REFUSED)


for _name in ("SystemSharedMemoryStatus", "SystemSharedMemoryRegister",
              "SystemSharedMemoryUnregister", "CudaSharedMemoryStatus",
              "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister", "TraceSetting",
              "LogSettings"):
    setattr(InferenceService, _name, _not_offered)
for _name in ("RepositoryModelLoad", "RepositoryModelUnload"):  # as Triton's default mode
    setattr(InferenceService, _name, _no_model_control)


def message_limit(models: dict[str, ModelVersions]) -> int:
    """The largest message the server takes: the largest valid request of any served
    model (raw tensors, or typed contents at up to 10 bytes a value), at least gRPC's
    own 4 MiB default."""
    return max([GRPC_MESSAGE_FLOOR, *(m.max_request_bytes for m in models.values())])


def create_grpc_server(app: Any, host: str, port: int, max_concurrent_rpcs: int,
                       max_inflight_bytes: int) -> Any:
    """The gRPC server over the gateway's models, bound, not started (start it on the
    HTTP side's event loop: the batchers answer on that loop)."""
    limit = message_limit(app.state.models)
    server = grpc.aio.server(
        maximum_concurrent_rpcs=max_concurrent_rpcs,
        options=[("grpc.max_receive_message_length", limit),
                 ("grpc.max_send_message_length", -1),
                 ("grpc.so_reuseport", 0)])
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
        InferenceService(app, max_inflight_bytes), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise InputError(f"--grpc-port = {port}: cannot listen on {host}:{port}; fix: "
                         "another port")
    return server
