"""The served-feature log: rows reach an append-only segment within the stated bound,
segments compact into Parquet, and what a crash leaves (a torn last line, a segment
compacted but not deleted, a half-written Parquet) reads cleanly and once."""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from servelab.errors import InputError
from servelab.gateway.log import BOUND_S, SEGMENT_PREFIX, ServedLog, read_served, recover


def row(i: int) -> dict[str, object]:
    return {"request_time": 1_700_000_000_000_000 + i, "model": "m", "user_id": i,
            "f": float(i) / 2, "g": None if i % 3 else i, "pred_y": [float(i)]}


def segments(d):  # type: ignore[no-untyped-def]
    return sorted(d.glob(f"{SEGMENT_PREFIX}*.jsonl"))


def test_rows_reach_the_segment_within_the_bound_and_compact_on_close(tmp_path):
    log = ServedLog(tmp_path, "m")
    for i in range(500):
        log.append(row(i))
    time.sleep(BOUND_S)
    (seg,) = segments(tmp_path)
    assert seg.read_text().count("\n") == 500  # on disk before any Parquet exists
    assert not list(tmp_path.glob("served-*.parquet"))
    assert read_served(tmp_path).num_rows == 500  # readers see the live segment
    log.close()
    assert not segments(tmp_path)
    (parquet,) = tmp_path.glob("served-m-*.parquet")
    table = pq.read_table(parquet)
    assert table.column("user_id").to_pylist() == list(range(500))
    assert str(table.schema.field("request_time").type) == "timestamp[us, tz=UTC]"
    assert log.written == 500
    assert log.dropped == 0


def test_segments_rotate_by_rows(tmp_path):
    log = ServedLog(tmp_path, "m", rows_per_file=100)
    for i in range(350):
        log.append(row(i))
        if i % 50 == 49:
            time.sleep(0.08)  # let the writer see each batch
    log.close()
    files = sorted(tmp_path.glob("served-m-*.parquet"))
    assert len(files) >= 3
    ids = read_served(tmp_path).column("user_id").to_pylist()
    assert sorted(ids) == list(range(350))


def test_a_crash_leaves_files_that_read_cleanly_and_once(tmp_path):
    # A torn last line (kill -9 mid-write): the whole lines are kept.
    seg = tmp_path / f"{SEGMENT_PREFIX}m-20261201T000000-1-00001.jsonl"
    seg.write_bytes(b'{"request_time": 1, "user_id": 1}\n{"request_time": 2, "user_id": 2}\n'
                    b'{"request_time": 3, "us')
    assert read_served(tmp_path).column("user_id").to_pylist() == [1, 2]
    # Killed after its Parquet was renamed in but before the segment was deleted.
    done = tmp_path / f"{SEGMENT_PREFIX}m-20261201T000000-1-00002.jsonl"
    done.write_bytes(b'{"request_time": 5, "user_id": 5}\n')
    pq.write_table(pa.table({"request_time": pa.array([5], pa.timestamp("us", tz="UTC")),
                             "user_id": [5]}),
                   tmp_path / "served-m-20261201T000000-1-00002.parquet")
    (tmp_path / "served-m-20261201T000000-1-00003.parquet.tmp").write_bytes(b"PAR1 torn")
    assert sorted(read_served(tmp_path).column("user_id").to_pylist()) == [1, 2, 5]
    # The next gateway's log compacts what was left, each row once.
    assert recover(tmp_path, "m") == 2
    assert not segments(tmp_path)
    assert not list(tmp_path.glob("*.tmp"))
    assert sorted(read_served(tmp_path).column("user_id").to_pylist()) == [1, 2, 5]
    assert ServedLog(tmp_path, "other").recovered == 0  # another model's files are its own


def test_an_empty_folder_is_a_clear_error(tmp_path):
    with pytest.raises(InputError, match="no served"):
        read_served(tmp_path)
