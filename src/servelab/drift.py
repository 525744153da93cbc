"""Feature drift: the population stability index (PSI), computed with care.

    >>> from servelab import drift
    >>> report = drift.compare_tables(reference_table, current_table)
    >>> [(f.feature, f.psi, f.status) for f in report.features]

PSI between a reference sample (the training set) and a current one (what was
served) over bins b:  PSI = sum_b (c_b - r_b) * ln(c_b / r_b), with r_b and c_b the
shares of each sample in bin b. The choices that make it trustworthy:

- **Bins from the reference's quantiles** (``bins``, default 10) with open outer
  edges, so a current value beyond the reference's range lands in an end bin, and
  any strictly increasing transform of both samples gives the same PSI. A reference
  with no more distinct values than bins (a constant, a flag, a small count) gets a
  bin for each value, one below them all and one above, so a value it never took
  is seen (a constant reference against anything else is drift, not PSI 0).
- **Missing values** (null, NaN) have their own bin on both sides.
- **Categorical** features (strings, booleans) bin by category; categories the
  reference never had share one "new" bin (on the reference side it holds the rare
  tail past its 1,000 most frequent categories, if it has more).
- **Empty bins**: every bin's count gets ``epsilon`` added on both sides before the
  shares are taken (default 0.5, Jeffreys' prior), so a bin empty on one side gives a
  large but finite term; the report states the value used.
- **Chance level**: with no drift at all, PSI is about (k - 1) x (1/n_ref + 1/n_cur)
  for k occupied bins (2 x the chi-square statistic's mean over the sample sizes); its
  99th percentile follows chi-square with k - 1 degrees of freedom (Wilson-Hilferty).
  A PSI at or below that 99th percentile is marked not significant and raises no
  alert, so a 50-row window cannot cry wolf.
- **Thresholds**: 0.1 warn and 0.25 alert by default (the industry's usual levels).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from servelab.errors import InputError, invalid
from servelab.report import jsonable

WARN = 0.1
ALERT = 0.25
DEFAULT_BINS = 10
DEFAULT_EPSILON = 0.5
MAX_BINS = 1000
MAX_CATEGORIES = 1000  # the reference's most frequent categories kept; the rest are "other"
Z99 = 2.3263478740408408  # the standard normal's 99th percentile
STATUSES = ("ok", "warn", "alert")
MISSING = "(missing)"
NEW = "(new)"


@dataclass(frozen=True, slots=True)
class Binning:
    """How one feature's values are binned, fixed by the reference."""

    kind: str  # "numeric" or "categorical"
    edges: tuple[float, ...] = ()  # numeric: interior edges; bin i is [e_{i-1}, e_i)
    categories: tuple[str, ...] = ()  # categorical: the reference's categories

    @property
    def labels(self) -> list[str]:
        if self.kind == "numeric":
            e = self.edges
            if not e:
                return ["all", MISSING]
            def just_after(a: float, b: float) -> bool:  # the bin holds one value
                return b == math.nextafter(a, math.inf)

            inner = [f"= {a:.6g}" if just_after(a, b) else f"[{a:.6g}, {b:.6g})"
                     for a, b in itertools.pairwise(e)]
            top = (f"> {e[-2]:.6g}" if len(e) > 1 and just_after(e[-2], e[-1])
                   else f">= {e[-1]:.6g}")
            return [f"< {e[0]:.6g}", *inner, top, MISSING]
        return [*self.categories, NEW, MISSING]


@dataclass(frozen=True, slots=True)
class FeatureDrift:
    feature: str
    kind: str
    psi: float
    chance_psi: float  # the mean PSI with no drift, for these sample sizes and bins
    chance_psi_p99: float  # its 99th percentile: above this, the PSI is significant
    significant: bool
    status: str  # ok, warn or alert (warn/alert only when significant)
    n_reference: int
    n_current: int
    bins: list[str]
    reference_share: list[float]
    current_share: list[float]
    contribution: list[float]  # each bin's term of the sum
    missing_reference: int
    missing_current: int
    new_categories: int = 0  # current rows whose category the reference never had


@dataclass(frozen=True, slots=True)
class DriftReport:
    features: list[FeatureDrift]
    bins: int
    epsilon: float
    warn: float
    alert: float
    window: str | None = None  # the current window's label, when windowed
    skipped: dict[str, str] = field(default_factory=dict)  # column -> why not compared

    @property
    def status(self) -> str:
        worst = max((STATUSES.index(f.status) for f in self.features), default=0)
        return STATUSES[worst]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status
        out: dict[str, Any] = jsonable(d)
        return out


def check_settings(bins: int, epsilon: float, warn: float, alert: float) -> None:
    if isinstance(bins, bool) or not isinstance(bins, int) or not 2 <= bins <= MAX_BINS:
        raise invalid("--bins", bins, f"a whole number from 2 to {MAX_BINS}", "e.g. --bins 10")
    if not (isinstance(epsilon, int | float) and math.isfinite(epsilon)
            and 1e-12 <= epsilon <= 100):
        raise invalid("--epsilon", epsilon, "a pseudo-count from 1e-12 to 100 per bin",
                      "e.g. --epsilon 0.5")
    if not (math.isfinite(warn) and math.isfinite(alert) and 0 < warn <= alert <= 100):
        raise invalid("--warn/--alert", (warn, alert), "0 < warn <= alert <= 100",
                      "e.g. --warn 0.1 --alert 0.25")


def chance_level(occupied_bins: int, n_ref: int, n_cur: int) -> tuple[float, float]:
    """(mean, 99th percentile) of PSI between two samples of one distribution."""
    dof = max(occupied_bins - 1, 0)
    if dof == 0 or n_ref == 0 or n_cur == 0:
        return 0.0, 0.0
    scale = 1.0 / n_ref + 1.0 / n_cur
    a = 2.0 / (9.0 * dof)
    p99 = dof * max(1.0 - a + Z99 * math.sqrt(a), 0.0) ** 3
    return dof * scale, p99 * scale


# -- binning -----------------------------------------------------------------------------
def is_categorical(values: np.ndarray) -> bool:
    return values.dtype.kind in "OUSb"


def numeric(values: np.ndarray) -> np.ndarray:
    """float64 with NaN for missing."""
    if values.dtype.kind == "f":
        return values.astype(np.float64, copy=False)
    if values.dtype.kind in "iu":
        return values.astype(np.float64)
    raise InputError(f"a column of type {values.dtype} is not numeric")


def fit_binning(reference: np.ndarray, bins: int = DEFAULT_BINS) -> Binning:
    """The bins a reference sample defines."""
    if is_categorical(reference):
        cats = _category_strings(reference)
        present = cats[cats != MISSING]
        if present.size == 0:
            return Binning("categorical", categories=())
        names, counts = np.unique(present, return_counts=True)
        order = np.lexsort((names, -counts))[:MAX_CATEGORIES]
        return Binning("categorical", categories=tuple(str(names[i]) for i in order))
    x = numeric(reference)
    x = x[np.isfinite(x)]  # infinities fall in the end bins; NaN is missing
    if x.size == 0:
        return Binning("numeric", edges=())
    distinct = np.unique(x)
    if distinct.size <= bins:
        with np.errstate(over="ignore"):  # past the largest float: inf, an empty top bin
            edges = np.append(distinct, np.nextafter(distinct[-1], np.inf))
        return Binning("numeric", edges=tuple(float(e) for e in edges))
    qs = np.quantile(x, np.arange(1, bins) / bins, method="linear")
    edges = np.unique(qs)
    # An edge at the minimum would leave the lowest bin empty: values equal to the edge
    # go up (bins are [a, b)), so drop it.
    edges = edges[edges > x.min()]
    return Binning("numeric", edges=tuple(float(e) for e in edges))


def _category_strings(values: np.ndarray) -> np.ndarray:
    out = np.empty(values.size, dtype=object)
    for i, v in enumerate(values.tolist()):
        out[i] = MISSING if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
    return out


def count(values: np.ndarray, binning: Binning) -> tuple[np.ndarray, int]:
    """Counts per bin (the last is missing) and, for categories, how many were new."""
    if binning.kind == "numeric":
        if is_categorical(values):
            raise InputError("a categorical column against a numeric reference")
        x = numeric(values)
        edges = np.asarray(binning.edges, dtype=np.float64)
        return _count_numeric(x, edges), 0
    cats = _category_strings(values)
    k = len(binning.categories)
    # bins: the reference's categories, then "new" (not among them: on the reference side
    # its rare tail past MAX_CATEGORIES), then missing
    index = {c: i for i, c in enumerate(binning.categories)}
    index[MISSING] = k + 1
    codes = np.fromiter((index.get(c, k) for c in cats.tolist()), dtype=np.int64,
                        count=cats.size)
    counts = np.bincount(codes, minlength=k + 2).astype(np.int64)
    return counts, int(counts[k])


def _count_numeric(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts per bin for [.., e0), [e0, e1) ... [e_last, ..), then missing."""
    from servelab.drift_kernels import count_numeric

    return count_numeric(np.ascontiguousarray(x, dtype=np.float64), edges)


# -- PSI ---------------------------------------------------------------------------------
def psi_from_counts(ref: np.ndarray, cur: np.ndarray, epsilon: float = DEFAULT_EPSILON
                    ) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """PSI, the shares on each side and each bin's contribution, with `epsilon` added to
    every bin that either side occupies (bins empty on both sides are left out)."""
    ref = np.asarray(ref, dtype=np.float64)
    cur = np.asarray(cur, dtype=np.float64)
    used = (ref > 0) | (cur > 0)
    r = np.where(used, ref + epsilon, 0.0)
    c = np.where(used, cur + epsilon, 0.0)
    rs = r / r.sum() if r.sum() > 0 else r
    cs = c / c.sum() if c.sum() > 0 else c
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(used, (cs - rs) * np.log(cs / rs), 0.0)
    return float(terms.sum()), rs, cs, terms


def feature_drift(name: str, reference: np.ndarray, current: np.ndarray, *,
                  bins: int = DEFAULT_BINS, epsilon: float = DEFAULT_EPSILON,
                  warn: float = WARN, alert: float = ALERT,
                  binning: Binning | None = None) -> FeatureDrift:
    """PSI of one feature between two samples, with its chance level and status."""
    b = binning or fit_binning(reference, bins)
    rc, _ = count(reference, b)
    cc, new = count(current, b)
    return result_from_counts(name, b, rc, cc, new, epsilon, warn, alert)


def result_from_counts(name: str, b: Binning, rc: np.ndarray, cc: np.ndarray, new: int,
            epsilon: float, warn: float, alert: float) -> FeatureDrift:
    """A feature's drift from its bin counts on each side (the last bin is missing)."""
    value, rs, cs, terms = psi_from_counts(rc, cc, epsilon)
    n_ref, n_cur = int(rc.sum()), int(cc.sum())
    occupied = int(((rc > 0) | (cc > 0)).sum())
    mean, p99 = chance_level(occupied, n_ref, n_cur)
    significant = value > p99 and n_ref > 0 and n_cur > 0
    status = "ok"
    if significant and value >= alert:
        status = "alert"
    elif significant and value >= warn:
        status = "warn"
    return FeatureDrift(
        feature=name, kind=b.kind, psi=value, chance_psi=mean, chance_psi_p99=p99,
        significant=bool(significant), status=status, n_reference=n_ref, n_current=n_cur,
        bins=b.labels, reference_share=[float(x) for x in rs],
        current_share=[float(x) for x in cs], contribution=[float(x) for x in terms],
        missing_reference=int(rc[-1]), missing_current=int(cc[-1]), new_categories=new)


# -- tables ------------------------------------------------------------------------------
def column_values(table: Any, name: str) -> np.ndarray:
    """A pyarrow column as numpy: numbers as float64 with NaN for null, the rest as
    objects (None for null)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = table.column(name)
    t = col.type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        # Integers past 2^53 and wide decimals round to the nearest float64 (PSI bins on
        # order, which rounding keeps); a safe cast would refuse them.
        arr: np.ndarray = pc.cast(col, pa.float64(), safe=False).to_numpy(
            zero_copy_only=False)
        return arr
    return np.asarray(col.to_pylist(), dtype=object)


def comparable_columns(reference: Any, current: Any, features: Sequence[str] | None,
                       timestamp: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The columns to compare, and the shared ones left out with the reason."""
    import pyarrow as pa

    ref_cols, cur_cols = set(reference.column_names), set(current.column_names)
    if features:
        missing = [f for f in features if f not in ref_cols or f not in cur_cols]
        if missing:
            raise invalid("--features", ",".join(missing), "columns present on both sides",
                          f"shared columns are: {', '.join(sorted(ref_cols & cur_cols))[:300]}")
        return list(features), {}
    chosen, skipped = [], {}
    for name in sorted(ref_cols & cur_cols, key=reference.column_names.index):
        t = reference.schema.field(name).type
        if name == timestamp or pa.types.is_temporal(t):
            skipped[name] = "a time column"
        elif name.startswith("pred_") or name in ("model",):
            skipped[name] = "the served log's own column"
        elif not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
                  or pa.types.is_string(t) or pa.types.is_large_string(t)
                  or pa.types.is_dictionary(t) or pa.types.is_decimal(t)):
            skipped[name] = f"type {t} is not binned"
        else:
            chosen.append(name)
    for name in reference.column_names:
        if name not in cur_cols:
            skipped[name] = "only on the reference side"
    for name in current.column_names:
        if name not in ref_cols:
            skipped[name] = "only on the current side"
    if not chosen:
        raise InputError("drift: the two sides share no feature columns "
                         f"(reference: {sorted(ref_cols)[:20]}, current: {sorted(cur_cols)[:20]}); "
                         "fix: name them with --features")
    return chosen, skipped


def compare_tables(reference: Any, current: Any, features: Sequence[str] | None = None, *,
                   bins: int = DEFAULT_BINS, epsilon: float = DEFAULT_EPSILON,
                   warn: float = WARN, alert: float = ALERT, timestamp: str | None = None,
                   window: str | None = None) -> DriftReport:
    """PSI per feature between two pyarrow tables."""
    check_settings(bins, epsilon, warn, alert)
    names, skipped = comparable_columns(reference, current, features, timestamp)
    out = []
    for name in names:
        ref, cur = column_values(reference, name), column_values(current, name)
        b = fit_binning(ref, bins)
        if b.kind == "numeric" and is_categorical(cur):
            raise invalid(f"column {name}", "text on the current side",
                          "the same type on both sides", "cast it, or leave it out")
        out.append(feature_drift(name, ref, cur, bins=bins,
                                 epsilon=epsilon, warn=warn, alert=alert, binning=b))
    return DriftReport(out, bins, epsilon, warn, alert, window, skipped)


def windows(table: Any, timestamp: str, every_s: float) -> Iterable[tuple[str, Any]]:
    """(label, rows) for each window of `every_s` seconds of the timestamp column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if timestamp not in table.column_names:
        raise invalid("--timestamp", timestamp, "a column of the current side",
                      f"its columns are: {', '.join(table.column_names)[:300]}")
    col = table.column(timestamp)
    t = col.type
    if pa.types.is_timestamp(t):
        us = pc.cast(pc.cast(col, pa.timestamp("us")), pa.int64()).to_numpy(
            zero_copy_only=False)
    elif pa.types.is_integer(t):  # the served log's request_time: microseconds
        us = col.to_numpy(zero_copy_only=False).astype(np.int64)
    else:
        raise invalid("--timestamp", timestamp, "a timestamp column or integer microseconds",
                      "name the time column")
    width = int(every_s * 1e6)
    keys = us // width
    uniq = np.unique(keys)
    if uniq.size > MAX_WINDOWS:
        raise invalid("--window", f"{every_s:g} s", f"at most {MAX_WINDOWS:,} windows over "
                      "the current side", "use a longer window")
    for k in uniq:
        idx = np.nonzero(keys == k)[0]
        start = np.datetime64(int(k) * width, "us").astype(
            "datetime64[m]" if width % 60_000_000 == 0 else "datetime64[s]")
        yield str(start).replace("T", " "), table.take(pa.array(idx))


MAX_WINDOWS = 10_000


def parse_window(text: str) -> float:
    """'90s', '15m', '1h', '1d' (or a number of seconds) -> seconds."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    t = text.strip().lower()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise invalid("--window", text, "a length like 90s, 15m, 1h or 1d",
                      "e.g. --window 1h") from None
    if not (math.isfinite(value) and 1 <= value <= 366 * 86400):
        raise invalid("--window", text, "from 1 s to 366 d", "e.g. --window 1h")
    return value
