"""Repo definitions: every mistake is one line naming the key, value and fix."""

from __future__ import annotations

import pytest

from servelab.errors import InputError
from servelab.features.definitions import load_repo
from tests.unit.features_data import make_repo


def edit(root, old, new):  # type: ignore[no-untyped-def]
    f = root / "feature_repo.toml"
    text = f.read_text()
    assert old in text
    f.write_text(text.replace(old, new))


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('timestamp = "ts"', 'timestmp = "ts"', "did you mean 'timestamp'?"),
        ('risk = "float64"', 'risk = "double"', "[views.merchant_risk] features.risk = 'double'"),
        ('entities = ["merchant"]', 'entities = ["merchnt"]', "did you mean 'merchant'?"),
        ('"merchant_risk:risk"]', '"merchant_risk:risky"]', "did you mean 'risk'?"),
        ('offline = "duckdb"', 'offline = "bigquery"', "[project] offline = 'bigquery'"),
        (f"ttl_s = {200.0}", "ttl_s = -5", "ttl_s = -5: expected seconds >= 0"),
        ('join_keys = ["user_id"]', 'join_keys = "user_id"', "join_keys = 'user_id'"),
    ],
)
def test_definition_errors(tmp_path, old, new, message):
    root, *_ = make_repo(tmp_path, 0, n_entities=80)
    edit(root, old, new)
    with pytest.raises(InputError) as err:
        load_repo(root)
    assert message in str(err.value)
    assert "fix:" in str(err.value)


def test_missing_repo_and_bad_toml(tmp_path):
    with pytest.raises(InputError, match="servelab features init"):
        load_repo(tmp_path / "none")
    (tmp_path / "feature_repo.toml").write_text("[project\n")
    with pytest.raises(InputError, match="not valid TOML"):
        load_repo(tmp_path)
