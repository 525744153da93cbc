"""The lab in a real headless Chromium (Debian's), driven by Playwright: the page loads
clean and local-only, its read-outs equal the CLI's --json, links and TOML round-trip."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.browser_support import (
    CHROMIUM_ARGS,
    SETTLED_JS,
    chromium_path,
    first_readout_ms,
    running_lab,
    time_moves,
)

playwright = pytest.importorskip("playwright.sync_api")

READOUTS = {  # page output id -> path in the CLI's JSON (command, dotted path)
    "out-mean-batch": ("simulate", "batching.mean_batch_size"),
    "out-busy": ("simulate", "gpu.busy_fraction"),
    "out-fed": ("simulate", "gpu.batch_efficiency"),
    "out-p50": ("simulate", "latency.p50_ms"),
    "out-p99": ("simulate", "latency.p99_ms"),
    "out-served": ("simulate", "requests.served"),
    "out-gpus": ("plan", "plan.num_gpus"),
    "out-cost": ("plan", "plan.cost_per_million_usd"),
    "out-kv-token": ("kv", "kv.bytes_per_token"),
    "out-kv-session": ("kv", "kv.bytes_per_session"),
    "out-max-sessions": ("kv", "kv.max_sessions"),
    "out-num-blocks": ("kv", "kv.num_blocks"),
}


@pytest.fixture(scope="module")
def lab_url() -> Iterator[str]:
    with running_lab() as url:
        yield url


@pytest.fixture(scope="module")
def browser():  # type: ignore[no-untyped-def]
    exe = chromium_path()
    if exe is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    with playwright.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        yield b
        b.close()


class Watch:
    """Console errors, page errors and every request URL a page makes."""

    def __init__(self, page) -> None:  # type: ignore[no-untyped-def]
        self.errors: list[str] = []
        self.urls: list[str] = []
        page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("request", lambda r: self.urls.append(r.url))


def open_lab(browser, url: str):  # type: ignore[no-untyped-def]
    page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    watch = Watch(page)
    page.goto(url)
    wait_ready(page)
    return page, watch


def wait_ready(page) -> None:  # type: ignore[no-untyped-def]
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=60_000)
    settle(page)


def settle(page) -> None:  # type: ignore[no-untyped-def]
    """Wait until no update is in flight and the read-outs show the latest state."""
    page.wait_for_function("document.querySelector('#status').textContent === ''",
                           timeout=60_000)
    page.wait_for_timeout(300)
    page.wait_for_function("document.querySelector('#status').textContent === ''",
                           timeout=60_000)


def readouts(page) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return {k: json.loads(page.get_attribute(f"#{k}", "data-value")) for k in READOUTS}


def cli(*args: str) -> dict[str, object]:
    p = subprocess.run([sys.executable, "-m", "servelab", *args, "--json"], capture_output=True,
                       text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def get(d, dotted):  # type: ignore[no-untyped-def]
    for k in dotted.split("."):
        d = d[k]
    return d


def cli_values(sim_args: list[str], kv_args: list[str]) -> dict[str, object]:
    out = {"simulate": cli("simulate", *sim_args), "plan": cli("plan", *sim_args),
           "kv": cli("kv", *kv_args)}
    return {k: get(out[cmd], path) for k, (cmd, path) in READOUTS.items()}


def test_page_loads_clean_and_local_only(browser, lab_url):
    page, watch = open_lab(browser, lab_url)
    page.wait_for_function("document.querySelector('#chart-paging .main-svg') !== null",
                           timeout=60_000)
    assert watch.errors == []
    hosts = {urlparse(u).hostname for u in watch.urls if not u.startswith(("data:", "blob:"))}
    assert hosts == {"127.0.0.1"}, hosts
    assert any(u.endswith("/vendor/plotly.min.js") for u in watch.urls)
    for label in page.query_selector_all("#controls label"):  # every control is labelled
        target = label.get_attribute("for")
        assert target
        assert page.query_selector(f"#{target}") is not None
    # The default view is the seed, with the same numbers as the CLI.
    assert readouts(page) == cli_values(["--scenario", "seed"], ["--scenario", "seed"])
    page.close()




def test_first_readouts_paint_within_1_5_s(browser, lab_url):
    """Measured in the page, from navigation to the first read-out's text: the read-outs
    come before plotly.js (4.8 MB) and before the other sections ask for anything."""
    times = [first_readout_ms(browser, lab_url) for _ in range(3)]
    assert sorted(times)[1] < 1500, times  # the median of three visits


def test_each_readout_follows_its_control_within_100_ms(browser, lab_url):
    """QPS, batch window, max batch size, context and KV dtype: 25 moves each, from the
    input event to the read-out's new text (and the frame that paints it), p95 < 100 ms."""
    page, watch = open_lab(browser, lab_url)
    # the page's start-up is over: its other sections answered, plotly.js drew the charts
    page.wait_for_function(SETTLED_JS, timeout=60_000)
    results = time_moves(page)
    for label, times in results.items():
        assert len(times) >= 20, (label, times)
        assert min(times) >= 0, (label, times)  # each move changed the read-out
        p95 = sorted(times)[round(0.95 * (len(times) - 1))]
        assert p95 < 100, (label, p95, sorted(times))
    assert watch.errors == []
    page.close()


def test_phone_width_results_first_and_no_sideways_scroll(browser, lab_url):
    page = browser.new_page(viewport={"width": 390, "height": 844})
    page.goto(lab_url)
    wait_ready(page)
    page.wait_for_function("document.querySelector('#chart-qps .main-svg') !== null",
                           timeout=60_000)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    top = "(s) => document.querySelector(s).getBoundingClientRect().top"
    assert page.evaluate(top, "#results") < page.evaluate(top, "#controls")
    assert page.is_visible("a.to-controls")
    page.close()


def test_presets_follow_reset_and_links(browser, lab_url):
    page, watch = open_lab(browser, lab_url)
    preset = "#c-preset"
    seed_name = page.eval_on_selector(preset, "s => s.options[1].value")
    assert page.input_value(preset) == seed_name  # the seed's own model
    page.select_option(preset, "fixed 2 ms per batch")
    settle(page)
    assert page.input_value("#c-model-kind") == "constant"
    link = page.url
    page.click("#btn-reset")
    settle(page)
    assert page.input_value(preset) == seed_name
    assert page.input_value("#c-model-kind") == "roofline"
    other = browser.new_page(viewport={"width": 1400, "height": 1000})
    other.goto(link)
    wait_ready(other)
    assert other.input_value(preset) == "fixed 2 ms per batch"
    other.close()
    assert watch.errors == []
    page.close()


def test_seed_table_and_paging_settings(browser, lab_url):
    """The dashboard's figures beside servelab's, row for row as `plan --scenario seed`;
    the replay's settings are shown with `kv paging`'s defaults and move its read-outs."""
    page, watch = open_lab(browser, lab_url)
    page.wait_for_function("document.querySelectorAll('#seed-table tbody tr').length > 0",
                           timeout=60_000)
    rows = page.eval_on_selector_all("#seed-table tbody tr",
                                     "trs => trs.map(t => [...t.cells].map(c => c.textContent))")
    want = cli("plan", "--scenario", "seed")["seed_comparison"]
    assert [r[:3] for r in rows] == [[w["figure"], w["stated"], w["servelab"]] for w in want]
    assert page.input_value("#paging-requests") == "2000"
    assert page.input_value("#paging-max-len") == "0"
    page.wait_for_function("document.querySelector('#paging-status').textContent === ''",
                           timeout=60_000)
    before = page.get_attribute("#out-paged-seqs", "data-value")
    page.fill("#paging-requests", "300")
    page.dispatch_event("#paging-requests", "change")
    page.wait_for_function(
        f"document.querySelector('#out-paged-seqs').dataset.value !== {before!r}",
        timeout=60_000)
    assert watch.errors == []
    page.close()


def test_sliders_and_kv_dtype_give_the_cli_numbers(browser, lab_url, tmp_path):
    page, watch = open_lab(browser, lab_url)
    before = readouts(page)
    # Keyboard on the QPS slider: five steps of 100 up from 2,000.
    page.focus("#c-workload-qps-range")
    for _ in range(5):
        page.keyboard.press("ArrowRight")
    settle(page)
    assert page.input_value("#c-workload-qps") == "2500"
    # The batch-window slider, by keyboard too: ten steps of 100 us up from 2,000.
    page.focus("#c-batching-max-queue-delay-microseconds-range")
    for _ in range(10):
        page.keyboard.press("ArrowRight")
    settle(page)
    assert page.input_value("#c-batching-max-queue-delay-microseconds") == "3000"
    page.select_option("#c-llm-kv-dtype", "fp8")
    settle(page)
    after = readouts(page)
    assert after["out-mean-batch"] != before["out-mean-batch"]
    assert after["out-kv-token"] == before["out-kv-token"] / 2  # type: ignore[operator]
    expected = cli_values(
        ["--scenario", "seed", "--qps", "2500", "--max-queue-delay-us", "3000"],
        ["--scenario", "seed", "--kv-dtype", "fp8"])
    assert after == expected
    # The exported TOML is the same scenario for the CLI.
    with page.expect_download() as dl:
        page.click("#btn-export")
    path = tmp_path / "lab.toml"
    dl.value.save_as(path)
    assert cli_values(["--scenario", str(path)], ["--scenario", str(path)]) == expected
    # A shared link restores the same view in a fresh page.
    url = page.url
    assert "workload.qps" in url
    other, _ = open_lab(browser, url)
    assert other.input_value("#c-workload-qps") == "2500"
    assert other.input_value("#c-llm-kv-dtype") == "fp8"
    assert readouts(other) == after
    assert watch.errors == []
    other.close()
    page.close()


def test_loading_a_toml_file_and_bad_input(browser, lab_url, tmp_path):
    page, watch = open_lab(browser, lab_url)
    toml = tmp_path / "mine.toml"
    toml.write_text(Path(__file__).resolve().parents[2].joinpath(
        "src/servelab/data/seed.toml").read_text().replace("qps = 2000.0", "qps = 3100.0"))
    page.set_input_files("#file-load", str(toml))
    page.wait_for_function("document.querySelector('#c-workload-qps').value === '3100'",
                           timeout=30_000)
    settle(page)
    assert readouts(page) == cli_values(["--scenario", str(toml)], ["--scenario", str(toml)])
    # A value the scenario refuses shows the server's one-line message, and nothing breaks.
    page.fill("#c-batching-max-batch-size", "0")
    page.dispatch_event("#c-batching-max-batch-size", "change")
    page.wait_for_selector("#error:not([hidden])", timeout=30_000)
    assert "[batching] max_batch_size = 0" in page.inner_text("#error")
    # ...at the field it names, and the read-outs are marked as not the current state
    assert page.get_attribute("#c-batching-max-batch-size", "aria-invalid") == "true"
    assert page.get_attribute("#results", "data-stale") == "1"
    page.fill("#c-batching-max-batch-size", "32")
    page.dispatch_event("#c-batching-max-batch-size", "change")
    page.wait_for_selector("#error[hidden]", state="attached", timeout=30_000)
    assert page.get_attribute("#c-batching-max-batch-size", "aria-invalid") is None
    # the same file loaded a second time loads again
    page.fill("#c-workload-qps", "2500")
    page.dispatch_event("#c-workload-qps", "change")
    settle(page)
    page.set_input_files("#file-load", str(toml))
    page.wait_for_function("document.querySelector('#c-workload-qps').value === '3100'",
                           timeout=30_000)
    assert [e for e in watch.errors if "400" not in e] == []
    page.close()


def test_warnings_reach_the_page(browser, lab_url):
    # A timeout shorter than the batch window times requests out at low load: the page
    # shows the report's warning, as the CLI prints it; a sane timeout clears it.
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    watch = Watch(page)
    page.goto(lab_url + "/?batching.default_timeout_microseconds=1000&workload.qps=50"
              "&workload.num_requests=3000")
    wait_ready(page)
    page.wait_for_selector("#notes:not([hidden])", timeout=30_000)
    assert "shorter than max_queue_delay_microseconds" in page.inner_text("#notes")
    page.goto(lab_url + "/?workload.num_requests=4000000")
    wait_ready(page)
    assert "at most 200,000 requests" in page.inner_text("#notes")
    page.goto(lab_url + "/?workload.num_requests=3000")
    wait_ready(page)
    assert page.is_hidden("#notes")
    assert watch.errors == []
    page.close()


def test_every_chart_has_axis_titles(browser, lab_url):
    page, watch = open_lab(browser, lab_url)
    page.wait_for_function("document.querySelector('#chart-paging .main-svg') !== null",
                           timeout=60_000)
    for chart in ("chart-budget", "chart-hist", "chart-window", "chart-qps", "chart-vram",
                  "chart-paging"):
        titles = page.eval_on_selector_all(
            f"#{chart} .g-xtitle text, #{chart} .g-ytitle text",
            "els => els.map(e => e.textContent)")
        assert any(t.strip() for t in titles), (chart, titles)
    assert not watch.errors, watch.errors


def test_drift_section_moves_with_its_sliders(browser, lab_url):
    """Features and drift: the PSI read-out equals servelab.drift on the same sample, a
    mean shift raises an alert, a tiny window of an unchanged feature does not, and the
    parity of the example store shows."""
    import urllib.request

    page, watch = open_lab(browser, lab_url)
    page.wait_for_function("document.body.dataset.driftReady === '1'", timeout=60_000)
    assert page.text_content("#out-drift-status") == "ok"
    assert page.text_content("#out-parity") == "identical"

    def psi_now() -> float:
        page.wait_for_timeout(400)
        return float(page.get_attribute("#out-psi", "data-value") or "nan")

    base = psi_now()
    page.fill("#drift-shift", "1")  # one reference SD
    page.dispatch_event("#drift-shift", "input")
    page.wait_for_function("document.querySelector('#out-drift-status').textContent === "
                           "'alert'", timeout=30_000)
    shifted = psi_now()
    assert shifted > 0.25 > base
    body = json.dumps({"feature": "avg_amount_7d", "mean_shift": 1.0, "spread": 1.0,
                       "missing": 0.0, "new_category": 0.0, "rows": 2000}).encode()
    req = urllib.request.Request(lab_url + "/api/drift", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        assert json.loads(r.read())["psi"] == pytest.approx(shifted, rel=1e-12)
    page.fill("#drift-shift", "0")
    page.dispatch_event("#drift-shift", "input")
    page.fill("#drift-rows", "50")
    page.dispatch_event("#drift-rows", "input")
    page.wait_for_function("document.querySelector('#out-drift-status').textContent === 'ok'",
                           timeout=30_000)
    assert "not significant" in (page.text_content("#out-drift-why") or "")
    page.select_option("#drift-feature", "country")
    assert page.is_disabled("#drift-shift")
    assert not page.is_disabled("#drift-new")
    assert page.query_selector("#chart-drift .main-svg") is not None
    assert not watch.errors, watch.errors


def test_a_validation_report_draws_over_the_qps_chart(browser, lab_url, tmp_path):
    """The page reads a validation.json itself (nothing is sent to the server) and draws
    its predicted and measured p99 against the rate; a file that is not one is refused
    in one line."""
    report = {"model": "demo", "url": "http://127.0.0.1:1", "within_tolerance": False,
              "rates": [{"rate_per_s": r, "compare": {"p99_ms": {"measured": m, "predicted": p}}}
                        for r, m, p in ((500, 7.8, 8.0), (1500, 11.3, 7.8), (2400, 20.7, 8.0))]}
    good = tmp_path / "validation.json"
    good.write_text(json.dumps(report))
    bad = tmp_path / "bad.json"
    bad.write_text('{"rates": "no"}')
    page, watch = open_lab(browser, lab_url)
    page.wait_for_function("document.querySelector('#chart-qps .main-svg') !== null",
                           timeout=60_000)
    before = len(watch.urls)
    page.set_input_files("#file-validation", str(good))
    page.wait_for_function("document.getElementById('chart-qps').data.some("
                           "t => t.name === 'validate: measured p99')", timeout=30_000)
    traces = page.evaluate("document.getElementById('chart-qps').data.map("
                           "t => [t.name, t.x, t.y])")
    measured = next(t for t in traces if t[0] == "validate: measured p99")
    assert measured[1] == [500, 1500, 2400]
    assert measured[2] == [7.8, 11.3, 20.7]
    assert "outside tolerance" in page.text_content("#out-validation")
    assert not [u for u in watch.urls[before:] if "/api/" in u]  # read in the page only
    page.set_input_files("#file-validation", str(bad))
    page.wait_for_selector("#error:not([hidden])", timeout=30_000)
    assert "validation file" in page.inner_text("#error")
    assert not watch.errors, watch.errors


def test_llm_section_runs_the_simulator_and_follows_its_sliders(browser, lab_url):
    page, watch = open_lab(browser, lab_url)
    page.wait_for_function("document.body.dataset.llmReady === '1'", timeout=60_000)
    first = page.text_content("#out-llm-tps")
    assert first
    assert int(first.replace(",", "")) > 0
    body = json.dumps({"model": "llama-3.1-8b", "gpu": "H100-SXM", "kv_dtype": "auto",
                       "tp": 1, "replicas": 1, "rate": 5, "prompt_tokens": 512,
                       "output_tokens": 256, "max_num_seqs": 256,
                       "max_num_batched_tokens": 8192}).encode()
    import urllib.request

    req = urllib.request.Request(lab_url + "/api/llm", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        want = json.loads(r.read())
    assert json.loads(page.get_attribute("#out-llm-ttft", "data-value")) == pytest.approx(
        want["ttft_ms"]["p99"])
    page.fill("#llm-rate", "20")
    page.dispatch_event("#llm-rate", "change")
    page.wait_for_function(f"document.querySelector('#out-llm-tps').textContent !== '{first}'",
                           timeout=60_000)
    # Charts draw on a later frame than the read-outs (and wait for plotly.js, which
    # loads after the first paint), so wait for them rather than look at once.
    page.wait_for_selector("#chart-llm-rate .main-svg", state="attached", timeout=30_000)
    page.wait_for_selector("#chart-llm-kv .main-svg", state="attached", timeout=30_000)
    assert not watch.errors, watch.errors


def test_an_llm_validation_drives_the_llm_section(browser, lab_url):
    """llm validate's report (the real one kept in docs/runs), read in the page: the
    section's simulator runs on that server's fitted step model and limits, the figures
    equal /api/llm's for the same query, and the measured p99s are drawn over the rate
    chart."""
    report = Path(__file__).resolve().parents[2] / "docs" / "runs" / \
        "2026-12-01-llm-validate-llama-server.json"
    data = json.loads(report.read_text())
    page, watch = open_lab(browser, lab_url)
    page.wait_for_function("document.body.dataset.llmReady === '1'", timeout=60_000)
    before = page.get_attribute("#out-llm-ttft", "data-value")
    page.set_input_files("#file-llm-validation", str(report))
    page.wait_for_function("document.getElementById('chart-llm-rate').data && document"
                           ".getElementById('chart-llm-rate').data.some(t => t.name === "
                           "'validate: measured TTFT p99')", timeout=60_000)
    assert page.get_attribute("#out-llm-ttft", "data-value") != before
    traces = page.evaluate("document.getElementById('chart-llm-rate').data.map("
                           "t => [t.name, t.x, t.y])")
    measured = next(t for t in traces if t[0] == "validate: measured TTFT p99")
    assert measured[1] == [r["offered_per_s"] for r in data["rates"]]
    assert measured[2] == [next(f["measured"] for f in r["figures"]
                                if f["name"] == "TTFT p99 (ms)") for r in data["rates"]]
    query = page.evaluate("llmQuery()")
    assert query["fitted"]["base_ms"] == data["profile"]["step_model"]["base_ms"]
    assert query["max_num_seqs"] == data["limits"]["slots"]
    import urllib.request

    req = urllib.request.Request(lab_url + "/api/llm", json.dumps(query).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        want = json.loads(r.read())
    assert json.loads(page.get_attribute("#out-llm-ttft", "data-value")) == pytest.approx(
        want["ttft_ms"]["p99"])
    assert "fitted" in page.text_content("#out-llm-validation")
    assert not watch.errors, watch.errors
