"""An independent PSI in plain NumPy, written from the definition for the tests: no
Numba, no shared code with servelab.drift."""

from __future__ import annotations

import numpy as np


def psi_numeric(ref: np.ndarray, cur: np.ndarray, bins: int, eps: float) -> float:
    r_ok, c_ok = ref[~np.isnan(ref)], cur[~np.isnan(cur)]
    edges = np.unique(np.quantile(r_ok, np.arange(1, bins) / bins))
    edges = edges[edges > r_ok.min()]
    rc = np.bincount(np.searchsorted(edges, r_ok, side="right"), minlength=edges.size + 1)
    cc = np.bincount(np.searchsorted(edges, c_ok, side="right"), minlength=edges.size + 1)
    rc = np.append(rc, np.isnan(ref).sum()).astype(float)
    cc = np.append(cc, np.isnan(cur).sum()).astype(float)
    keep = (rc > 0) | (cc > 0)
    r = (rc[keep] + eps) / (rc[keep] + eps).sum()
    c = (cc[keep] + eps) / (cc[keep] + eps).sum()
    return float(np.sum((c - r) * np.log(c / r)))
