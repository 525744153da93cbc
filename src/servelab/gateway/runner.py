"""An ONNX model run by ONNX Runtime: inputs and outputs from the model's own metadata,
requests concatenated along the batch dimension and split back after one run."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servelab.errors import InputError, StoreError, cut

# ONNX Runtime's type names -> (the v2 protocol's datatype, numpy dtype)
ORT_TYPES: dict[str, tuple[str, type]] = {
    "tensor(float)": ("FP32", np.float32),
    "tensor(double)": ("FP64", np.float64),
    "tensor(float16)": ("FP16", np.float16),
    "tensor(int64)": ("INT64", np.int64),
    "tensor(int32)": ("INT32", np.int32),
    "tensor(int16)": ("INT16", np.int16),
    "tensor(int8)": ("INT8", np.int8),
    "tensor(uint8)": ("UINT8", np.uint8),
    "tensor(uint16)": ("UINT16", np.uint16),
    "tensor(uint32)": ("UINT32", np.uint32),
    "tensor(uint64)": ("UINT64", np.uint64),
    "tensor(bool)": ("BOOL", np.bool_),
}
V2_DTYPES = {v2: np.dtype(dt) for v2, dt in ORT_TYPES.values()}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str  # the v2 protocol's name: FP32, INT64, ...
    shape: tuple[int, ...]  # -1 for a dimension of any size; the first is the batch

    @property
    def dtype(self) -> np.dtype:
        return V2_DTYPES[self.datatype]


@dataclass(frozen=True, slots=True)
class Timing:
    """One run's time, split as Triton reports it (compute input / infer / output)."""

    input_ns: int
    infer_ns: int
    output_ns: int


class OnnxModel:
    """One loaded .onnx file; `run` executes one batch of requests."""

    def __init__(self, path: str | Path, name: str, threads: int = 1) -> None:
        import onnxruntime as ort

        self.name = name
        self.path = str(path)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        try:
            self.session = ort.InferenceSession(self.path, sess_options=opts,
                                                providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types
            raise StoreError(f"model {name!r} = {cut(self.path)!r}: ONNX Runtime cannot load it "
                             f"({cut(str(exc), 200)}); fix: export a valid .onnx file") from None
        self.inputs = tuple(self._spec(a) for a in self.session.get_inputs())
        self.outputs = tuple(self._spec(a) for a in self.session.get_outputs())
        for t in (*self.inputs, *self.outputs):
            if not t.shape or t.shape[0] != -1:
                raise InputError(f"model {name!r} tensor {t.name!r}: shape {list(t.shape)} has no "
                                 "batch dimension; fix: export with a dynamic first axis")

    def _spec(self, arg: object) -> TensorSpec:
        kind = getattr(arg, "type", "")
        if kind not in ORT_TYPES:
            raise InputError(f"model {self.name!r} tensor {getattr(arg, 'name', '?')!r}: type "
                             f"{kind} is not served; fix: use numeric tensors")
        dims = tuple(d if isinstance(d, int) and d > 0 else -1
                     for d in getattr(arg, "shape", []))
        return TensorSpec(str(getattr(arg, "name", "")), ORT_TYPES[kind][0], dims)

    def run(self, requests: list[dict[str, np.ndarray]]) -> tuple[list[dict[str, np.ndarray]],
                                                                   Timing]:
        """One batch: each request's inputs (batch dimension first), concatenated."""
        t0 = time.perf_counter_ns()
        rows = [next(iter(r.values())).shape[0] for r in requests]
        feed = {t.name: (requests[0][t.name] if len(requests) == 1 else
                         np.concatenate([r[t.name] for r in requests], axis=0))
                for t in self.inputs}
        t1 = time.perf_counter_ns()
        outs = self.session.run([t.name for t in self.outputs], feed)
        t2 = time.perf_counter_ns()
        result: list[dict[str, np.ndarray]] = []
        at = 0
        for n in rows:
            result.append({t.name: np.asarray(o[at:at + n])
                           for t, o in zip(self.outputs, outs, strict=True)})
            at += n
        t3 = time.perf_counter_ns()
        return result, Timing(t1 - t0, t2 - t1, t3 - t2)
