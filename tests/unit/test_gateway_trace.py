"""The gateway's trace: Triton's format, numbered files, bounded, read back by replay."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.errors import InputError
from servelab.trace_file import TraceWriter, read_trace


def test_numbered_files_that_replay_trace_reads_back(tmp_path):
    w = TraceWriter(tmp_path / "t.json", every=3, limit=7)
    for i in range(10):  # 7 traced, then nothing
        w.add("m", 1000 * i, 1000 * i + 500, 1000 * i + 900)
    w.flush()
    files = sorted(tmp_path.glob("t.json.*"))
    assert [f.name for f in files] == ["t.json.0", "t.json.1", "t.json.2"]
    assert [len(json.loads(f.read_text())) for f in files] == [3, 3, 1]
    assert not list(tmp_path.glob("*.tmp"))
    tr = read_trace(files)
    assert tr.model == "m"
    assert np.array_equal(tr.queue_ns, 1000 * np.arange(7))
    assert np.array_equal(tr.start_ns - tr.queue_ns, np.full(7, 500))
    assert np.array_equal(tr.end_ns - tr.start_ns, np.full(7, 400))
    w.flush()  # nothing left: no empty file
    assert len(list(tmp_path.glob("t.json.*"))) == 3


def test_a_file_is_written_half_a_second_after_its_first_request(tmp_path):
    """Fewer than `every` requests are written once the first of them is 0.5 s old,
    with the next request (validate reads a warm-up's requests from the trace)."""
    w = TraceWriter(tmp_path / "t.json", every=500)
    for ms in (0, 100, 499):
        w.add("m", ms * 10**6, ms * 10**6 + 10, ms * 10**6 + 20)
    assert not list(tmp_path.glob("t.json.*"))
    w.add("m", 500 * 10**6, 500 * 10**6 + 10, 500 * 10**6 + 20)
    assert [len(json.loads(f.read_text())) for f in tmp_path.glob("t.json.*")] == [4]
    w.add("m", 600 * 10**6, 600 * 10**6 + 10, 600 * 10**6 + 20)  # the clock starts again
    assert len(list(tmp_path.glob("t.json.*"))) == 1


@settings(max_examples=50, deadline=None)
@given(st.integers(-5, 3_000_000))
def test_the_limit_is_checked(limit):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        if 1 <= limit <= 2_000_000:
            assert TraceWriter(Path(d) / "t", limit=limit).limit == limit
        else:
            with pytest.raises(InputError, match="--trace-requests"):
                TraceWriter(Path(d) / "t", limit=limit)


def test_an_unwritable_folder_is_refused_before_serving(tmp_path):
    with pytest.raises(InputError, match="--trace-file"):
        TraceWriter(tmp_path / "no" / "such" / "t.json")
