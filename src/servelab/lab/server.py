"""The lab's HTTP side: a static page and a JSON API over the same functions as the CLI.

Every number the page shows comes from here; the page only formats and draws.
Nothing is fetched from outside: plotly.js is served from the installed
`plotly` package.
"""

from __future__ import annotations

import json
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import plotly
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel

from servelab.api import run_plan, run_simulate, run_sweep
from servelab.catalog import gpu_names
from servelab.errors import InputError, ServelabError
from servelab.llm.kv import KV_DTYPES, WEIGHT_DTYPES
from servelab.llm.models import model_names
from servelab.llm.pool import kv_report, pool_spec, run_paging
from servelab.scenario import (
    Scenario,
    flatten,
    load_scenario,
    scenario_from_dict,
    scenario_from_flat,
    scenario_to_dict,
    scenario_to_toml,
)

STATIC = Path(str(resources.files("servelab.lab").joinpath("static")))
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"

# Charts are sweeps of many simulations: fewer requests each keeps a slider live.
CHART_REQUESTS = 5_000
PAGING_REQUESTS = 400

_pool = ThreadPoolExecutor(max_workers=2)


class StateIn(BaseModel):
    state: dict[str, Any]


class TomlIn(BaseModel):
    toml: str


def _scenario(state: dict[str, Any]) -> Scenario:
    return _cached_scenario(tuple(sorted((k, _hashable(v)) for k, v in state.items())))


def _hashable(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


@lru_cache(maxsize=256)
def _cached_scenario(items: tuple[tuple[str, Any], ...]) -> Scenario:
    return scenario_from_flat({k: list(v) if isinstance(v, tuple) else v for k, v in items})


def default_state() -> dict[str, Any]:
    return flatten(scenario_to_dict(load_scenario("seed")))


@lru_cache(maxsize=128)
def _update(s: Scenario) -> dict[str, Any]:
    sim = _pool.submit(run_simulate, s)
    planned = _pool.submit(run_plan, s)
    kv = kv_report(pool_spec(s)).to_dict() if s.llm is not None else None
    sim_r, plan_d = sim.result(), planned.result().to_dict()  # to_dict: NaN becomes null
    return {
        "simulate": sim_r.to_dict(),
        "plan": {
            "num_gpus": plan_d["plan"]["num_gpus"],
            "cost_per_million_usd": plan_d["plan"]["cost_per_million_usd"],
            "meets_slo": plan_d["plan"]["meets_slo"],
            "verdict": plan_d["plan"]["verdict"],
            "p99_ms": plan_d["latency"]["p99_ms"],
            "busy_fraction": plan_d["gpu"]["busy_fraction"],
        },
        "kv": kv,
        "toml": scenario_to_toml(s),
        "state": flatten(scenario_to_dict(s)),
    }


def _around(x: float, lo: float, n: int, factor: float = 2.0) -> list[float]:
    hi = max(x * factor, lo * 2)
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)]


@lru_cache(maxsize=64)
def _charts(s: Scenario) -> dict[str, Any]:
    light = replace(s, workload=replace(s.workload, num_requests=min(
        CHART_REQUESTS, s.workload.num_requests)))
    delay_us = s.batching.max_queue_delay_microseconds
    windows = sorted({int(round(v, -1)) for v in _around(delay_us, 0, 7, 2.5)} | {delay_us})
    qps = s.workload.qps
    rates = [round(v, 1) for v in _around(qps, qps / 8, 7, 2.0)]
    w = _pool.submit(run_sweep, light, "max_queue_delay_us", windows)
    q = _pool.submit(run_sweep, light, "qps", rates)
    return {"window_sweep": w.result(), "qps_sweep": q.result(),
            "requests_per_point": light.workload.num_requests}


@lru_cache(maxsize=32)
def _paging(s: Scenario) -> dict[str, Any]:
    ctx = s.llm.context_tokens if s.llm is not None else 4096
    report = run_paging(s, num_requests=PAGING_REQUESTS, max_len=min(ctx, 2048),
                        prefix_tokens=256)
    out = report.to_dict()
    for r in out["results"]:
        r.pop("series", None)  # the page shows averages; the CLI's --json has the series
    by = {r["strategy"]: r for r in out["results"]}
    out["summary"] = {  # the figures the page's read-outs name, picked out here
        "paged_seqs": by["paged"]["mean_concurrency"],
        "contiguous_seqs": by["contiguous_max"]["mean_concurrency"],
        "paged_token_share": by["paged"]["under_load"]["token"],
        "contiguous_token_share": by["contiguous_max"]["under_load"]["token"],
    }
    return out


def _json(obj: dict[str, Any]) -> Response:
    """Reports are plain JSON already: skip FastAPI's recursive encoder (it costs more
    than the simulation's report on a slider move)."""
    return Response(json.dumps(obj, allow_nan=False), media_type="application/json")


def create_app() -> FastAPI:
    app = FastAPI(title="servelab lab", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.exception_handler(ServelabError)
    async def user_error(_: Request, exc: ServelabError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=400)

    @app.get("/")
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/vendor/plotly.min.js")
    def plotly_js() -> FileResponse:
        return FileResponse(PLOTLY_JS, media_type="text/javascript")

    @app.get("/favicon.ico")
    def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/api/meta")
    def meta() -> dict[str, Any]:
        return {
            "default_state": default_state(),
            "gpus": gpu_names(),
            "models": model_names(),
            "kv_dtypes": ["auto", *KV_DTYPES],
            "weight_dtypes": ["auto", *WEIGHT_DTYPES],
        }

    @app.post("/api/update")
    def update(body: StateIn) -> Response:
        return _json(_update(_scenario(body.state)))

    @app.post("/api/charts")
    def charts(body: StateIn) -> Response:
        return _json(_charts(_scenario(body.state)))

    @app.post("/api/paging")
    def paging(body: StateIn) -> Response:
        s = _scenario(body.state)
        # Only the LLM pool matters here: key the cache on it alone.
        return _json(_paging(replace(Scenario(), hardware=s.hardware, llm=s.llm)))

    @app.post("/api/parse")
    def parse(body: TomlIn) -> dict[str, Any]:
        try:
            raw = tomllib.loads(body.toml)
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"scenario file: not valid TOML ({exc}); "
                             "fix: load a file `servelab` or the lab exported") from None
        return {"state": flatten(scenario_to_dict(scenario_from_dict(raw)))}

    return app


app = create_app()
