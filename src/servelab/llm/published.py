"""Published serving measurements, and how far the simulator is from each.

The cases live in ``servelab/data/published_llm.toml`` (each with its source); this module
runs a case the way its source ran it (deployment, engine settings, load, lengths) and
compares the simulator's medians and throughput to the measured ones. The step model's
constants (``StepParams``) are fitted on the cases marked "fit" with ``servelab.llm.fit``
(bench/fit_published_llm.py) and held to the "hold-out" ones
(tests/unit/test_llm_published.py; the table in docs/llm.md).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import numpy as np

from servelab.catalog import get_gpu
from servelab.llm.fit import FIGURES as FIT_FIGURES
from servelab.llm.fit import Run, predict
from servelab.llm.kv import PoolSpec
from servelab.llm.models import get_model
from servelab.llm.serving import StepParams, Workload

FIGURES = ("ttft_p50_ms", "tpot_p50_ms", "output_tokens_per_s", "output_tokens_per_s_gain")


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    engine: str
    source: str
    model: str
    gpu: str
    tp: int
    scheduler: str  # "prefill-first", "sglang" or "v1"
    max_num_batched_tokens: int
    max_num_seqs: int
    gpu_memory_utilization: float
    request_rate: float
    num_prompts: int
    max_concurrency: int
    lengths: tuple[np.ndarray, np.ndarray] | None
    # the run's own mean prompt and output tokens a request, where its source gives them
    # (its total and output tokens/s over requests/s): each draw of `lengths` is held to
    # them (`_lengths_for`)
    mean_lengths: tuple[float, float] | None
    prompt_tokens: int
    output_tokens: int
    measured: dict[str, float]
    not_modelled: dict[str, str]
    gain_over: str | None
    use: str  # "fit" or "hold-out"
    num_scheduler_steps: int = 1  # vLLM 0.6's --num-scheduler-steps
    pp: int = 1  # vLLM's --pipeline-parallel-size
    # the run's own requests, prompt and output tokens each, in the order sent, where the
    # source lists them: the case runs them as they are (one draw), not drawn from a sample
    requests: tuple[np.ndarray, np.ndarray] | None = None
    # figures of a "fit" case the fit did not use, held like hold-outs, and why
    not_fitted: dict[str, str] = field(default_factory=dict)
    weight_dtype: str = "auto"  # the checkpoint's weights where not the model's ("fp8")

    def use_of(self, figure: str) -> str:
        """"fit" where the fit used this figure, else "hold-out" (a hold-out case's, or a
        fit case's figure it left out: not_fitted)."""
        return "hold-out" if self.use == "hold-out" or figure in self.not_fitted else "fit"

    def figures(self) -> list[str]:
        """The measured figures the model is compared on (not the ones it leaves out)."""
        return [f for f in FIGURES if f in self.measured and f not in self.not_modelled]


@dataclass(frozen=True, slots=True)
class Row:
    case: Case
    figure: str
    measured: float
    predicted: float
    modelled: bool

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1

    @property
    def use(self) -> str:
        """The figure's use: Case.use_of."""
        return self.case.use_of(self.figure)


@cache
def _raw() -> dict[str, Any]:
    text = resources.files("servelab.data").joinpath("published_llm.toml").read_text("utf-8")
    return tomllib.loads(text)


@cache
def _lengths(name: str) -> tuple[np.ndarray, np.ndarray]:
    from servelab.llm.paging import read_lengths_csv

    csv = _raw()["workloads"][name]["csv"]
    with resources.as_file(resources.files("servelab.data").joinpath(csv)) as path:
        return read_lengths_csv(path, 100_000, f"[workloads.{name}] csv")


def _requests(c: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """A case's `requests` table as arrays; an output the client recorded as 0 tokens (no
    text came back: the model ended at once) is one token, the end it generated."""
    if "requests" not in c:
        return None
    prompt = np.asarray(c["requests"]["prompt"], np.int64)
    output = np.maximum(np.asarray(c["requests"]["output"], np.int64), 1)
    if prompt.size != output.size or prompt.size != int(c["num_prompts"]) or (prompt < 1).any():
        raise ValueError(f"case {c['id']}: requests needs {c['num_prompts']} prompt and "
                         "output lengths, prompts of at least 1 token")
    return prompt, output


def cases() -> list[Case]:
    out = []
    for c in _raw()["case"]:
        measured = {k: float(v) for k, v in c["measured"].items() if k != "gain_over"}
        out.append(Case(
            id=c["id"], engine=c["engine"], source=c["source"], model=c["model"],
            gpu=c["gpu"], tp=int(c["tp"]), scheduler=c["scheduler"],
            max_num_batched_tokens=int(c["max_num_batched_tokens"]),
            max_num_seqs=int(c["max_num_seqs"]),
            gpu_memory_utilization=float(c["gpu_memory_utilization"]),
            request_rate=float(c["request_rate"]), num_prompts=int(c["num_prompts"]),
            max_concurrency=int(c.get("max_concurrency", 0)),
            lengths=_lengths(c["workload"]) if "workload" in c else None,
            mean_lengths=((float(c["mean_lengths"]["prompt"]),
                           float(c["mean_lengths"]["output"]))
                          if "mean_lengths" in c else None),
            prompt_tokens=int(c.get("prompt_tokens", 0)),
            output_tokens=int(c.get("output_tokens", 0)),
            measured=measured, not_modelled=dict(c.get("not_modelled", {})),
            gain_over=c["measured"].get("gain_over"), use=c["use"],
            num_scheduler_steps=int(c.get("num_scheduler_steps", 1)),
            pp=int(c.get("pp", 1)),
            requests=_requests(c),
            not_fitted=dict(c.get("not_fitted", {})),
            weight_dtype=str(c.get("weight_dtype", "auto"))))
    return out


# A draw held to a run's stated means (Case.mean_lengths) is within this share of each,
# taken from at most MEAN_TRIES draws of the sample (about 1 in 20 of 200-request draws
# passes at 2%)
MEAN_TOLERANCE = 0.02
MEAN_TRIES = 10_000


def _lengths_for(case: Case, seed: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The case's requests drawn from its length sample, with replacement (the benchmark
    clients sample their dataset the same way, prompts in random order). Where the source
    gives the run's mean prompt and output tokens a request, the draw is the first of the
    seed's draws within MEAN_TOLERANCE of both: a run's TTFT rests on how long its
    prompts were (a 200-request draw's mean prompt spreads by about 8%, and its TTFT
    median with it), and those means are what is known of the prompts it sent."""
    if case.requests is not None:
        return case.requests
    if case.lengths is None:
        return None
    rng = np.random.default_rng(seed)
    prompt, output = case.lengths
    for _ in range(MEAN_TRIES if case.mean_lengths else 1):
        pick = rng.integers(0, prompt.size, case.num_prompts)
        p, o = prompt[pick], output[pick]
        if case.mean_lengths is None or all(
                abs(float(x.mean()) / m - 1) <= MEAN_TOLERANCE
                for x, m in zip((p, o), case.mean_lengths, strict=True)):
            return p, o
    raise ValueError(f"case {case.id}: no draw of {case.num_prompts} requests from its "
                     f"length sample came within {MEAN_TOLERANCE:.0%} of the run's mean "
                     f"lengths {case.mean_lengths} in {MEAN_TRIES:,} tries")


def to_run(case: Case, seed: int = 0) -> Run:
    """The case as `llm fit` takes a run: its deployment, load and modelled figures."""
    spec = PoolSpec(model=get_model(case.model), gpu=get_gpu(case.gpu), tp=case.tp,
                    pp=case.pp, weight_dtype=case.weight_dtype, num_gpus=case.tp * case.pp,
                    gpu_memory_utilization=case.gpu_memory_utilization,
                    max_num_batched_tokens=case.max_num_batched_tokens,
                    max_num_seqs=case.max_num_seqs, context_tokens=4096)
    w = Workload(request_rate=case.request_rate, num_requests=case.num_prompts,
                 prompt_tokens=case.prompt_tokens or 512,
                 output_tokens=case.output_tokens or 256, seed=seed,
                 max_concurrency=case.max_concurrency, lengths=_lengths_for(case, seed))
    measured = {f: case.measured[f] for f in case.figures()
                if f in FIT_FIGURES and case.use_of(f) == "fit"}
    return Run(case.id, spec, w, case.scheduler in ("prefill-first", "sglang"), measured,
               case.num_scheduler_steps, sglang=case.scheduler == "sglang")


# A published run of a few hundred requests is one draw: its medians move by several
# percent with the arrival times and prompts drawn (a 200-request ShareGPT run at 4/s:
# TTFT median -19% to -31% of the published one over three seeds). Below this many
# requests the prediction is the mean over DRAWS draws of the case's own size.
FEW_REQUESTS = 1000
DRAWS = 16


def draws(case: Case) -> int:
    """How many draws of the case the prediction averages (one where the case lists its
    own requests and sends them at once: nothing is left to draw)."""
    if case.requests is not None and np.isinf(case.request_rate):
        return 1
    return DRAWS if case.num_prompts < FEW_REQUESTS else 1


def to_runs(case: Case, seed: int = 0) -> list[Run]:
    """The case as runs of its own size, one per draw (`draws`)."""
    return [to_run(case, seed + k) for k in range(draws(case))]


def simulate_case(case: Case, params: StepParams, seed: int = 0) -> dict[str, float]:
    """The simulator's figures for one case: TTFT and TPOT medians (ms), output tokens/s,
    each the mean over the case's draws."""
    figs = [predict(r, params) for r in to_runs(case, seed)]
    return {k: float(np.mean([f[k] for f in figs])) for k in figs[0]}


def compare(params: StepParams, only: str | None = None, seed: int = 0) -> list[Row]:
    """Every case's figures, measured beside predicted (`only`: "fit" or "hold-out")."""
    all_cases = cases()
    by_id = {c.id: c for c in all_cases}
    sims: dict[str, dict[str, float]] = {}

    def sim(c: Case) -> dict[str, float]:
        if c.id not in sims:
            sims[c.id] = simulate_case(c, params, seed)
        return sims[c.id]

    rows = []
    for c in all_cases:
        for fig in FIGURES:
            if fig not in c.measured:
                continue
            if only and c.use_of(fig) != only:
                continue
            if fig == "output_tokens_per_s_gain":
                base = by_id[c.gain_over or ""]
                pred = (sim(c)["output_tokens_per_s"] / sim(base)["output_tokens_per_s"])
            else:
                pred = sim(c)[fig]
            rows.append(Row(c, fig, c.measured[fig], pred, fig not in c.not_modelled))
    return rows
