"""The lab's HTTP side: a static page and a JSON API over the same functions as the CLI.

Every number the page shows comes from here; the page only formats and draws.
Nothing is fetched from outside: plotly.js is served from the installed
`plotly` package.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import plotly
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.gzip import GZipMiddleware

from servelab.api import run_plan, run_simulate, run_sweep
from servelab.catalog import gpu_names
from servelab.errors import InputError, ServelabError, cut, invalid
from servelab.files import parse_toml
from servelab.http import LOOPBACK_HOSTS, GuardMiddleware, error_response, json_response
from servelab.lab import background
from servelab.lab.drift_lab import DriftIn, DriftLab, check_feature
from servelab.lab.llm_lab import LlmIn, one_deployment
from servelab.lab.llm_lab import run as run_llm
from servelab.lab.llm_lab import sweep as sweep_llm
from servelab.llm.kv import KV_DTYPES, WEIGHT_DTYPES
from servelab.llm.models import model_names
from servelab.llm.pool import kv_report, pool_spec
from servelab.report import jsonable
from servelab.scenario import (
    LAB_PAGING_MAX_LEN,
    LAB_PAGING_MAX_REQUESTS,
    MAX_QPS,
    MAX_SPAN_S,
    Scenario,
    flatten,
    lab_controls,
    lab_view,
    load_scenario,
    scenario_from_dict,
    scenario_from_flat,
    scenario_to_dict,
    scenario_to_toml,
)
from servelab.seed import seed_comparison, seed_rows_dict

STATIC = Path(str(resources.files("servelab.lab").joinpath("static")))
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"

# Charts are sweeps of many simulations: fewer requests each keeps a slider live.
CHART_REQUESTS = 5_000
# The paged-vs-contiguous replay: `servelab kv paging`'s defaults (2,000 requests, the
# longest sequence the context length, no shared prefix), editable on the page up to caps.
PAGING_REQUESTS = 2000
PAGING_MAX_REQUESTS = LAB_PAGING_MAX_REQUESTS
PAGING_MAX_LEN = LAB_PAGING_MAX_LEN
# Bounded work per call, so one page cannot take the server from everyone else: an
# interactive update simulates at most this many requests (the page says when it caps),
# the planner searches at most this many GPUs, and a request body is at most this large.
LAB_MAX_REQUESTS = 200_000
# A preview starts at 20,000 requests and grows (x4, up to the full run's size) until the
# p99's 95% interval is within PREVIEW_P99_PRECISION of it: enough for a stable p99 at the
# current load, no more.
PREVIEW_STEPS = (20_000, 80_000)
PREVIEW_P99_PRECISION = 0.02
LAB_MAX_GPUS = 4_096
LAB_MAX_BODY_BYTES = 4 * 1024 * 1024


_pool = ThreadPoolExecutor(max_workers=2)


class StateIn(BaseModel):
    state: dict[str, Any]
    # While a slider moves: a smaller run for the read-outs (the page marks them as a
    # preview); the full run follows when it is let go.
    preview: bool = False


class PagingIn(BaseModel):
    state: dict[str, Any]
    requests: int = PAGING_REQUESTS
    max_len: int = 0  # 0: the context length
    prefix_tokens: int = 0


class TomlIn(BaseModel):
    toml: str


@dataclass(frozen=True, slots=True)
class LabConfig:
    """What the lab was started with: where a page may name files, which hosts it answers."""

    data_dir: str | None = None  # None: a page can name no file at all
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS


def _capped(s: Scenario, preview: int = 0) -> tuple[Scenario, tuple[str, ...]]:
    """The scenario within the lab's per-call limits, and a note for each cap applied;
    `preview` > 0: at most that many requests (a run while a slider moves)."""
    notes = []
    if preview and s.workload.num_requests > preview:
        notes.append(f"preview while the slider moves: {preview:,} of "
                     f"{s.workload.num_requests:,} requests; the full run follows on release")
        s = replace(s, workload=replace(s.workload, num_requests=preview))
    if s.workload.num_requests > LAB_MAX_REQUESTS:
        notes.append(f"the lab simulates at most {LAB_MAX_REQUESTS:,} requests per update "
                     f"(asked {s.workload.num_requests:,}); run `servelab simulate` for more")
        s = replace(s, workload=replace(s.workload, num_requests=LAB_MAX_REQUESTS))
    if s.plan.max_gpus > LAB_MAX_GPUS:
        notes.append(f"the lab's planner searches at most {LAB_MAX_GPUS:,} GPUs "
                     f"(asked {s.plan.max_gpus:,}); run `servelab plan` for more")
        s = replace(s, plan=replace(s.plan, max_gpus=LAB_MAX_GPUS))
    if s.hardware.num_gpus > LAB_MAX_GPUS:
        notes.append(f"the lab simulates at most {LAB_MAX_GPUS:,} GPUs "
                     f"(asked {s.hardware.num_gpus:,}); run `servelab simulate` for more")
        s = replace(s, hardware=replace(s.hardware, num_gpus=LAB_MAX_GPUS))
    return s, tuple(notes)


def _frozen(v: Any) -> Any:
    """A JSON value as a hashable key (lists to tuples, objects to sorted item tuples)."""
    if isinstance(v, list):
        return ("__list__", tuple(_frozen(x) for x in v))
    if isinstance(v, dict):
        return ("__dict__", tuple(sorted((str(k), _frozen(x)) for k, x in v.items())))
    return v


def _thawed(v: Any) -> Any:
    if isinstance(v, tuple) and len(v) == 2 and v[0] == "__list__":
        return [_thawed(x) for x in v[1]]
    if isinstance(v, tuple) and len(v) == 2 and v[0] == "__dict__":
        return {k: _thawed(x) for k, x in v[1]}
    return v


@lru_cache(maxsize=256)
def _cached_scenario(items: tuple[tuple[str, Any], ...], data_dir: str | None) -> Scenario:
    return scenario_from_flat({k: _thawed(v) for k, v in items}, base_dir=data_dir,
                              sandbox=True)


def default_state() -> dict[str, Any]:
    return flatten(scenario_to_dict(load_scenario("seed")))


def _precise(p99: float | None, interval: list[float | None]) -> bool:
    """The p99's 95% interval is within PREVIEW_P99_PRECISION of it (or there is none)."""
    lo, hi = interval
    if p99 is None or lo is None or hi is None or p99 <= 0:
        return True
    return (hi - lo) / 2 <= PREVIEW_P99_PRECISION * p99


def _batching_part(s: Scenario) -> Scenario:
    """The scenario without its LLM pool: what the simulator and the planner read, so a
    KV-cache move finds their answers cached and only the closed-form KV figures run."""
    return replace(s, llm=None)


def _simulate_with_interval(s: Scenario) -> dict[str, Any]:
    """`run_simulate`'s Report, with the p99's 95% interval (the Report's, asked for)."""
    return run_simulate(s, p99_interval=True).to_dict()


@lru_cache(maxsize=128)
def _sim_plan(s: Scenario) -> tuple[dict[str, Any], dict[str, Any]]:
    sim = _pool.submit(_simulate_with_interval, s)
    planned = _pool.submit(run_plan, s)
    plan_d = planned.result().to_dict()  # to_dict: NaN becomes null
    return sim.result(), {
        "num_gpus": plan_d["plan"]["num_gpus"],
        "cost_per_million_usd": plan_d["plan"]["cost_per_million_usd"],
        "meets_slo": plan_d["plan"]["meets_slo"],
        "verdict": plan_d["plan"]["verdict"],
        "p99_ms": plan_d["latency"]["p99_ms"],
        "busy_fraction": plan_d["gpu"]["busy_fraction"],
        "notes": plan_d["notes"],
    }


@lru_cache(maxsize=128)
def _update(s: Scenario, caps: tuple[str, ...], asked: Scenario) -> dict[str, Any]:
    """The read-outs of `s` (the scenario within the lab's caps); the state and the TOML are
    `asked`'s, so a cap or a preview never becomes what the page holds, links or exports."""
    sim_d, plan = _sim_plan(_batching_part(s))
    kv = kv_report(pool_spec(s)).to_dict() if s.llm is not None else None
    notes = [*caps, *sim_d["notes"]]
    notes += [n for n in plan["notes"] if n not in notes]
    if kv is not None:
        notes += [f"KV pool: {n}" for n in kv["notes"]]
    if asked.llm is not None:  # one deployment: [llm] replicas as the pool's GPUs give them
        asked = one_deployment(asked)
    return {  # the Report names the whole scenario, its LLM pool included
        "simulate": {**sim_d, "scenario": jsonable(scenario_to_dict(s))},
        "plan": {k: v for k, v in plan.items() if k != "notes"},
        "kv": kv,
        "notes": notes,
        "toml": scenario_to_toml(asked),
        "state": flatten(scenario_to_dict(asked)),
    }


def _around(x: float, lo: float, n: int, factor: float = 2.0) -> list[float]:
    hi = max(x * factor, lo * 2)
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)]


def _charts(s: Scenario) -> dict[str, Any]:
    return _batching_charts(_batching_part(s))


@lru_cache(maxsize=64)
def _batching_charts(s: Scenario) -> dict[str, Any]:
    light = replace(s, workload=replace(s.workload, num_requests=min(
        CHART_REQUESTS, s.workload.num_requests)))
    delay_us = s.batching.max_queue_delay_microseconds
    windows = sorted({min(60_000_000, int(round(v, -1))) for v in _around(delay_us, 0, 7, 2.5)}
                     | {delay_us})
    qps = s.workload.qps
    rates = [min(MAX_QPS, round(v, 1)) for v in _around(qps, qps / 8, 7, 2.0)]
    rates = [r for r in rates if light.workload.num_requests / r <= MAX_SPAN_S] or [qps]
    w = _pool.submit(run_sweep, light, "max_queue_delay_us", windows)
    q = _pool.submit(run_sweep, light, "qps", rates)
    return {"window_sweep": w.result(), "qps_sweep": q.result(),
            "requests_per_point": light.workload.num_requests}


@lru_cache(maxsize=32)
def _paging(s: Scenario, requests: int = PAGING_REQUESTS, max_len: int | None = None,
            prefix_tokens: int = 0) -> dict[str, Any]:
    """`servelab kv paging` for the page, with its defaults (max_len: the context)."""
    capacity = kv_report(pool_spec(s)).pool.tokens_capacity
    if capacity < 1:
        raise InputError("[llm] pool: holds no KV tokens on these GPUs (the weights and "
                         "reserves take all memory); fix: more GPUs, a larger GPU, or a "
                         "smaller weight dtype")
    if not 1 <= requests <= PAGING_MAX_REQUESTS:
        raise invalid("paging requests", requests, f"1 to {PAGING_MAX_REQUESTS:,} in the lab",
                      f"replay at most {PAGING_MAX_REQUESTS:,} (`servelab kv paging "
                      "--requests` takes more)")
    longest = max_len or (s.llm.context_tokens if s.llm is not None else 4096)
    if not 2 <= longest <= PAGING_MAX_LEN:
        raise invalid("paging longest sequence", longest, f"2 to {PAGING_MAX_LEN:,} tokens",
                      "use a shorter one, or leave it at 0 for the context length")
    if not 0 <= prefix_tokens < longest:
        raise invalid("paging shared prefix", prefix_tokens, f"0 to {longest - 1:,} tokens "
                      "(shorter than the longest sequence)", "use 0 for no shared prefix")
    # More tokens than these requests can ever hold changes nothing: cap the books there.
    pool_tokens = min(capacity, requests * longest)
    out = background.replay(s, requests, longest, prefix_tokens, pool_tokens)
    # the page's settings line shows the prefix; the CLI's hint about its flag is not for it
    out["notes"] = [n for n in out["notes"] if not n.startswith("paged_prefix left out")]
    by = {r["strategy"]: r for r in out["results"]}
    out["summary"] = {  # the figures the page's read-outs name, picked out here
        "paged_seqs": by["paged"]["mean_concurrency"],
        "contiguous_seqs": by["contiguous_max"]["mean_concurrency"],
        "paged_token_share": by["paged"]["under_load"]["token"],
        "contiguous_token_share": by["contiguous_max"]["under_load"]["token"],
    }
    if pool_tokens < capacity:
        out["notes"] = [*out["notes"], f"the replay's pool is capped at {pool_tokens:,} tokens "
                        f"(the deployment holds {capacity:,}): {requests:,} requests "
                        "never need more"]
    return out


def _pool_part(s: Scenario) -> Scenario:
    """Only the LLM pool matters to the paging replay: its cache is keyed on that alone."""
    return replace(Scenario(), hardware=s.hardware, llm=s.llm, base_dir=s.base_dir,
                   sandbox=True)


@lru_cache(maxsize=1)
def _seed_rows() -> dict[str, Any]:
    """The seed dashboard's stated figures beside servelab's, as `plan --scenario seed`."""
    s = load_scenario("seed")
    return {"rows": seed_rows_dict(seed_comparison(s, run_plan(s)))}


def _scenario(state: dict[str, Any], data_dir: str | None) -> Scenario:
    try:
        items = tuple(sorted((str(k), _frozen(v)) for k, v in state.items()))
        return _cached_scenario(items, data_dir)
    except TypeError:  # unhashable or unorderable values: not a page's state
        raise InputError("state: expected flat section.key values (numbers, strings, "
                         "lists); fix: send the page's own state") from None


@lru_cache(maxsize=64)
def _llm(query_json: str, data_dir: str | None) -> dict[str, Any]:
    """The LLM section's answer for the page's state (none: the seed's)."""
    q = LlmIn.model_validate_json(query_json)
    s = _scenario(q.state or default_state(), data_dir)
    return sweep_llm(s, q.fitted) if q.sweep else run_llm(s, q.fitted, q.preview)


def warm(app: FastAPI) -> None:
    """Answer the page's first questions before it asks (the default state's read-outs,
    charts, paging replay, the seed table, the LLM and drift sections' defaults), so a
    first visit paints at once; it also loads the simulator's compiled code."""
    s = _scenario(default_state(), app.state.config.data_dir)
    # The paging replay, the longest, runs in its worker process meanwhile (this thread
    # only waits on it), with the arguments the page sends.
    with ThreadPoolExecutor(max_workers=1) as aside:
        paging = aside.submit(_paging, _pool_part(s), PAGING_REQUESTS, None, 0)
        for first in (LlmIn(state=default_state()), LlmIn(state=default_state(), sweep=True)):
            _llm(first.model_dump_json(), app.state.config.data_dir)  # the first queries
        app.state.drift_lab.ready()
        _update(*_capped(s), s)
        _charts(_capped(s)[0])
        _seed_rows()
        paging.result()


def _one_line_validation(exc: RequestValidationError, path: str) -> str:
    example = {"/api/drift": '{"feature": "avg_amount_7d", "mean_shift": 0.5}',
               "/api/llm": '{"model": "llama-3.1-8b", "rate": 5}'}.get(
        path, '{"state": {"workload.qps": 2000}}')
    errs = exc.errors()
    if not errs:
        return f"request body: not what the API expects; fix: send JSON like {example}"
    e = errs[0]
    where = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
    return (f"request {cut(where, 60)}: {cut(str(e.get('msg', 'invalid')), 120)}; "
            f"fix: send JSON like {example}")


def create_app(config: LabConfig | None = None) -> FastAPI:
    """The lab's app. Files named by a page are read only inside `config.data_dir`."""
    cfg = config or LabConfig()
    drift_lab = DriftLab()
    app = FastAPI(title="servelab lab", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.config = cfg
    app.state.drift_lab = drift_lab
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    # plotly.js is 4.8 MB; gzip makes it about a third of that, and the browser keeps it.
    app.add_middleware(GZipMiddleware, minimum_size=1024)
    app.add_middleware(GuardMiddleware, allowed_hosts=cfg.allowed_hosts,
                       max_body=LAB_MAX_BODY_BYTES)

    def scenario(state: dict[str, Any]) -> Scenario:
        return _scenario(state, cfg.data_dir)

    @app.exception_handler(ServelabError)
    async def usererror_response(_: Request, exc: ServelabError) -> Response:
        return error_response(str(exc), 400, key=getattr(exc, "key", None))

    @app.exception_handler(background.BusyError)
    async def busy_response(_: Request, exc: background.BusyError) -> Response:
        return error_response(str(exc), 503)

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, exc: RequestValidationError) -> Response:
        return error_response(_one_line_validation(exc, request.url.path), 400)

    @app.exception_handler(StarletteHTTPException)
    async def httperror_response(request: Request, exc: StarletteHTTPException) -> Response:
        return error_response(f"{request.method} {cut(request.url.path, 80)}: {exc.detail}",
                      exc.status_code)

    @app.exception_handler(RecursionError)
    async def too_deep(_: Request, exc: RecursionError) -> Response:
        return error_response("request body: nested too deeply; fix: send flat section.key values",
                      400)

    @app.exception_handler(Exception)
    async def bug(_: Request, exc: Exception) -> Response:  # a bug, still one JSON line
        return error_response(f"internal error ({type(exc).__name__}: {cut(str(exc), 200)}); "
                      "please report it with the scenario", 500)

    @app.get("/")
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/vendor/plotly.min.js")
    def plotly_js() -> FileResponse:
        return FileResponse(PLOTLY_JS, media_type="text/javascript",
                            headers={"Cache-Control": "public, max-age=86400"})

    @app.get("/favicon.ico")
    def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/api/meta")
    def meta() -> dict[str, Any]:
        return {
            "default_state": default_state(),
            "controls": lab_controls(),  # from the scenario's field declarations
            "gpus": gpu_names(),
            "models": model_names(),
            "kv_dtypes": ["auto", *KV_DTYPES],
            "weight_dtypes": ["auto", *WEIGHT_DTYPES],
            "limits": {"max_requests": LAB_MAX_REQUESTS, "max_gpus": LAB_MAX_GPUS},
        }

    @app.post("/api/update")
    def update(body: StateIn) -> Response:
        full = scenario(body.state)
        for n in PREVIEW_STEPS if body.preview else (0,):
            s, caps = _capped(full, n)
            out = _update(s, caps, full)
            lat = out["simulate"]["latency"]
            if not body.preview or _precise(lat["p99_ms"], lat["p99_interval_ms"]):
                break
        return json_response({**out, "preview": body.preview and any(
            c.startswith("preview") for c in caps)})

    @app.post("/api/charts")
    def charts(body: StateIn) -> Response:
        return json_response(_charts(_capped(scenario(body.state))[0]))

    @app.post("/api/paging")
    def paging(body: PagingIn) -> Response:
        return json_response(_paging(_pool_part(scenario(body.state)), body.requests,
                                     body.max_len or None, body.prefix_tokens))

    @app.get("/api/seed")
    def seed() -> Response:
        return json_response(_seed_rows())

    @app.post("/api/llm")
    def llm(body: LlmIn) -> Response:
        return json_response(_llm(body.model_dump_json(), cfg.data_dir))

    @app.get("/api/drift/meta")
    def drift_meta() -> Response:
        return json_response(drift_lab.meta())

    @app.post("/api/drift")
    def drift_update(body: DriftIn) -> Response:
        return json_response(drift_lab.compute(body))

    @app.post("/api/parse")
    def parse(body: TomlIn) -> dict[str, Any]:
        raw = parse_toml(body.toml, "scenario file")
        s = scenario_from_dict(raw, base_dir=cfg.data_dir, sandbox=True)
        # A file the scenario names must be one the lab may open: check it now, not on the
        # first update, so Load TOML says what is wrong at once.
        for field, path in (("[workload] trace_csv", s.workload.trace_csv),
                            ("[model] csv", s.model.csv)):
            if path:
                s.resolve_path(path, field)
        for _, path in s.model.perf_analyzer_csv:
            s.resolve_path(path, "[model] perf_analyzer_csv")
        lab = lab_view(raw)
        check_feature(lab.get("drift", {}).get("feature"))
        return {"state": flatten(scenario_to_dict(s)), "lab": lab}

    return app


app = create_app()


def run_lab(config: LabConfig, host: str, port: int, say: Callable[[str], None]) -> None:
    """`servelab lab`: serve the lab until Ctrl+C (or SIGTERM), saying where on `say`."""
    import os
    import sys
    import threading

    import uvicorn

    from servelab.http import ConnectionLimits, check_can_listen, guarded_http_protocol

    lab_app = create_app(config)
    check_can_listen(host, port)
    # The first page's answers are ready before it can ask (on a first run this includes
    # compiling the simulator, about 15 s; later runs load the compiled code).
    say("servelab lab: preparing the seed scenario...")
    warm(lab_app)
    say(f"servelab lab on [bold]http://{host}:{port}[/] (Ctrl+C to stop)")
    # Ctrl+C (or SIGTERM): uvicorn starts its graceful shutdown, and a watchdog ends the
    # process 0.6 s later whatever is still running: a simulation on a worker thread
    # cannot be interrupted, and nothing the lab holds needs flushing.

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            threading.Timer(0.6, _quit).start()
            super().handle_exit(sig, frame)

    def _quit() -> None:
        background.stop()  # the paging worker process goes with the lab
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    try:
        Server(uvicorn.Config(lab_app, host=host, port=port, log_level="warning",
                              timeout_graceful_shutdown=1, http=guarded_http_protocol(
                                  ConnectionLimits().fitted_to_file_limit()))).run()
    except KeyboardInterrupt:  # uvicorn re-raises the signal it caught once it has stopped
        pass
    finally:
        _quit()
