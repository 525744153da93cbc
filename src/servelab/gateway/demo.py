"""Small ONNX models built in code (no hub, no download): an MLP, for a newcomer's first
`servelab serve`, the tests, the benchmark and `servelab validate --serve`."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

# `validate --serve demo`: an MLP large enough that its time per batch is the model's,
# not the framework's, and grows with the batch as a real model's does (on this kind of
# machine, one ORT thread: about 1.4 ms for 1 row, 3.7 ms for 32).
VALIDATION_MLP = {"inputs": 64, "hidden": 2048, "layers": 3}


def mlp_weights(inputs: int, hidden: int, outputs: int, layers: int, seed: int
                ) -> list[tuple[np.ndarray, np.ndarray]]:
    """The MLP's (weight, bias) per layer: the same for the same sizes and seed."""
    rng = np.random.default_rng(seed)
    dims = [inputs, *[hidden] * layers, outputs]
    out = []
    for d_in, d_out in itertools.pairwise(dims):
        w = rng.normal(0, 1 / np.sqrt(d_in), (d_in, d_out)).astype(np.float32)
        b = rng.normal(0, 0.1, d_out).astype(np.float32)
        out.append((w, b))
    return out


def write_mlp(path: str | Path, *, inputs: int = 16, hidden: int = 64, outputs: int = 4,
              layers: int = 1, seed: int = 0) -> Path:
    """`layers` hidden layers of relu(x W + b), then a linear output; FP32, dynamic batch."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, prev = [], [], "x"
    weights = mlp_weights(inputs, hidden, outputs, layers, seed)
    for i, (w, b) in enumerate(weights):
        last = i == len(weights) - 1
        out = "y" if last else f"h{i}"
        inits += [numpy_helper.from_array(w, f"w{i + 1}"), numpy_helper.from_array(b, f"b{i + 1}")]
        nodes.append(helper.make_node("Gemm", [prev, f"w{i + 1}", f"b{i + 1}"], [out]))
        if not last:
            nodes.append(helper.make_node("Relu", [out], [f"r{i}"]))
            prev = f"r{i}"
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", inputs])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", outputs])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    target = Path(path)
    target.write_bytes(model.SerializeToString())
    return target


def mlp_reference(x: np.ndarray, *, inputs: int = 16, hidden: int = 64, outputs: int = 4,
                  layers: int = 1, seed: int = 0) -> np.ndarray:
    """The same MLP in NumPy, to check what the gateway returns."""
    weights = mlp_weights(inputs, hidden, outputs, layers, seed)
    h = x
    for w, b in weights[:-1]:
        h = np.maximum(h @ w + b, 0)
    w, b = weights[-1]
    out: np.ndarray = h @ w + b
    return out
