"""PSI: by hand, against an independent NumPy reference, invariances, missing and new
categories, the chance level against simulation, and the CLI's contract."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from servelab import drift
from tests.reference.psi_numpy import psi_numeric


def test_identical_samples_give_zero():
    x = np.random.default_rng(0).normal(size=5000)
    f = drift.feature_drift("x", x, x.copy())
    assert f.psi == 0.0
    assert f.status == "ok"
    assert not f.significant


def test_a_shift_worked_by_hand():
    ref = np.arange(1.0, 11.0)  # median 5.5: bins (< 5.5) and (>= 5.5), 5 rows each
    cur = np.array([1, 1, 2, 2, 3, 3, 4, 4, 6, 7], dtype=float)  # 8 below, 2 above
    f = drift.feature_drift("x", ref, cur, bins=2, epsilon=0.5)
    r, c = [5.5 / 11, 5.5 / 11], [8.5 / 11, 2.5 / 11]  # counts + 0.5, over 10 + 2 x 0.5
    expected = sum((ci - ri) * math.log(ci / ri) for ri, ci in zip(r, c, strict=True))
    assert f.psi == pytest.approx(expected, rel=1e-12)
    assert f.psi == pytest.approx(0.33371, abs=1e-4)
    assert f.bins == ["< 5.5", ">= 5.5", "(missing)"]
    assert f.reference_share[:2] == pytest.approx(r)
    assert sum(f.contribution) == pytest.approx(f.psi)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), bins=st.integers(2, 40),
       eps=st.sampled_from([1e-6, 0.01, 0.5, 2.0]), shift=st.floats(-2, 2),
       nan_share=st.sampled_from([0.0, 0.05, 0.3]))
def test_agrees_with_an_independent_numpy_reference(seed, bins, eps, shift, nan_share):
    rng = np.random.default_rng(seed)
    ref = rng.normal(size=3000)
    cur = rng.normal(shift, 1.3, size=800)
    ref[rng.random(ref.size) < nan_share / 2] = np.nan
    cur[rng.random(cur.size) < nan_share] = np.nan
    f = drift.feature_drift("x", ref, cur, bins=bins, epsilon=eps)
    assert f.psi == pytest.approx(psi_numeric(ref, cur, bins, eps), rel=1e-9, abs=1e-12)


def test_monotone_transforms_of_both_sides_leave_psi_unchanged():
    rng = np.random.default_rng(3)
    ref, cur = rng.normal(size=4000), rng.normal(0.3, 1.2, size=1000)
    base = drift.feature_drift("x", ref, cur).psi
    for f in (np.exp, lambda v: 3 * v + 7, lambda v: np.arctan(v) ** 3):
        assert drift.feature_drift("x", f(ref), f(cur)).psi == pytest.approx(base, rel=1e-12)


def test_values_past_the_reference_range_land_in_the_end_bins():
    ref = np.linspace(0, 1, 1000)
    f = drift.feature_drift("x", ref, np.array([-5.0, 50.0, 0.5]), bins=4)
    counts = np.round(np.array(f.current_share) * (3 + 0.5 * 5) - 0.5)  # undo the epsilon
    assert counts[0] == 1
    assert counts[3] == 1


def test_missing_values_and_new_categories_are_counted():
    ref = np.array(["a", "b", "c", None] * 250, dtype=object)
    cur = np.array(["a", "z", "y", None, None], dtype=object)
    f = drift.feature_drift("k", ref, cur)
    assert f.kind == "categorical"
    assert f.bins == ["a", "b", "c", "(new)", "(missing)"]
    assert f.new_categories == 2
    assert f.missing_reference == 250
    assert f.missing_current == 2
    num = drift.feature_drift("x", np.array([1.0, 2.0, np.nan, 4.0] * 50),
                              np.array([np.nan, np.nan, 1.0]))
    assert (num.missing_reference, num.missing_current) == (50, 2)


def test_chance_level_matches_simulation():
    rng = np.random.default_rng(11)
    n_ref, n_cur, bins = 2000, 500, 10
    values = [drift.feature_drift("x", rng.gamma(2.0, size=n_ref), rng.gamma(2.0, size=n_cur),
                                  bins=bins).psi for _ in range(400)]
    level, p99 = drift.chance_level(bins, n_ref, n_cur)
    assert np.mean(values) == pytest.approx(level, rel=0.10)
    assert np.mean(np.array(values) > p99) < 0.03


def test_a_small_window_cannot_alert_on_noise():
    rng = np.random.default_rng(5)
    ref = rng.normal(size=20_000)
    results = [drift.feature_drift("x", ref, rng.normal(size=50)) for _ in range(500)]
    # Raw PSI would cry wolf on most 50-row windows of an unchanged distribution...
    assert sum(f.psi >= drift.WARN for f in results) > 300
    # ...the chance level's 99th percentile lets about 1 in 100 through, by design.
    assert sum(f.status != "ok" for f in results) <= 10


def test_a_real_shift_in_a_small_window_still_alerts():
    rng = np.random.default_rng(6)
    f = drift.feature_drift("x", rng.normal(size=20_000), rng.normal(1.5, 1, size=50))
    assert f.significant
    assert f.status == "alert"


@settings(max_examples=150, deadline=None)
@given(ref=hnp.arrays(np.float64, st.integers(1, 300)),
       cur=hnp.arrays(np.float64, st.integers(1, 300)), bins=st.integers(2, 50))
def test_any_numbers_give_a_finite_psi(ref, cur, bins):
    f = drift.feature_drift("x", ref, cur, bins=bins)
    assert math.isfinite(f.psi)
    assert f.psi >= -1e-12
    assert sum(f.reference_share) == pytest.approx(1.0)
    assert f.status in drift.STATUSES
    json.dumps(drift.DriftReport([f], bins, 0.5, 0.1, 0.25).to_dict(), allow_nan=False)


@settings(max_examples=80, deadline=None)
@given(ref=st.lists(st.one_of(st.none(), st.text(max_size=3), st.booleans()), min_size=1,
                    max_size=100),
       cur=st.lists(st.one_of(st.none(), st.text(max_size=3)), min_size=1, max_size=100))
def test_any_categories_give_a_finite_psi(ref, cur):
    f = drift.feature_drift("k", np.array(ref, dtype=object), np.array(cur, dtype=object))
    assert math.isfinite(f.psi)
    assert f.n_current == len(cur)


# -- the CLI ---------------------------------------------------------------------------
def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "servelab", "drift", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def sides(tmp_path_factory):
    d = tmp_path_factory.mktemp("drift")
    rng = np.random.default_rng(1)
    n, m = 20_000, 4_000
    pq.write_table(pa.table({
        "amount": rng.lognormal(3, 1, n), "age": rng.integers(18, 90, n),
        "country": rng.choice(["de", "fr", "us"], n),
        "event_timestamp": pa.array(np.arange(n).astype("datetime64[s]"))}), d / "ref.parquet")
    (d / "cur").mkdir()
    for k in range(2):  # a folder of two files: one side
        pq.write_table(pa.table({
            "amount": rng.lognormal(3.6, 1, m // 2), "age": rng.integers(18, 90, m // 2),
            "country": rng.choice(["de", "fr", "us"], m // 2),
            "request_time": (np.arange(m // 2, dtype=np.int64) + k * m // 2) * 1_000_000}),
            d / "cur" / f"part-{k}.parquet")
    return d


def test_cli_flags_the_shifted_feature_only(sides):
    r = run("--reference", str(sides / "ref.parquet"), "--current", str(sides / "cur"),
            "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    status = {f["feature"]: f["status"] for f in out["features"]}
    assert status == {"amount": "alert", "age": "ok", "country": "ok"}
    assert out["status"] == "alert"
    assert out["epsilon"] == 0.5
    assert out["skipped"] == {"event_timestamp": "only on the reference side",
                              "request_time": "only on the current side"}
    fail = run("--reference", str(sides / "ref.parquet"), "--current", str(sides / "cur"),
               "--fail-on", "alert")
    assert fail.returncode == drift_exit()
    assert "amount" in fail.stdout
    win = run("--reference", str(sides / "ref.parquet"), "--current", str(sides / "cur"),
              "--timestamp", "request_time", "--window", "30m", "--json",
              "--features", "amount,age")
    windows = json.loads(win.stdout)
    assert [w["window"] for w in windows] == ["1970-01-01 00:00", "1970-01-01 00:30",
                                             "1970-01-01 01:00"]
    assert sum(f["n_current"] for w in windows for f in w["features"]
               if f["feature"] == "age") == 4000


def drift_exit() -> int:
    from servelab.drift_cli import EXIT_DRIFT

    return EXIT_DRIFT


@pytest.mark.parametrize(("args", "needle"), [
    (["--current", "{d}/cur"], "--reference"),
    (["--reference", "{d}/none.parquet", "--current", "{d}/cur"], "no such file"),
    (["--reference", "{d}/bad.parquet", "--current", "{d}/cur"], "not readable as Parquet"),
    (["--reference", "{d}/ref.parquet", "--current", "{d}/cur", "--bins", "1"], "--bins"),
    (["--reference", "{d}/ref.parquet", "--current", "{d}/cur", "--epsilon", "0"],
     "--epsilon"),
    (["--reference", "{d}/ref.parquet", "--current", "{d}/cur", "--window", "1h"],
     "--window/--timestamp"),
    (["--reference", "{d}/ref.parquet", "--current", "{d}/cur", "--window", "soon",
      "--timestamp", "request_time"], "--window"),
    (["--reference", "{d}/ref.parquet", "--current", "{d}/cur", "--features", "nope"],
     "--features"),
    (["--reference", "{d}/ref.parquet", "--current", "{d}/cur", "--fail-on", "panic"],
     "--fail-on"),
])
def test_cli_mistakes_are_one_line(sides, args, needle):
    (sides / "bad.parquet").write_text("not parquet")
    r = run(*[a.format(d=sides) for a in args])
    assert r.returncode in (1, 2), r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert needle in r.stderr


def test_a_constant_or_few_valued_reference_still_sees_drift():
    """Quantile edges of a constant all coincide (one bin, PSI 0 whatever came); a
    reference with no more distinct values than bins gets a bin per value and one on
    each side, so a value it never took counts."""
    rng = np.random.default_rng(5)
    f = drift.feature_drift("x", np.full(2000, 3.0), rng.normal(size=500))
    assert f.bins == ["< 3", "= 3", "> 3", "(missing)"]
    assert f.status == "alert"
    assert drift.feature_drift("x", np.full(2000, 3.0), np.full(500, 3.0)).psi == 0
    flags = rng.integers(0, 2, 3000).astype(float)
    same = drift.feature_drift("x", flags, rng.integers(0, 2, 800).astype(float))
    assert same.status == "ok"
    seven = drift.feature_drift("x", flags, np.full(800, 7.0))  # beyond: its own bin
    assert seven.status == "alert"
    assert seven.current_share[-2] > 0.9
