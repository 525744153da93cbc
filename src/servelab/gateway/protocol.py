"""The Open Inference Protocol v2 (KServe v2) request and response bodies, as Triton
speaks them over HTTP: JSON tensors, and the binary tensor data extension
(``Inference-Header-Content-Length``, ``binary_data_size``, ``binary_data_output``)."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from servelab.errors import InputError, cut
from servelab.gateway.runner import V2_DTYPES, TensorSpec

MAX_ELEMENTS = 16 * 1024 * 1024  # per input tensor
MAX_BODY_BYTES = 64 * 1024 * 1024  # a model whose shapes do not bound its requests
# The largest valid request of a model, in bytes: JSON text per element (a float64's
# repr is at most 24 characters, plus a separator and room for indentation) and the
# request's JSON header (names, shape, parameters) beside the data.
JSON_BYTES_PER_ELEMENT = 64
HEADER_BYTES = 64 * 1024
MAX_NESTING = 32
# JSON value types each datatype takes, as Triton's parser does (rapidjson's IsBool,
# IsInt64/IsUint64, IsNumber): no strings, no booleans for numbers, no fractions for
# integers, no NaN or Infinity (not JSON).
_INT_TYPES = frozenset({int})
_FLOAT_TYPES = frozenset({int, float})
_BOOL_TYPES = frozenset({bool})


@dataclass(frozen=True, slots=True)
class InferRequest:
    id: str | None
    inputs: dict[str, np.ndarray]
    # (name, binary, classes) asked for, () meaning all; classes > 0: Triton's
    # classification extension, the top `classes` as "score:index" strings
    outputs: tuple[tuple[str, bool, int], ...]
    binary_default: bool  # parameters.binary_data_output
    rows: int


def _bad(msg: str) -> InputError:
    return InputError(msg)


def max_request_bytes(inputs: tuple[TensorSpec, ...], max_batch_size: int) -> int:
    """The largest body a valid request to this model can have (JSON or binary tensors,
    pretty-printed JSON included); MAX_BODY_BYTES where a dimension of any size leaves
    it unbounded. The gateway refuses a longer body from its Content-Length."""
    elements = 0
    for t in inputs:
        row = t.shape[1:]
        if any(d < 0 for d in row):
            return MAX_BODY_BYTES
        elements += math.prod(row)
    return min(MAX_BODY_BYTES,
               HEADER_BYTES + max(1, max_batch_size) * elements * JSON_BYTES_PER_ELEMENT)


def _refuse_constant(name: str) -> Any:
    raise ValueError(name)


def _flatten(data: Any, name: str) -> list[Any]:
    """A flat list of a JSON tensor's values, nested lists (row-major) allowed."""
    if not isinstance(data, list):
        raise _bad(f"input {name!r}: data must be a list of values, got "
                   f"{type(data).__name__}")
    flat: list[Any] = []
    stack = [(data, 0)]
    while stack:
        items, depth = stack.pop()
        if depth > MAX_NESTING:
            raise _bad(f"input {name!r}: data nested deeper than {MAX_NESTING} lists")
        if list in set(map(type, items)):  # nested, as Triton takes it: row-major
            stack.extend((v, depth + 1) if type(v) is list else ([v], depth + 1)
                         for v in reversed(items))
        else:
            flat.extend(items)
    return flat


def _json_tensor(data: Any, name: str, spec: TensorSpec, count: int) -> np.ndarray:
    """JSON tensor data as Triton takes it: each value of the datatype's JSON type, in
    the datatype's range; anything else is refused, never converted."""
    flat = _flatten(data, name)
    if len(flat) != count:
        raise _bad(f"input {name!r}: {len(flat)} values for shape of {count} elements")
    kind = spec.dtype.kind
    allowed = _BOOL_TYPES if kind == "b" else _FLOAT_TYPES if kind == "f" else _INT_TYPES
    bad = set(map(type, flat)) - allowed
    if bad:
        first = next(v for v in flat if type(v) not in allowed)
        want = {"b": "true/false", "f": "numbers"}.get(kind, "whole numbers")
        raise _bad(f"input {name!r}: value {cut(json.dumps(first), 30)} is not valid "
                   f"{spec.datatype} data; expected {want}, as JSON values (no strings"
                   + ("" if kind == "b" else ", no true/false")
                   + (", no fractions" if kind in "iu" else "") + ")")
    if kind == "f":  # as float64 (exact for JSON's numbers), then held to the range
        try:
            wide = np.asarray(flat, dtype=np.float64)
        except OverflowError:  # an integer past float64's range
            raise _out_of_range(name, spec) from None
        if not (np.abs(wide) < _rounds_to_inf(spec.dtype)).all():  # NaN fails too
            raise _out_of_range(name, spec)
        return wide if spec.dtype == np.float64 else wide.astype(spec.dtype)
    try:
        with np.errstate(over="raise", invalid="raise"):
            return np.asarray(flat, dtype=spec.dtype)
    except (OverflowError, FloatingPointError):
        raise _out_of_range(name, spec) from None


def _out_of_range(name: str, spec: TensorSpec) -> InputError:
    info = np.finfo(spec.dtype) if spec.dtype.kind == "f" else np.iinfo(spec.dtype)
    return _bad(f"input {name!r}: a value is out of {spec.datatype}'s range "
                f"{info.min:.6g} to {info.max:.6g}")


@functools.cache
def _rounds_to_inf(dtype: np.dtype) -> float:
    """The least magnitude a float64 rounds to infinity at in `dtype`: half a unit in
    the last place above its largest finite value (round half to even goes up there,
    the largest value's last bit being 1)."""
    info = np.finfo(dtype)
    if dtype == np.float64:
        return math.inf
    return float(info.max) + 2.0 ** (info.maxexp - info.nmant - 2)


def check_input(name: Any, datatype: Any, shape: Any, specs: dict[str, TensorSpec],
                model: str) -> tuple[TensorSpec, int]:
    """One input's name, datatype and shape held to the model's: its spec and element
    count (the same checks for a JSON body and a gRPC message)."""
    if name not in specs:
        raise _bad(f"unexpected inference input {cut(str(name), 60)!r} for model "
                   f"{model!r}; expected {', '.join(sorted(specs))}")
    spec = specs[name]
    if datatype != spec.datatype:
        raise _bad(f"input {name!r}: datatype {cut(str(datatype), 20)!r}, "
                   f"expected {spec.datatype}")
    if not isinstance(shape, list) or not shape:
        raise _bad(f"input {name!r}: shape must be a list of whole numbers")
    for d in shape:
        if type(d) is not int or d < 0:
            raise _bad(f"input {name!r}: shape must be a list of whole numbers")
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        raise _bad(f"input {name!r}: {count:,} elements; expected at most {MAX_ELEMENTS:,}")
    if len(shape) != len(spec.shape) or any(
            want not in (-1, got) for want, got in zip(spec.shape[1:], shape[1:],
                                                       strict=True)):
        raise _bad(f"input {name!r}: shape {shape} does not match the model's "
                   f"{list(spec.shape)}")
    return spec, count


def batch_rows(arrays: dict[str, np.ndarray], specs: dict[str, TensorSpec], model: str,
               max_batch_size: int) -> int:
    """The request's rows: every input given, one batch dimension, 1 to max_batch_size."""
    missing = sorted(set(specs) - set(arrays))
    if missing:
        raise _bad(f"model {model!r}: missing input(s) {', '.join(missing)}")
    rows = {a.shape[0] for a in arrays.values()}
    if len(rows) != 1:
        raise _bad("request: every input needs the same batch dimension")
    n_rows = int(rows.pop())
    if not 1 <= n_rows <= max_batch_size:
        raise _bad(f"inference request batch-size must be <= {max_batch_size} for "
                   f"{model!r}, got {n_rows}")
    return n_rows


def parse_request(body: bytes, header_length: str | None, model: str,
                  inputs: tuple[TensorSpec, ...], max_batch_size: int) -> InferRequest:
    """A request body to validated input arrays, one batch dimension for all inputs."""
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise _bad(f"Inference-Header-Content-Length = {cut(header_length)!r}: expected "
                       "a whole number of bytes") from None
        if not 0 < n <= len(body):
            raise _bad(f"Inference-Header-Content-Length = {n}: expected 1 to the body's "
                       f"{len(body)} bytes")
        head, binary = body[:n], body[n:]
    else:
        head, binary = body, b""
    try:
        doc = json.loads(head, parse_constant=_refuse_constant)
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise _bad("request: not valid JSON; fix: send {\"inputs\": [...]} as the v2 "
                   "protocol describes") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise _bad("request: expected an object with an \"inputs\" list")
    specs = {t.name: t for t in inputs}
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for item in doc["inputs"]:
        if not isinstance(item, dict):
            raise _bad("request inputs: each input must be an object")
        name = item.get("name")
        shape = item.get("shape")
        spec, count = check_input(name, item.get("datatype"), shape, specs, model)
        name = spec.name
        dtype = V2_DTYPES[spec.datatype]
        tparams = item.get("parameters") or {}
        size = tparams.get("binary_data_size") if isinstance(tparams, dict) else None
        if size is not None:
            if type(size) is not int or size != count * dtype.itemsize or (
                    offset + size > len(binary)):
                raise _bad(f"input {name!r}: binary_data_size {cut(str(size), 20)} does not "
                           f"match {count} x {dtype.itemsize} bytes in the body")
            arr = np.frombuffer(binary, dtype=dtype, count=count, offset=offset)
            offset += size
        else:
            data = item.get("data")
            if data is None:
                raise _bad(f"input {name!r}: no data and no binary_data_size")
            arr = _json_tensor(data, name, spec, count)
        arrays[name] = arr.reshape(shape)
    if offset != len(binary):
        raise _bad(f"request: {len(binary) - offset} bytes of binary data no input claims")
    n_rows = batch_rows(arrays, specs, model, max_batch_size)
    raw_params = doc.get("parameters")
    params: dict[str, Any] = raw_params if isinstance(raw_params, dict) else {}
    outs = []
    for o in doc.get("outputs") or []:
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise _bad("request outputs: each output needs a name")
        p = o.get("parameters") or {}
        if not isinstance(p, dict):
            p = {}
        k = p.get("classification", 0)
        if type(k) is not int or not 0 <= k <= MAX_CLASSES:
            raise _bad(f"output {cut(o['name'], 60)!r}: parameters.classification = "
                       f"{cut(repr(k), 20)}: expected a whole number 0 to {MAX_CLASSES}; fix: "
                       "ask for the top k classes with k >= 1 (0: the raw output)")
        outs.append((o["name"], bool(p.get("binary_data")), k))
    rid = doc.get("id")
    return InferRequest(str(rid) if rid is not None else None, arrays, tuple(outs),
                        bool(params.get("binary_data_output")), n_rows)


MAX_CLASSES = 1 << 20  # a classification's top k, at most


def top_classes(name: str, arr: np.ndarray, k: int, labels: tuple[str, ...] = ()
                ) -> np.ndarray:
    """Triton's classification extension: per row of a [batch, classes] output, the top
    k (at most the classes there are) as "score:index" byte strings, highest first, the
    score printed as C's %f (Triton's std::to_string); "score:index:label" where the
    output's label file has a non-empty line for that index."""
    if arr.ndim != 2:
        raise _bad(f"output {cut(name, 60)!r}: classification needs an output of shape "
                   f"[batch, classes], this one is {list(arr.shape)}; fix: ask for it "
                   "without parameters.classification")
    k = min(k, arr.shape[1])
    order = np.argsort(-arr.astype(np.float64), axis=1, kind="stable")[:, :k]
    tags = [f":{labels[i]}" if i < len(labels) and labels[i] else ""
            for i in range(arr.shape[1])]
    return np.array([[f"{float(row[i]):f}:{i}{tags[i]}".encode() for i in idx]
                     for row, idx in zip(arr, order, strict=True)], dtype=object
                    ).reshape(arr.shape[0], k)


@dataclass(frozen=True, slots=True)
class OutputTensor:
    """One output as asked for: a classification's top k as BYTES (an object array of
    byte strings), or the model's values."""

    name: str
    datatype: str
    values: np.ndarray
    binary: bool

    def raw(self) -> bytes:
        """The tensor as binary data: BYTES elements each after its 4-byte little-endian
        length, as Triton sends them; numbers in the datatype's dtype."""
        if self.datatype == "BYTES":
            return b"".join(len(s).to_bytes(4, "little") + s for s in self.values.reshape(-1))
        return self.values.astype(V2_DTYPES[self.datatype], copy=False).tobytes()


def requested_outputs(model: str, req: InferRequest, outputs: tuple[TensorSpec, ...],
                      values: dict[str, np.ndarray],
                      labels: dict[str, tuple[str, ...]] | None = None
                      ) -> list[OutputTensor]:
    """The outputs a request asked for (all, if it named none), in its order; an output
    the model lacks is the request's error."""
    wanted = req.outputs or tuple((t.name, req.binary_default, 0) for t in outputs)
    known = {t.name: t for t in outputs}
    out = []
    for name, binary, classes in wanted:
        if name not in known:
            raise _bad(f"unexpected inference output {cut(name, 60)!r} for model {model!r}")
        arr = np.ascontiguousarray(values[name])
        if classes:
            top = top_classes(name, arr, classes, (labels or {}).get(name, ()))
            out.append(OutputTensor(name, "BYTES", top, binary))
        else:
            out.append(OutputTensor(name, known[name].datatype, arr, binary))
    return out


def build_response(model: str, version: str, req: InferRequest,
                   outputs: tuple[TensorSpec, ...], values: dict[str, np.ndarray],
                   labels: dict[str, tuple[str, ...]] | None = None
                   ) -> tuple[bytes, int | None]:
    """The response body and, when any tensor is binary, its JSON header's length."""
    out_json: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for o in requested_outputs(model, req, outputs, values, labels):
        item: dict[str, Any] = {"name": o.name, "datatype": o.datatype,
                                "shape": list(o.values.shape)}
        if o.binary:
            raw = o.raw()
            item["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        elif o.datatype == "BYTES":
            item["data"] = [s.decode() for s in o.values.reshape(-1)]
        else:
            item["data"] = o.values.reshape(-1).tolist()
        out_json.append(item)
    doc: dict[str, Any] = {"model_name": model, "model_version": version,
                           "outputs": out_json}
    if req.id is not None:
        doc["id"] = req.id
    head = json.dumps(doc).encode()
    if not blobs:
        return head, None
    return head + b"".join(blobs), len(head)
