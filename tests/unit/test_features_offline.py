"""One point-in-time contract, every offline engine, against the pandas reference."""

from __future__ import annotations

import pandas as pd
import pytest

from servelab.errors import InputError
from servelab.features.definitions import load_repo
from servelab.features.offline import get_historical_features
from tests.reference.pit_reference import point_in_time
from tests.unit.features_data import make_repo, reference_views

ENGINES = ["duckdb", pytest.param("spark", marks=pytest.mark.spark)]


def frames_equal(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert list(got.columns) == list(want.columns)
    assert len(got) == len(want)
    for col in got.columns:
        g, w = got[col].tolist(), want[col].tolist()
        for i, (a, b) in enumerate(zip(g, w, strict=True)):
            if pd.isna(b):
                assert pd.isna(a), (col, i, a, b)
            else:
                assert a == b, (col, i, a, b)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_reference(tmp_path, engine, seed):
    root, users, merchants, ent = make_repo(tmp_path, seed)
    repo = load_repo(root)
    feats = ["user_stats:txn_count", "user_stats:avg_amount", "merchant_risk:risk",
             "merchant_risk:category"]
    got = get_historical_features(repo, ent, feats, engine=engine).to_pandas()
    want = point_in_time(ent, "event_timestamp",
                         reference_views(users, merchants, ["txn_count", "avg_amount"],
                                         ["risk", "category"]))
    frames_equal(got, want)
    # The cases the contract names are all present in the data.
    assert got["txn_count"].isna().any()
    assert got["txn_count"].notna().any()
    assert len(got) == len(ent)


@pytest.mark.parametrize("engine", ENGINES)
def test_full_names_services_and_csv(tmp_path, engine):
    root, users, merchants, ent = make_repo(tmp_path, 3, n_entities=80, fmt="csv")
    repo = load_repo(root)
    got = get_historical_features(repo, ent, ["service:fraud"], engine=engine,
                                  full_feature_names=True).to_pandas()
    assert list(got.columns) == ["user_id", "merchant_id", "event_timestamp",
                                 "user_stats__txn_count", "merchant_risk__risk"]
    want = point_in_time(ent, "event_timestamp",
                         reference_views(users, merchants, ["txn_count"], ["risk"]),
                         full_names=True)
    frames_equal(got, want)


@pytest.mark.parametrize("engine", ENGINES)
def test_wrong_source_type_on_every_engine(tmp_path, engine):
    root, _, _, ent = make_repo(tmp_path, 0, n_entities=80)
    bad = pd.read_parquet(root / "data/user_stats.parquet")
    bad["txn_count"] = bad["txn_count"].astype(str)
    bad.to_parquet(root / "data/user_stats.parquet")
    with pytest.raises(InputError, match=r"column 'txn_count' has type .*; expected int64"):
        get_historical_features(load_repo(root), ent, ["user_stats:txn_count"], engine=engine)


def test_clear_errors(tmp_path):
    root, _, _, ent = make_repo(tmp_path, 0, n_entities=80)
    repo = load_repo(root)
    with pytest.raises(InputError, match="join key 'merchant_id', needed by view"):
        get_historical_features(repo, ent.drop(columns=["merchant_id"]),
                                ["merchant_risk:risk"])
    with pytest.raises(InputError, match="'event_timestamp' column"):
        get_historical_features(repo, ent.drop(columns=["event_timestamp"]),
                                ["user_stats:txn_count"])
    with pytest.raises(InputError, match="did you mean 'txn_count'"):
        get_historical_features(repo, ent, ["user_stats:txn_cnt"])
    with pytest.raises(InputError, match="did you mean 'user_stats'"):
        get_historical_features(repo, ent, ["user_stat:txn_count"])
    # A source whose column has the wrong type.
    bad = pd.read_parquet(root / "data/user_stats.parquet")
    bad["txn_count"] = bad["txn_count"].astype(str)
    bad.to_parquet(root / "data/user_stats.parquet")
    with pytest.raises(InputError, match="column 'txn_count' has type VARCHAR; expected int64"):
        get_historical_features(load_repo(root), ent, ["user_stats:txn_count"])


@pytest.mark.parametrize("engine", ENGINES)
def test_partitioned_source_keeps_rows_and_tie_breaks(tmp_path, engine):
    # Feast's file store drops entity rows and loses created-time tie-breaks once a source
    # spans partitions: split user_stats so that tied rows sit in different files.
    root, users, merchants, ent = make_repo(tmp_path, 5, n_entities=150)
    parts = root / "data" / "user_stats"
    parts.mkdir()
    first = users.sample(frac=0.5, random_state=1)
    first.to_parquet(parts / "part-0.parquet")
    users.drop(first.index).to_parquet(parts / "part-1.parquet")
    (root / "data/user_stats.parquet").unlink()
    toml = root / "feature_repo.toml"
    toml.write_text(toml.read_text().replace('"data/user_stats.parquet"',
                                             '"data/user_stats/*.parquet"'))
    repo = load_repo(root)
    got = get_historical_features(repo, ent, ["user_stats:txn_count", "user_stats:avg_amount"],
                                  engine=engine).to_pandas()
    want = point_in_time(ent, "event_timestamp",
                         reference_views(users, merchants, ["txn_count", "avg_amount"], []))
    frames_equal(got, want)


@pytest.mark.parametrize("engine", ENGINES)
def test_duckdb_table_source(tmp_path, engine):
    import duckdb

    root, users, merchants, ent = make_repo(tmp_path, 6, n_entities=100)
    with duckdb.connect(str(root / "data/warehouse.duckdb")) as con:
        con.register("m", merchants)
        con.execute("CREATE TABLE merchant_risk AS SELECT * FROM m")
    toml = root / "feature_repo.toml"
    toml.write_text(toml.read_text().replace(
        'source = "data/merchant_risk.parquet"',
        'source = { path = "data/warehouse.duckdb", table = "merchant_risk" }'))
    repo = load_repo(root)
    got = get_historical_features(repo, ent, ["merchant_risk:risk"], engine=engine).to_pandas()
    want = point_in_time(ent, "event_timestamp", reference_views(users, merchants, [], ["risk"]))
    frames_equal(got, want)


def test_mixed_time_zones_are_converted_not_rejected(tmp_path):
    root, users, _, _ = make_repo(tmp_path, 2, n_entities=80)
    repo = load_repo(root)
    utc = pd.Timestamp(users.loc[users["user_id"] == 1, "event_ts"].max(), tz="UTC")
    # The same three instants written three ways: UTC, Paris, New York (one object column),
    # and as ISO text with offsets.
    mixed = pd.DataFrame({"user_id": [1, 1, 1], "event_timestamp": [
        utc, utc.tz_convert("Europe/Paris"), utc.tz_convert("America/New_York")]})
    text = pd.DataFrame({"user_id": [1, 1, 1], "event_timestamp": [
        t.isoformat() for t in mixed["event_timestamp"]]})
    naive = pd.DataFrame({"user_id": [1], "event_timestamp": [utc.tz_localize(None)]})
    got = [get_historical_features(repo, df, ["user_stats:txn_count"]).to_pandas()
           for df in (mixed, text, naive)]
    values = {v for g in got for v in g["txn_count"].tolist()}
    assert len(values) == 1  # one instant, one answer ...
    assert not pd.isna(next(iter(values)))  # ... and a real one (an exact event time)
    assert all((g["event_timestamp"] == utc).all() for g in got)
