"""CPU lists for pinning validate's server and load generator apart, and a server
started pinned (a real process: its affinity is read back from Linux)."""

import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servelab.errors import InputError
from servelab.measure.process import (
    MAX_CPU_LIST,
    free_port,
    parse_cpus,
    pin_this_process,
    server_process,
)

ALLOWED = sorted(os.sched_getaffinity(0))


def test_a_cpu_list_reads_as_taskset_reads_it():
    top = ALLOWED[-1]
    assert parse_cpus("--x", "0") == {0}
    assert parse_cpus("--x", f"0-{top}") == set(range(top + 1))
    assert parse_cpus("--x", f"{top},0, 0") == {0, top}


@pytest.mark.parametrize(("text", "says"), [
    ("", "a CPU list"), ("a", "a CPU list"), ("1-", "a CPU list"), ("-1", "a CPU list"),
    ("0-1-2", "a CPU list"), ("¹", "a CPU list"), ("1.5", "a CPU list"), (" ", "a CPU list"),
    ("x" * (MAX_CPU_LIST + 1), "a CPU list"), ("9999", "CPUs from"),
    ("1-0", "low before high"), ("0-999", "CPUs from"), ("0-99999999999999999999", "a CPU list")])
def test_a_bad_cpu_list_is_one_line_naming_the_flag(text, says):
    with pytest.raises(InputError) as e:
        parse_cpus("--client-cpus", text)
    msg = str(e.value)
    assert msg.startswith("--client-cpus = ")
    assert says in msg
    assert "fix:" in msg
    assert "\n" not in msg


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=40), st.from_regex(r"[0-9,\- ]{1,20}", fullmatch=True)))
def test_any_text_is_a_cpu_set_of_allowed_cpus_or_a_clear_error(text):
    try:
        got = parse_cpus("--server-cpus", text)
    except InputError as e:
        message = str(e)
    else:
        message = ""
    if message:
        assert message.startswith("--server-cpus = ")
        return
    assert got
    assert got <= set(ALLOWED)


def test_free_ports_are_never_handed_out_twice():
    """A server that takes several ports draws them all before binding any (Triton: HTTP,
    gRPC, metrics), so the same port twice would stop it from starting."""
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)


def test_a_server_started_pinned_runs_on_those_cpus_alone(tmp_path: Path):
    port = free_port()
    cmd = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
           "--directory", str(tmp_path)]
    cpus = frozenset({ALLOWED[-1]})
    with server_process(cmd, f"http://127.0.0.1:{port}/", cpus=cpus) as proc:
        status = Path(f"/proc/{proc.pid}/status").read_text()
        line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list"))
        assert line.split(":")[1].strip() == str(ALLOWED[-1])
    assert proc.poll() is not None  # stopped afterwards


def test_pinning_this_process_covers_threads_it_already_had():
    import threading

    seen: list[set[int]] = []
    go, done = threading.Event(), threading.Event()

    def worker():
        go.wait()
        seen.append(os.sched_getaffinity(0))
        done.set()

    t = threading.Thread(target=worker)
    t.start()
    before = os.sched_getaffinity(0)
    try:
        pin_this_process(frozenset({ALLOWED[0]}))
        go.set()
        done.wait(5)
        assert seen == [{ALLOWED[0]}]
        assert os.sched_getaffinity(0) == {ALLOWED[0]}
    finally:
        pin_this_process(frozenset(before))
        t.join()
    assert os.sched_getaffinity(0) == before


def test_cpu_use_reads_the_hypervisors_steal_apart_from_busy():
    from servelab.measure.load import cpu_times, cpu_use

    # 10 s on 4 CPUs: 20 CPU-s busy (steal included, as /proc/stat counts it), 2 stolen
    use = cpu_use((0.0, 1.0, 100.0, 5.0, 4), (10.0, 3.0, 120.0, 7.0, 4))
    assert use["client_cpu_cores"] == pytest.approx(0.2)
    assert use["host_cpu_busy"] == pytest.approx(0.5)
    assert use["host_cpu_steal"] == pytest.approx(0.05)
    a = cpu_times()
    b = cpu_times()
    assert 0.0 <= cpu_use(a, b).get("host_cpu_steal", 0.0) <= 1.0


def test_steal_is_noted_in_words():
    from servelab.measure.validate import Profile, notes_for
    from tests.conftest import rate_check

    row = rate_check(250.0, cpu={"host_cpu_steal": 0.12})
    notes = notes_for([row], Profile(host_cpu_steal=0.08))
    assert any("250/s the hypervisor gave 12%" in n for n in notes)
    assert any("while profiling, the hypervisor gave 8%" in n for n in notes)
    assert not any("hypervisor" in n for n in notes_for(
        [rate_check(1.0, cpu={"host_cpu_steal": 0.01})], Profile()))
