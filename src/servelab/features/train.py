"""Train a small fraud classifier on point-in-time-correct features and export it to ONNX.

The training set is exactly what `features historical` gives for the label rows (the
feature service's values as of each label's time), so the model sees in training what
the gateway will join online. The model is a logistic regression fitted by Newton's
method in NumPy, exported as standardize -> MatMul -> Add -> Sigmoid.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servelab.errors import InputError, cut
from servelab.features.definitions import Repo


@dataclass(frozen=True, slots=True)
class TrainReport:
    rows: int
    positives: int
    features: tuple[str, ...]
    train_auc: float
    missing_filled: int  # feature values absent at a label's time, filled with 0
    out: str

    def to_dict(self) -> dict[str, object]:
        return {"rows": self.rows, "positives": self.positives, "features": list(self.features),
                "train_auc": self.train_auc, "missing_filled": self.missing_filled,
                "out": self.out}


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve by ranks (ties get their mean rank)."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), np.float64)
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    pos = labels.astype(bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-3, iters: int = 25
                 ) -> tuple[np.ndarray, float]:
    """L2-regularized logistic regression by Newton's method (x already standardized)."""
    n, f = x.shape
    a = np.hstack([x, np.ones((n, 1))])
    w = np.zeros(f + 1)
    reg = l2 * np.eye(f + 1)
    reg[-1, -1] = 0.0
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(a @ w)))
        grad = a.T @ (p - y) / n + reg @ w
        hess = (a * (p * (1 - p))[:, None]).T @ a / n + reg
        step = np.linalg.solve(hess + 1e-9 * np.eye(f + 1), grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w[:-1], float(w[-1])


def export_onnx(path: Path, mean: np.ndarray, std: np.ndarray, w: np.ndarray, b: float
                ) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    f = mean.size
    inits = [numpy_helper.from_array(mean.astype(np.float32), "mean"),
             numpy_helper.from_array(std.astype(np.float32), "std"),
             numpy_helper.from_array(w.astype(np.float32).reshape(f, 1), "w"),
             numpy_helper.from_array(np.array([b], np.float32), "b")]
    graph = helper.make_graph(
        [helper.make_node("Sub", ["features", "mean"], ["c"]),
         helper.make_node("Div", ["c", "std"], ["z"]),
         helper.make_node("MatMul", ["z", "w"], ["m"]),
         helper.make_node("Add", ["m", "b"], ["logit"]),
         helper.make_node("Sigmoid", ["logit"], ["probability"])],
        "fraud_logistic",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", f])],
        [helper.make_tensor_value_info("probability", TensorProto.FLOAT, ["batch", 1])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())


def train(repo: Repo, service: str, labels: str | Path, label: str, out: str | Path,
          engine: str | None = None, training_set_out: str | Path | None = None
          ) -> TrainReport:
    """Historical features for the label rows -> logistic regression -> ONNX at `out`;
    the training set itself to `training_set_out` (Parquet), the reference for drift."""
    import pyarrow.compute as pc

    from servelab.features.offline import get_historical_features

    if service not in repo.services:
        raise InputError(f"--service = {cut(service)!r}: not in the repo; expected one of "
                         f"{', '.join(sorted(repo.services)) or '(none)'}")
    table = get_historical_features(repo, labels, [f"service:{service}"], engine=engine)
    if training_set_out is not None:
        import pyarrow.parquet as pq

        pq.write_table(table, str(training_set_out))
    if label not in table.column_names:
        raise InputError(f"--label = {cut(label)!r}: not a column of the label rows; expected "
                         f"one of {', '.join(table.column_names)}")
    names = tuple(f for _, f in repo.resolve([f"service:{service}"]))
    cols = []
    missing = 0
    for n in names:
        col = pc.cast(table.column(n), "float64").to_numpy(zero_copy_only=False)
        bad = ~np.isfinite(col)
        missing += int(bad.sum())
        cols.append(np.where(bad, 0.0, col))
    x = np.column_stack(cols) if cols else np.zeros((table.num_rows, 0))
    y = np.asarray(pc.cast(table.column(label), "float64").to_numpy(zero_copy_only=False))
    if not np.isin(y, (0.0, 1.0)).all():
        raise InputError(f"--label = {label!r}: expected 0/1 or true/false values")
    if y.min() == y.max():
        raise InputError(f"--label = {label!r}: only one class in {len(y)} rows; "
                         "fix: train on rows with both outcomes")
    mean, std = x.mean(axis=0), x.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    w, b = fit_logistic((x - mean) / std, y)
    scores = 1 / (1 + np.exp(-(((x - mean) / std) @ w + b)))
    out_path = Path(out)
    export_onnx(out_path, mean, std, w, b)
    return TrainReport(len(y), int(y.sum()), names, auc(scores, y), missing, str(out_path))
