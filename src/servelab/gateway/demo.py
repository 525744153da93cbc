"""A small ONNX model built in code (no hub, no download): a two-layer MLP, for a
newcomer's first `servelab serve --demo`, the tests and the benchmark."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_mlp(path: str | Path, *, inputs: int = 16, hidden: int = 64, outputs: int = 4,
              seed: int = 0) -> Path:
    """y = relu(x W1 + b1) W2 + b2 with random weights, FP32, a dynamic batch axis."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 1 / np.sqrt(inputs), (inputs, hidden)).astype(np.float32)
    b1 = rng.normal(0, 0.1, hidden).astype(np.float32)
    w2 = rng.normal(0, 1 / np.sqrt(hidden), (hidden, outputs)).astype(np.float32)
    b2 = rng.normal(0, 0.1, outputs).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
         helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("Gemm", ["r", "w2", "b2"], ["y"])],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", inputs])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", outputs])],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"),
                                                     (b2, "b2"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    out = Path(path)
    out.write_bytes(model.SerializeToString())
    return out


def mlp_reference(x: np.ndarray, *, inputs: int = 16, hidden: int = 64, outputs: int = 4,
                  seed: int = 0) -> np.ndarray:
    """The same MLP in NumPy, to check what the gateway returns."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 1 / np.sqrt(inputs), (inputs, hidden)).astype(np.float32)
    b1 = rng.normal(0, 0.1, hidden).astype(np.float32)
    w2 = rng.normal(0, 1 / np.sqrt(hidden), (hidden, outputs)).astype(np.float32)
    b2 = rng.normal(0, 0.1, outputs).astype(np.float32)
    out: np.ndarray = np.maximum(x @ w1 + b1, 0) @ w2 + b2
    return out
