"""`servelab llm validate`: profile an OpenAI-compatible LLM server, fit the LLM
simulator's step model to it, load it, and set the prediction beside the measurement.

1. **limits**: the server's scheduling rule (`llama.cpp` or `vllm-v1`, see llm/rules.py)
   and its limits, from llama.cpp's `/props` (slots, context per slot) or flags;
2. **profile** by controlled runs:
   - prefill: one request at a time at three prompt lengths; the step's time is the
     server's own `timings.prompt_ms` where it gives one (llama.cpp), else its engine's
     `vllm:request_prefill_time_seconds` over that request (vLLM), else the client's
     TTFT; the client's TTFT less it, at the median, is the time outside the steps
     (HTTP, tokenizing, the wait for the server's next loop): `overhead_ms`;
   - decode: c requests at once (c = 1, 2, slots) after prompts of two lengths; the
     mean gap between chunks in the middle of their streams (the median of three runs,
     each on new prompts) is a step of c decodes reading their KV;
   - mixed: a prompt joining running decodes, the gap in a running stream that the
     prompt's first token ends (the steps a load makes; prefill alone put their fixed
     cost 12-20 ms short);
   - llama.cpp: every profile request pinned to a slot (`id_slot`: prefills on 0, c
     decodes on 0 .. c-1, a joining prompt on c), so each row knows the ubatches (passes
     over the model) the server cut its step into (llm/llama_cpp.py);
   - fit: `ProfileStepModel` (step_ms = base + per prefill token + per decode sequence
     + per KV token read, each ≥ 0; base and multi-token term per pass) by least squares
     in relative error over those rows
     (10 ms decode steps beside 500 ms prefills: in plain ms the prefills set the
     intercept and the decodes came out 20% short against llama-server);
3. **saturation**, measured before the profile, since the load steps' rates follow
   from it: the throughput with the server always full (a closed loop of twice the
   slots), and predicted by the simulator on the same lengths from the profile measured
   just after it;
4. **load** at shares of it (default 30%, 60%, 85%), Poisson, and the simulator on the
   same intended arrival times and the lengths the server counted; TTFT and E2EL get the
   overhead added (it is outside the steps);
   By default (`reprofile`) the whole profile is measured again on new prompts before
   each step but the first (the first profile ran just before it) and once after the
   last, and each step is predicted from the two profiles
   around it (their rows pooled and fitted again), the first profile's figures kept
   beside (the server's speed moves for minutes at a time on shared machines: one
   profile just before a step took one TPOT p50 from -54% to +14% where the server had
   slowed 40%, and missed by more where it caught a moment's speed; in nine bench runs
   on the AMD VM, 2026-12-04, the two around it held TPOT p50 within 10% in 14 of 18
   steps and met every p50 and p99 in 4 runs, the first profile in 7 of 18 and 2 runs;
   docs/llm-measure.md). With `--no-reprofile` a **probe** (one decode stream,
   as the profile's first decode row) before each step says how far the server's speed
   has moved since the profile (noted past 5%). Against
   llama.cpp, a short request on each slot, highest id first, then sets the server's
   least-recently-used order to a fresh server's, the order the simulator starts from
   (`touch_slots`; also before the saturation run);
5. **compare**: TTFT, TPOT and E2EL p50/p90/p99 and throughput, predicted / measured
   with % error, judged against ±10% (p50), ±15% (p90), ±20% (p99), ±5% (throughput),
   ±10% (saturation); a diagnosis: the client (sent late?), the scheduling (the steps
   the simulator ran against the server's own count: llama.cpp's decode calls, vLLM's
   iterations),
   or the step model (TPOT off while the steps agree).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any

import aiohttp
import numpy as np

from servelab.errors import StoreError, invalid
from servelab.llm.llama_cpp import LlamaCppConfig, Seq, split_equal
from servelab.llm.rules import (
    LLAMA_CPP_N_BATCH,
    LLAMA_CPP_N_UBATCH,
    SchedulingRule,
    llama_cpp,
    simulate,
    vllm_v1,
)
from servelab.llm.serving import (
    ProfileStepModel,
    Requests,
    SchedulerConfig,
    ServingResult,
)
from servelab.measure.llm_load import (
    Endpoint,
    LoadPlan,
    counter_diff,
    model_name,
    new_session,
    read_bounded,
    read_metrics,
    run_step,
    tokens_per_word,
)
from servelab.measure.llm_metrics import RunRecords, compute, request_times
from servelab.measure.llm_workload import LlmRequest, random_requests

TOLERANCE = {"p50": 10.0, "p90": 15.0, "p99": 20.0, "throughput": 5.0, "saturation": 10.0}
# within one of llama.cpp's 512-token micro-batches; each row is the median of
# PREFILL_REPEATS prompts (one prompt's time moved 25% from one profile to another on
# the AMD VM, 2026-12-04), so the prefill rows weigh in the fit as before
PREFILL_LENGTHS = (64, 128, 192, 320, 448)
PREFILL_REPEATS = 3
DECODE_PROMPTS = (32, 448)  # two contexts, so KV read and sequences can be told apart
DECODE_TOKENS = 48
DRIFT_NOTE_PCT = 5.0  # a decode probe this far from the profile is noted
# each kind of request draws its prompts from its own indices (a test holds the ranges
# apart, and under the words' limit, about 40M): the load steps from 0, then these
PROFILE_INDEX = 10_000_000  # the profile's prompt indices
PROBE_INDEX = 11_100_000
TOUCH_INDEX = 12_200_000  # the slot touches' prompt indices
REPROFILE_INDEX = 13_300_000  # the profile again before load step k: k * REPROFILE_SPAN on
# (and after the last step: len(shares) * REPROFILE_SPAN on)
SEED_SPREAD = 331  # seeds apart by other than a multiple of this share no index words
# prompt indices a seed's profile (or its probes, or its slot touches) may use: a profile
# of PROFILE_MAX_SEQS sequences with every mixed row tried MIXED_TRIES times uses 3,159
# (`profile_indices`; until 2026-12-06 1,000, which a profile of more than 76 slots ran past)
SEED_STRIDE = 3_200
# the most sequences the profile runs at once (vLLM's default max_num_seqs): a server of
# more slots is profiled at this many, and the fit carries its sequence term past them
PROFILE_MAX_SEQS = 256
# validate sets a llama.cpp server's slot order by touching each slot before every step,
# on indices of the seed's own: at most this many slots
LLAMA_CPP_MAX_SLOTS = PROFILE_MAX_SEQS
REPROFILE_SPAN = SEED_SPREAD * SEED_STRIDE  # every seed's profile before one load step
# a profile request whose prompt the server served this much of from its cache is refused
# (a new prompt shares its first token or two with the slot's last one at most)
PROFILE_CACHED_SHARE = 0.25
DECODE_EACH_UP_TO = 4  # decode rows at each count 1..this, and at all slots
# each decode row is the median of this many runs: one run of the AVX2 VM came out 55%
# slow, and the least of two (until 2026-12-04) read the step low where a load's TPOT
# averages typical steps
DECODE_REPEATS = 3
SKIP_GAPS = 8  # a decode stream's first gaps, shared with other requests' prefills
MIXED_PROMPTS = (64, 192)  # prompts joining running decodes: the steps a load mixes
DECODE_PROMPT_MIXED = 32
# the running streams' tokens: at least this many, more where the server's steps are
# fast (mixed_stream_tokens: at 160 tokens a stream of 3.5 ms steps ended before the
# prompt came, the AMD VM, 2026-12-04), at most the most
MIXED_TOKENS = 160
MIXED_TOKENS_MAX = 2_000
MIXED_MARGIN = 1.5  # the streams run this many times the time the prompt needs to join
MIXED_DELAY_S = 0.6
# a mixed step's gap is at least this many of the stream's median gaps (a 64-token
# prompt's prefill takes about 90 ms on the test's llama-server, a decode step 5)
MIXED_MIN_RATIO = 2.0
# the mixed step ends within this many decode steps of the joining prompt's first token
# on the client (its first chunk came 0.1-4.7 ms after the stream's, 2026-12-04), and
# within JOIN_FLOOR_MS however short the steps
JOIN_STEPS = 2.0
JOIN_FLOOR_MS = 6.0
# and holds at least this share of the prompt's own time by the server's clock
MIXED_MIN_SHARE = 0.5
# a mixed row not seen is tried again with new prompts, at most this many times in all
# while the seed's prompt indices last (a CI run of 2026-12-06 saw none of the four on the
# test's llama-server; a busy machine's client reads a stream's chunks in bunches)
MIXED_TRIES = 3
# a fit that misses a row of its own profile by more than this is noted (quiet runs on
# the AMD VM, 2026-12-04: 33-36% at worst, the mixed rows of 65-token prompts)
FIT_NOTE_PCT = 50.0


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What the scheduler is given, and where each figure came from."""

    rule: SchedulingRule
    slots: int  # max_num_seqs
    ctx_per_slot: int
    max_num_batched_tokens: int
    source: str
    n_ubatch: int = LLAMA_CPP_N_UBATCH  # llama.cpp's -ub (not reported: its default)

    @property
    def num_blocks(self) -> int:
        """The KV the slots hold, in 16-token blocks."""
        return self.slots * -(-self.ctx_per_slot // 16)

    def scheduler(self) -> SchedulerConfig | LlamaCppConfig:
        if self.rule is SchedulingRule.LLAMA_CPP:
            return llama_cpp(self.slots, self.ctx_per_slot, self.max_num_batched_tokens,
                             self.n_ubatch)
        return vllm_v1(self.num_blocks, 16, self.slots, self.max_num_batched_tokens)

    def passes(self, batch: list[Seq]) -> tuple[int, int]:
        """The passes over the model the server makes of a batch (llama.cpp: its
        ubatches; vLLM: one), and how many of them hold two or more tokens."""
        if self.rule is SchedulingRule.LLAMA_CPP:
            ub = split_equal(batch, self.n_ubatch)
            return len(ub), sum(u.tokens >= 2 for u in ub)
        return 1, int(sum(s.new for s in batch) >= 2)


@dataclass(frozen=True, slots=True)
class Profile:
    """The controlled runs' rows and the step model fitted to them."""

    prefill_tokens: tuple[int, ...]
    decode_seqs: tuple[int, ...]
    kv_tokens_read: tuple[float, ...]
    step_ms: tuple[float, ...]
    overhead_ms: float
    model: ProfileStepModel
    server_timed: bool  # prefill steps from the server's own timings
    # each row's passes over the model (llama.cpp's ubatches) and those of 2+ tokens
    passes: tuple[int, ...] = ()
    multi_passes: tuple[int, ...] = ()
    # ms more on the 1st, 2nd, ... decode step after a prompt (`after_prefill_extra_ms`)
    after_prefill_ms: tuple[float, ...] = ()

    @classmethod
    def fitted(cls, prefill: Any, decodes: Any, kv: Any, ms: Any, passes: Any, multi: Any,
               overhead_ms: float, server_timed: bool, after_prefill: Any = ()) -> Profile:
        """The rows and the step model `llm validate` fits to them: least squares in
        relative error, the base and the two-or-more-tokens term per pass; the steps
        after a prompt cost `after_prefill` ms more (measured apart from the rows)."""
        model = ProfileStepModel.fit(np.array(prefill, float), np.array(decodes, float),
                                     np.array(kv, float), np.array(ms, float),
                                     source="llm validate", relative=True,
                                     passes=np.array(passes, float),
                                     multi_passes=np.array(multi, float))
        after = tuple(float(x) for x in after_prefill)
        return cls(tuple(int(x) for x in prefill), tuple(int(x) for x in decodes),
                   tuple(float(x) for x in kv), tuple(float(x) for x in ms), overhead_ms,
                   replace(model, after_prefill_ms=after), server_timed,
                   tuple(int(x) for x in passes), tuple(int(x) for x in multi), after)

    @classmethod
    def pooled(cls, *profiles: Profile) -> Profile:
        """One profile of every row of `profiles`, fitted again: `--reprofile` predicts a
        load step from the profiles measured just before and just after it."""
        cols = [p.pass_columns() for p in profiles]
        return cls.fitted([x for p in profiles for x in p.prefill_tokens],
                          [x for p in profiles for x in p.decode_seqs],
                          [x for p in profiles for x in p.kv_tokens_read],
                          [x for p in profiles for x in p.step_ms],
                          [x for c in cols for x in c[0]], [x for c in cols for x in c[1]],
                          float(np.mean([p.overhead_ms for p in profiles])),
                          all(p.server_timed for p in profiles),
                          pooled_after_prefill([p.after_prefill_ms for p in profiles]))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        """A profile `to_dict` wrote (validation.json's), fitted again from its rows."""
        rows = d["rows"]

        def col(key: str) -> list[Any]:
            return [r[key] for r in rows]

        return cls.fitted(col("prefill_tokens"), col("decode_seqs"), col("kv_tokens_read"),
                          col("step_ms"), col("passes"), col("multi_token_passes"),
                          float(d["overhead_ms"]), bool(d["server_timed"]),
                          d.get("after_prefill_ms", ()))

    @property
    def one_decode_ms(self) -> float:
        """The step of one decode stream after a short prompt (the first decode row)."""
        return self.step_ms[self.decode_seqs.index(1)]

    def fit_note(self) -> tuple[str, ...]:
        """A line where the step model misses a row of its own profile by more than
        FIT_NOTE_PCT, naming the row without which the rest fit best: one row the server
        did not run as profiled can pull a relative fit of every other far off (a lone
        10.6 ms "mixed step" once put every prefill 80-90% short), and every prediction
        rests on that fit."""
        if self.model.max_abs_error_pct <= FIT_NOTE_PCT or len(self.step_ms) < 2:
            return ()
        passes, multi = self.pass_columns()
        cols = (self.prefill_tokens, self.decode_seqs, self.kv_tokens_read, self.step_ms,
                passes, multi)

        def without(i: int) -> float:
            p, d, k, ms, n, x = ([c[j] for j in range(len(c)) if j != i] for c in cols)
            return Profile.fitted(p, d, k, ms, n, x, self.overhead_ms, self.server_timed,
                                  self.after_prefill_ms).model.max_abs_error_pct

        left = [without(i) for i in range(len(self.step_ms))]
        i = int(np.argmin(left))
        return (f"profile fit: the step model misses its own profile by up to "
                f"{self.model.max_abs_error_pct:.0f}%; without the row of "
                f"{self.prefill_tokens[i]} prompt tokens and {self.decode_seqs[i]} decodes "
                f"({self.step_ms[i]:.1f} ms) the rest fit within {left[i]:.0f}%: the server "
                "did not run that row as profiled, and every prediction here rests on this "
                "fit; run validate again on a quiet server",)

    def pass_columns(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """passes and multi_passes, one pass a row where the profile did not say."""
        if self.passes:
            return self.passes, self.multi_passes
        return ((1,) * len(self.step_ms),
                tuple(int(p + d >= 2) for p, d in zip(self.prefill_tokens, self.decode_seqs,
                                                       strict=True)))

    def to_dict(self) -> dict[str, Any]:
        m = self.model
        passes, multi = self.pass_columns()
        return {"rows": [{"prefill_tokens": p, "decode_seqs": d, "kv_tokens_read": k,
                          "step_ms": s, "passes": n, "multi_token_passes": x}
                         for p, d, k, s, n, x in zip(
                              self.prefill_tokens, self.decode_seqs, self.kv_tokens_read,
                              self.step_ms, passes, multi, strict=True)],
                "overhead_ms": self.overhead_ms, "server_timed": self.server_timed,
                "after_prefill_ms": list(self.after_prefill_ms),
                "step_model": {"base_ms": m.base_ms,
                               "per_prefill_token_ms": m.per_prefill_token_ms,
                               "per_decode_seq_ms": m.per_decode_seq_ms,
                               "per_kv_token_ms": m.per_kv_token_ms,
                               "multi_token_ms": m.multi_token_ms,
                               "fit_max_abs_error_pct": m.max_abs_error_pct}}

    def scenario_toml(self, limits: ServerLimits, endpoint: str, *, rate: float,
                      prompt_tokens: float, output_tokens: float) -> str:
        """A scenario `servelab llm simulate --scenario` runs: this profile (steps.csv
        beside it), the server's limits and the load's mean lengths."""
        blocks = limits.num_blocks
        rule = "llama.cpp" if limits.rule is SchedulingRule.LLAMA_CPP else "v1"
        return f"""# Fitted by `servelab llm validate` against {endpoint} ({limits.rule} rule).
# Step times come from steps.csv (fitted as validate fitted them) and the KV pool from
# num_gpu_blocks_override; [llm] model and the GPU only name the deployment;
# frontend_ms is the time a request spent outside the steps (added to TTFT and E2EL;
# measured whole, so no intake beside it);
# after_prefill_ms the more the first decode steps after a prompt took.
name = "fitted"
description = "llm validate's fit of {endpoint}"

[llm]
scheduler = "{rule}"
step_profile_csv = "steps.csv"
num_gpu_blocks_override = {blocks}
block_size = 16
context_tokens = {limits.ctx_per_slot}
max_num_seqs = {limits.slots}
max_num_batched_tokens = {limits.max_num_batched_tokens}
enable_chunked_prefill = true
enable_prefix_caching = false
frontend_ms = {self.overhead_ms:.6g}
intake_ms = 0
intake_per_token_us = 0
after_prefill_ms = [{", ".join(f"{x:.6g}" for x in self.after_prefill_ms)}]
request_rate = {rate:.6g}
num_requests = 1000
prompt_tokens = {prompt_tokens:.6g}
output_tokens = {output_tokens:.6g}
"""

    def csv(self) -> str:
        """The rows as `llm simulate --step-profile` reads them."""
        lines = ["prefill_tokens,decode_seqs,kv_tokens_read,step_ms,passes,multi_token_passes"]
        lines += [f"{p},{d},{k:.1f},{s:.4f},{n},{x}" for p, d, k, s, n, x in zip(
            self.prefill_tokens, self.decode_seqs, self.kv_tokens_read, self.step_ms,
            *self.pass_columns(), strict=True)]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class Compared:
    """One figure, predicted beside measured."""

    name: str
    predicted: float
    measured: float
    tolerance_pct: float

    @property
    def error_pct(self) -> float:
        if not (math.isfinite(self.predicted) and math.isfinite(self.measured)) or \
                self.measured == 0:
            return math.nan
        return (self.predicted - self.measured) / self.measured * 100

    @property
    def ok(self) -> bool:
        return abs(self.error_pct) <= self.tolerance_pct

    def to_dict(self) -> dict[str, Any]:
        e = self.error_pct
        return {"name": self.name, "predicted": self.predicted, "measured": self.measured,
                "error_pct": None if math.isnan(e) else e,
                "tolerance_pct": self.tolerance_pct, "ok": self.ok}


@dataclass(frozen=True, slots=True)
class SharedSteps:
    """How many requests decoded through another's prompt (`through_prompts`), measured
    and simulated on the same arrivals, of how many, and the mean decode span (first
    token to last) each way: the scheduling's check, apart from the step times."""

    measured: int
    predicted: int
    requests: int
    span_measured_ms: float
    span_predicted_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {"measured": self.measured, "predicted": self.predicted,
                "requests": self.requests, "span_measured_ms": self.span_measured_ms,
                "span_predicted_ms": self.span_predicted_ms}


@dataclass(frozen=True, slots=True)
class RateResult:
    """One load step: the rate, the figures compared, and what the diagnosis found."""

    offered_per_s: float
    share_of_saturation: float
    figures: tuple[Compared, ...]
    steps_predicted: int
    steps_measured: float | None  # the server's own decode calls over the step
    send_late_p99_ms: float
    failed: int
    notes: tuple[str, ...] = ()
    probe_drift_pct: float | None = None  # the decode probe before this step vs profiled
    server_tpot_p50_ms: float | None = None  # TPOT by the server's own clock (llama.cpp)
    # the figures again with the step model refitted on this load's own steps
    given_run_steps: tuple[Compared, ...] = ()
    # with the profile re-measured before this step: that profile (its fit made the
    # figures), and the figures the first profile gave
    profile: Profile | None = None
    first_profile: tuple[Compared, ...] = ()
    # a lone stream's step over the load, least and most of its windows (`lone_speed`)
    lone_step_ms: tuple[float, float] | None = None
    # requests that decoded through another's prompt, measured and simulated, and their
    # mean decode spans in ms (`shared_steps`)
    shared: SharedSteps | None = None

    @property
    def speed_spread_pct(self) -> float | None:
        """How far the machine's speed moved within the step (`lone_speed`), in %."""
        return spread_pct(self.lone_step_ms)

    @property
    def steady(self) -> bool:
        """The server's speed held within SPEED_NOTE_PCT through the step (or nothing
        could tell otherwise): only then do its figures test the model alone."""
        pct = self.speed_spread_pct
        return pct is None or pct <= SPEED_NOTE_PCT

    def to_dict(self) -> dict[str, Any]:
        return {"offered_per_s": self.offered_per_s, "probe_drift_pct": self.probe_drift_pct,
                "lone_step_ms": None if self.lone_step_ms is None else list(self.lone_step_ms),
                "speed_spread_pct": self.speed_spread_pct, "steady": self.steady,
                "server_tpot_p50_ms": self.server_tpot_p50_ms,
                "share_of_saturation": self.share_of_saturation,
                "figures": [f.to_dict() for f in self.figures],
                "steps_predicted": self.steps_predicted, "steps_measured": self.steps_measured,
                "send_late_p99_ms": self.send_late_p99_ms, "failed": self.failed,
                "shared_prompt_steps": None if self.shared is None else self.shared.to_dict(),
                "notes": list(self.notes),
                "given_run_steps": [f.to_dict() for f in self.given_run_steps],
                "profile": None if self.profile is None else self.profile.to_dict(),
                "first_profile": [f.to_dict() for f in self.first_profile]}


@dataclass(frozen=True, slots=True)
class LlmValidationReport:
    endpoint: str
    model: str
    limits: ServerLimits
    profile: Profile
    saturation: Compared
    rates: tuple[RateResult, ...]
    input_tokens: int
    output_tokens: int
    tokens_per_word: float
    mean_prompt_tokens: float  # as the server counted them
    mean_output_tokens: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    # the saturation run's and each load step's raw records (`--out` keeps them)
    records: tuple[RunRecords, ...] = ()

    def fitted_scenario(self) -> str:
        """The scenario TOML `llm simulate` runs (steps.csv beside it), at the middle
        load step's rate."""
        rate = self.rates[len(self.rates) // 2].offered_per_s if self.rates else 1.0
        return self.profile.scenario_toml(self.limits, self.endpoint, rate=rate,
                                          prompt_tokens=self.mean_prompt_tokens,
                                          output_tokens=self.mean_output_tokens)

    @property
    def verdict(self) -> str:
        """"holds", or how many figures missed; where every miss came in a load step
        whose server speed moved (`RateResult.steady`), it says so: those misses are
        the machine's as much as the model's."""
        figures = [self.saturation, *(f for r in self.rates for f in r.figures)]
        bad = [f for f in figures if not f.ok]
        if not bad:
            return "holds"
        text = f"misses on {len(bad)} of {len(figures)} figures"
        missed = [r for r in self.rates if not all(f.ok for f in r.figures)]
        if self.saturation.ok and missed and not any(r.steady for r in missed):
            moved = max(r.speed_spread_pct or 0.0 for r in missed)
            text += (f", each in a step where the server's own speed moved (up to "
                     f"{moved:+.0f}% within it): the machine's as much as the model's; "
                     "run again on a steadier machine")
        return text

    def to_dict(self) -> dict[str, Any]:
        lim = self.limits
        return {"endpoint": self.endpoint, "model": self.model,
                "limits": {"rule": str(lim.rule), "slots": lim.slots,
                           "ctx_per_slot": lim.ctx_per_slot,
                           "max_num_batched_tokens": lim.max_num_batched_tokens,
                           "n_ubatch": lim.n_ubatch, "num_blocks": lim.num_blocks,
                           "source": lim.source},
                "profile": self.profile.to_dict(), "saturation": self.saturation.to_dict(),
                "rates": [r.to_dict() for r in self.rates],
                "workload": {"input_tokens": self.input_tokens,
                             "output_tokens": self.output_tokens,
                             "mean_prompt_tokens": self.mean_prompt_tokens,
                             "mean_output_tokens": self.mean_output_tokens,
                             "tokens_per_word": self.tokens_per_word},
                "verdict": self.verdict, "notes": list(self.notes)}


# ------------------------------------------------------------------- the steps


async def discover_limits(session: aiohttp.ClientSession, base: str, rule: SchedulingRule,
                          slots: int | None, ctx_per_slot: int | None,
                          n_batch: int | None) -> ServerLimits:
    """llama.cpp's /props gives slots and context per slot; flags override or supply."""
    found: dict[str, Any] = {}
    if rule is SchedulingRule.LLAMA_CPP:
        try:
            async with asyncio.timeout(10.0):
                async with session.get(base + "/props") as resp:
                    if resp.status == 200:
                        props = json.loads(await read_bounded(resp))
                        if isinstance(props, dict):
                            found["slots"] = props.get("total_slots")
                            dgs = props.get("default_generation_settings")
                            if isinstance(dgs, dict):
                                found["ctx"] = dgs.get("n_ctx")
        except (TimeoutError, aiohttp.ClientError, ValueError, RecursionError):
            pass
    s = slots or (found.get("slots") if isinstance(found.get("slots"), int) else None)
    c = ctx_per_slot or (found.get("ctx") if isinstance(found.get("ctx"), int) else None)
    if s is None or c is None:
        raise StoreError(f"--url {base}: the server did not say its slots and context per "
                         "slot (llama.cpp's /props); fix: give --max-num-seqs and "
                         "--context-per-seq")
    src = "flags" if slots and ctx_per_slot else ("/props" if not (slots or ctx_per_slot)
                                                  else "/props and flags")
    nb = n_batch or LLAMA_CPP_N_BATCH
    if n_batch is None:
        src += f"; max_num_batched_tokens {nb} is llama.cpp's default -b (not reported)"
    if rule is SchedulingRule.LLAMA_CPP:
        src += f"; n_ubatch {LLAMA_CPP_N_UBATCH} is its default -ub (not reported)"
    if rule is SchedulingRule.LLAMA_CPP and s > LLAMA_CPP_MAX_SLOTS:
        raise invalid("--max-num-seqs" if slots else "llama.cpp's total_slots", s,
                      f"at most {LLAMA_CPP_MAX_SLOTS} slots: validate touches each "
                      "llama.cpp slot before every load step",
                      f"run llama-server with -np {LLAMA_CPP_MAX_SLOTS} or fewer")
    limits = ServerLimits(rule, s, c, nb, src)
    limits.scheduler().check()
    return limits


def _step_gap_ms(rec: RunRecords, i: int) -> float:
    """A decode step of request i's stream, past its first SKIP_GAPS gaps: the mean gap
    between chunks where each chunk is one token (llama.cpp; the mean, as TPOT averages
    its steps: under load on 2026-12-04 a lone stream's mean gap ran 2-5% above its
    median, a slow step now and then); where the server bunches
    tokens into fewer chunks (vLLM's output processor, when it falls behind, sends
    several at once, and the gaps between bunched chunks are near 0), the stream's time
    per output token after the first, as TPOT counts it (all c streams' prompts went in
    the first steps, before their first tokens)."""
    chunks = rec.chunk_ns[i]
    gaps = np.diff(chunks)[SKIP_GAPS:]
    if not gaps.size:
        return math.nan
    tokens = int(rec.output_tokens[i])
    if tokens <= chunks.size:  # a token a chunk
        return float(np.mean(gaps)) / 1e6
    return float(chunks[-1] - chunks[0]) / (tokens - 1) / 1e6


AFTER_PREFILL_STEPS = 4  # decode steps after a prompt measured apart (the 5th: within 5%)


def after_prefill_extra_ms(rec: RunRecords, i: int) -> np.ndarray:
    """How much longer request i's first AFTER_PREFILL_STEPS decode steps took than its
    steps past SKIP_GAPS (their mean): the steps right after a prompt run slow. On the
    Intel VM of 2026-12-04 (a 2-layer model, 2 ms steps) the first took twice the later
    ones, the second 1.4-1.7 times, the third 1.2-1.3, the fourth 1.1; left out, the
    prediction put TPOT p50 5-25% short. NaN where the stream is too short to tell, or
    carries several tokens a chunk."""
    chunks = rec.chunk_ns[i]
    gaps = np.diff(chunks) / 1e6
    if gaps.size <= SKIP_GAPS or int(rec.output_tokens[i]) > chunks.size:
        return np.full(AFTER_PREFILL_STEPS, math.nan)
    return np.asarray(gaps[:AFTER_PREFILL_STEPS] - float(np.mean(gaps[SKIP_GAPS:])), float)


def after_prefill_ms(extras: list[np.ndarray]) -> tuple[float, ...]:
    """The after-prefill extras of a profile's one-stream decode runs
    (`after_prefill_extra_ms` each): the median of each step's, none below 0; () where
    no run could tell."""
    rows = np.array([e for e in extras if np.isfinite(e).all()], float)
    if not rows.size:
        return ()
    return tuple(max(0.0, float(x)) for x in np.median(rows, axis=0))


def pooled_after_prefill(each: list[tuple[float, ...]]) -> tuple[float, ...]:
    """Profiles' after-prefill extras taken together (`Profile.pooled`): the mean, step
    by step, over the profiles that have them."""
    have = [e for e in each if e]
    if not have:
        return ()
    n = min(len(e) for e in have)
    return tuple(float(np.mean([e[j] for e in have])) for j in range(n))


def seeded_index(base: int, seed: int) -> int:
    """The first prompt index of a seed's profile or probes: the words spelling a
    prompt's index come first, so another seed's prompts share none of them."""
    return base + (seed % SEED_SPREAD) * SEED_STRIDE


async def profile_server(session: aiohttp.ClientSession, ep: Endpoint, limits: ServerLimits,
                         tpw: float, say: Callable[[str], None], seed: int = 0,
                         base: int = PROFILE_INDEX) -> Profile:
    """The controlled runs (see the module docstring) and the fit. Their prompts are
    drawn from `seed` (validate's --seed) and `base`: another seed or base, other
    prompts."""
    rows_p: list[int] = []
    rows_d: list[int] = []
    rows_k: list[float] = []
    rows_ms: list[float] = []
    rows_n: list[int] = []  # passes over the model (llama.cpp's ubatches)
    rows_x: list[int] = []  # of those, the ones of two or more tokens
    overheads: list[float] = []
    timed = True
    pin = limits.rule is SchedulingRule.LLAMA_CPP

    def add(batch: list[Seq], ms: float) -> None:
        n, x = limits.passes(batch)
        rows_p.append(sum(s.new for s in batch if not s.decode))
        rows_d.append(sum(s.decode for s in batch))
        rows_k.append(float(sum(s.context for s in batch)))
        rows_ms.append(ms)
        rows_n.append(n)
        rows_x.append(x)
    # prompt indices of their own: nothing shared with the load steps, nor (the words
    # spelling the index come first) with another seed's profile
    index = seeded_index(base, seed)
    for length in PREFILL_LENGTHS:
        reqs = random_requests(PREFILL_REPEATS, input_len=length, output_len=2,
                               tokens_per_word=tpw, seed=seed, first_index=index)
        index += PREFILL_REPEATS
        times: list[float] = []
        tokens: list[int] = []
        for r in pinned(reqs, 0, pin):  # one at a time
            before = await read_metrics(session, ep.base)
            rec = await _at_once(session, ep, [r], "a prefill")
            after = await read_metrics(session, ep.base)
            ttft_ms = (rec.chunk_ns[0][0] - rec.intended_ns[0]) / 1e6
            server_ms = (float(rec.server_prompt_ms[0]) if rec.server_prompt_ms is not None
                         else -1.0)
            if server_ms <= 0:  # vLLM: its engine's prefill time, from /metrics
                server_ms = engine_prefill_ms(counter_diff(before, after))
            step_ms = server_ms if server_ms > 0 else ttft_ms
            timed &= server_ms > 0
            times.append(step_ms)
            tokens.append(int(rec.prompt_tokens[0]))
            overheads.append(ttft_ms - step_ms)
        add([Seq(0, int(np.median(tokens)), 0, False, True)], float(np.median(times)))
    say(f"profile: prefill at {', '.join(map(str, PREFILL_LENGTHS))} tokens")
    levels = profile_levels(limits.slots)
    first_decode_ms: list[float] = []  # each level's step after the shorter prompts
    extras: list[np.ndarray] = []  # one stream's first steps after its prompt
    for prompt_len in DECODE_PROMPTS:
        for c in levels:
            gap, prompt, more = await _decode_step_ms(session, ep, c, prompt_len, tpw, index,
                                                      seed, pin)
            extras += more
            index += c * DECODE_REPEATS
            context = round(prompt + SKIP_GAPS + (DECODE_TOKENS - SKIP_GAPS) / 2)
            add([Seq(s, 1, context, True, True) for s in range(c)], gap)
            if prompt_len == DECODE_PROMPTS[0]:
                first_decode_ms.append(gap)
    say(f"profile: decode with {', '.join(map(str, levels))} sequences at once, after "
        f"{' and '.join(map(str, DECODE_PROMPTS))}-token prompts"
        + (f" (of {limits.slots} slots: the fit carries past {PROFILE_MAX_SEQS})"
           if limits.slots > PROFILE_MAX_SEQS else ""))
    for prompt_len in MIXED_PROMPTS:
        # c decodes on slots 0 .. c-1, the prompt on slot c (pinned, for llama.cpp)
        for c in mixed_counts(limits.slots):
            stream_tokens = mixed_stream_tokens(
                float(np.interp(c, levels, first_decode_ms)),
                float(np.interp(prompt_len, rows_p[:len(PREFILL_LENGTHS)],
                                rows_ms[:len(PREFILL_LENGTHS)])),
                limits.ctx_per_slot - DECODE_PROMPT_MIXED - MIXED_TOKENS_ROOM)
            row = None
            tries = 0
            while row is None and tries < MIXED_TRIES:
                row = await _mixed_step(session, ep, prompt_len, c, tpw, index, seed, pin,
                                        stream_tokens)
                index += c + 1
                tries += 1
            if row is None:
                say(f"profile: a {prompt_len}-token prompt did not join {c} running "
                    f"decode(s) in {tries} tries; that mixed step is left out")
                continue
            add([Seq(s, 1, round(row[1]), True, True) for s in range(c)]
                + [Seq(c, row[0], 0, False, True)], row[2])
    say(f"profile: a prompt of {' and '.join(map(str, MIXED_PROMPTS))} tokens joining "
        "running decodes")
    # the steps right after a prompt, which the llama.cpp rule prices apart
    slow = after_prefill_ms(extras) if limits.rule is SchedulingRule.LLAMA_CPP else ()
    if slow:
        say("profile: the decode steps after a prompt took "
            + ", ".join(f"{x:.2f}" for x in slow) + " ms more than later ones")
    return Profile.fitted(rows_p, rows_d, rows_k, rows_ms, rows_n, rows_x,
                          max(0.0, float(np.median(overheads))), timed, slow)


def profile_levels(slots: int) -> list[int]:
    """The decode rows' sequence counts: each count a small server's load runs (under
    load three streams' steps have run slower than four's, 2026-12-04), then all slots,
    or PROFILE_MAX_SEQS of them."""
    top = min(slots, PROFILE_MAX_SEQS)
    return sorted({*range(1, min(top, DECODE_EACH_UP_TO) + 1), top})


def mixed_counts(slots: int) -> list[int]:
    """The running decodes a mixed row's prompt joins: one, and all the profile's top
    level but the prompt's slot."""
    top = min(slots, PROFILE_MAX_SEQS)
    return sorted({1, max(1, top - 1)} & set(range(1, top)))


def profile_indices(slots: int) -> int:
    """The most prompt indices one profile uses (every mixed row tried MIXED_TRIES
    times); a test holds it within SEED_STRIDE."""
    return (len(PREFILL_LENGTHS) * PREFILL_REPEATS
            + len(DECODE_PROMPTS) * DECODE_REPEATS * sum(profile_levels(slots))
            + len(MIXED_PROMPTS) * MIXED_TRIES * sum(c + 1 for c in mixed_counts(slots)))


def pinned(reqs: list[LlmRequest], first_slot: int, pin: bool) -> list[LlmRequest]:
    """The requests on slots first_slot, first_slot + 1, ... (llama.cpp's `id_slot`), so
    the profile knows the ubatches its steps made; unchanged where `pin` is False."""
    return [replace(r, id_slot=first_slot + k) if pin else r for k, r in enumerate(reqs)]


def engine_prefill_ms(diff: dict[str, float]) -> float:
    """One request's prefill as the engine timed it (vLLM's request_prefill_time, from
    scheduled to first token), from a metrics difference over that request alone; -1
    when the server does not say."""
    count = diff.get("vllm:request_prefill_time_seconds_count", 0.0)
    total = diff.get("vllm:request_prefill_time_seconds_sum", 0.0)
    return total / count * 1e3 if count == 1 and total > 0 else -1.0


def engine_steps(diff: dict[str, float]) -> float | None:
    """The engine's own count of the steps a run made: llama.cpp's decode calls, vLLM's
    iterations (its iteration_tokens histogram counts one per step)."""
    for name in ("llamacpp:n_decode_total", "vllm:iteration_tokens_total_count"):
        if name in diff:
            return diff[name]
    return None


MIXED_TOKENS_ROOM = 8  # context a slot keeps free beyond a mixed row's stream


def mixed_stream_tokens(step_ms: float, prefill_ms: float, room: int) -> int:
    """How many tokens a mixed row's running streams decode: still running
    MIXED_MARGIN times past the moment the prompt (sent MIXED_DELAY_S after them, its
    prefill alone `prefill_ms`) has joined them at the server's decode step `step_ms`;
    at least MIXED_TOKENS, at most MIXED_TOKENS_MAX and the slot's `room`."""
    need = MIXED_TOKENS
    if math.isfinite(step_ms) and step_ms > 0 and math.isfinite(prefill_ms):
        span_ms = MIXED_DELAY_S * 1e3 + max(prefill_ms, 0.0)
        need = max(need, math.ceil(MIXED_MARGIN * span_ms / step_ms))
    return max(1, min(MIXED_TOKENS_MAX, room, need))


async def _mixed_step(session: aiohttp.ClientSession, ep: Endpoint, prompt_len: int, c: int,
                      tpw: float, index: int, seed: int, pin: bool = False,
                      tokens: int = MIXED_TOKENS) -> tuple[int, float, float] | None:
    """c decode streams of `tokens` running, then a prompt joins them (`pin`: the
    streams on slots 0 .. c-1, the prompt on slot c): the step that holds both is the
    first stream's gap that the prompt's first token ends (`joined_gap`). (prefill
    tokens, each stream's context then, its ms); None where no mixed step was seen."""
    streams = random_requests(c, input_len=DECODE_PROMPT_MIXED, output_len=tokens,
                              tokens_per_word=tpw, seed=seed, first_index=index)
    joiner = random_requests(1, input_len=prompt_len, output_len=2, tokens_per_word=tpw,
                             seed=seed, first_index=index + c)
    running = asyncio.ensure_future(_at_once(session, ep, pinned(streams, 0, pin),
                                             "a mixed-step"))
    await asyncio.sleep(MIXED_DELAY_S)
    joined = await _at_once(session, ep, pinned(joiner, c, pin), "a mixed-step")
    rec = await running
    # the prompt's first token on the stream's clock (each run counts from its own start)
    own = (float(joined.server_prompt_ms[0]) if joined.server_prompt_ms is not None
           else -1.0)
    k = joined_gap(np.asarray(rec.chunk_ns[0]),
                   int(joined.chunk_ns[0][0]) + joined.t0_ns - rec.t0_ns,
                   max(own, 0.0) * 1e6)
    if k is None:
        return None
    context = float(np.mean(rec.prompt_tokens)) + k + 1
    return (int(joined.prompt_tokens[0]), context,
            float(rec.chunk_ns[0][k + 1] - rec.chunk_ns[0][k]) / 1e6)


def joined_gap(chunk_ns: np.ndarray, first_ns: int, prompt_ns: float = 0.0) -> int | None:
    """Which of a decode stream's gaps holds the step a joining prompt ran in: of the
    gaps that end within JOIN_STEPS of the stream's steps (at least JOIN_FLOOR_MS) of
    the prompt's first token (at `first_ns`, on the stream's clock), the longest; None
    where none stands out from the stream's own steps by MIXED_MIN_RATIO (the stream
    ended before the prompt came, or the server ran the prompt apart from it), or is
    shorter than MIXED_MIN_SHARE of the prompt's own time (`prompt_ns`, the server's,
    when it tells): a step that holds the prompt takes at least that. The longest gap of
    the whole stream is not it: a 55-64 ms stall of the client (fixed since) was taken
    for a 64-token prompt's step, and a stream that ended before the prompt came gave a
    10.6 ms "mixed step" for a 193-token prompt that pulled the relative fit of every
    prefill 80-90% short (the AMD VM, 2026-12-04). With 2 ms steps two steps were too
    narrow a window for the 4.7 ms the two clients' chunks can differ, and an 8.8 ms
    hiccup was taken for a 193-token prompt's step (50 ms; the Intel VM, 2026-12-04)."""
    gaps = np.diff(chunk_ns)
    if gaps.size < 3:
        return None
    typical = float(np.median(gaps))
    near = np.abs(chunk_ns[1:] - first_ns) <= max(JOIN_STEPS * typical, JOIN_FLOOR_MS * 1e6)
    if not near.any():
        return None
    k = int(np.flatnonzero(near)[np.argmax(gaps[near])])
    least = max(MIXED_MIN_RATIO * typical, MIXED_MIN_SHARE * prompt_ns)
    return k if gaps[k] >= least else None


async def _at_once(session: aiohttp.ClientSession, ep: Endpoint, reqs: list[LlmRequest],
                   what: str) -> RunRecords:
    """The requests sent together; a StoreError naming the first failure, or a prompt
    the server served from its cache (a profile of cached prompts times nothing: a
    128-token prefill read as 8 ms where it took 190; and decode rows whose prompts
    came again from the slots' cache put 1.0-1.4 ms on each decode sequence where new
    prompts, as a load sends, gave 0.26-0.65, 2026-12-05)."""
    rec = await run_step(session, ep, reqs, LoadPlan(rate=math.inf), seed=0, timeout_s=600,
                         ignore_eos=True)
    failed = [e for e in rec.errors if e]
    if failed:
        raise StoreError(f"profile: {what} request failed ({failed[0]})")
    told = rec.cached_tokens >= 0
    cached = int(rec.cached_tokens[told].sum())
    if cached > PROFILE_CACHED_SHARE * int(rec.prompt_tokens[told].sum()):
        raise StoreError(f"profile: the server served {cached:,} of {what} request's prompt "
                         "tokens from its cache, so its steps cannot be timed; a validate "
                         "with the same --seed has run against this server: give another "
                         "--seed or restart the server")
    return rec


async def _decode_step_ms(session: aiohttp.ClientSession, ep: Endpoint, c: int,
                          prompt_len: int, tpw: float, index: int, seed: int,
                          pin: bool = False) -> tuple[float, float, list[np.ndarray]]:
    """c decode streams at once after prompts of `prompt_len` (`pin`: on slots 0 .. c-1):
    the mean gap mid-stream, the median of DECODE_REPEATS runs (one run of the AVX2 VM
    came out 55% slow; the least of them read the step low), the prompts' mean
    tokens, and with one stream each run's `after_prefill_extra_ms`. Uses the prompt
    indices index .. index + c * DECODE_REPEATS."""
    gaps = []
    extras = []
    for k in range(DECODE_REPEATS):
        reqs = random_requests(c, input_len=prompt_len, output_len=DECODE_TOKENS,
                               tokens_per_word=tpw, seed=seed, first_index=index + k * c)
        rec = await _at_once(session, ep, pinned(reqs, 0, pin), "a decode")
        gaps.append(float(np.median([_step_gap_ms(rec, i) for i in range(c)])))
        if c == 1:  # alone: its first steps follow its own prompt's step and nothing else
            extras.append(after_prefill_extra_ms(rec, 0))
    return decode_row_ms(gaps), float(np.mean(rec.prompt_tokens)), extras


def decode_row_ms(runs_ms: list[float]) -> float:
    """A decode row from its runs' step times: the median. A load's TPOT averages the
    steps a stream happened to get, so the row is a typical run, not the best: the least
    of two runs (until 2026-12-04) read the step low by about half a run-to-run spread.
    The median still sets aside one slow run of three (one came out 55% slow)."""
    return float(np.median(runs_ms))


TOUCH_TOKENS = 8


async def touch_slots(session: aiohttp.ClientSession, ep: Endpoint, slots: int, tpw: float,
                      index: int, seed: int) -> None:
    """One short request on each llama.cpp slot in turn, the highest id first, so the
    server's least-recently-used order is the one a fresh server has and the simulator
    starts from: the highest id taken first, then the next down. Without it a load
    step's requests take slots in an order set by whatever ran before (measured
    2026-12-04: after two probes the server took slots 1, 0, 3, 2 where a fresh one takes
    3, 2, 1, 0, and which slots decode together sets how many ubatches a step makes)."""
    reqs = random_requests(slots, input_len=TOUCH_TOKENS, output_len=1, tokens_per_word=tpw,
                           seed=seed, first_index=index)
    for s, r in zip(range(slots - 1, -1, -1), reqs, strict=True):
        rec = await run_step(session, ep, [replace(r, id_slot=s)], LoadPlan(rate=math.inf),
                             seed=0, timeout_s=600, ignore_eos=True)
        if rec.errors[0]:
            raise StoreError(f"the slot touch before a load step failed ({rec.errors[0]})")


async def probe_decode_ms(session: aiohttp.ClientSession, ep: Endpoint, tpw: float,
                          index: int, seed: int) -> float:
    """The profile's first decode row again (one stream after a 32-token prompt), to see
    whether the server's speed has moved."""
    return (await _decode_step_ms(session, ep, 1, DECODE_PROMPTS[0], tpw, index, seed))[0]


def server_tpot_ms(rec: RunRecords) -> np.ndarray:
    """Each completed request's TPOT by the server's own clock: llama.cpp's
    `timings.predicted_ms` runs from its first token to its last, so over output tokens
    less one it is the client's TPOT without the network and the client. Only requests
    the server timed with two or more output tokens; empty where it does not say."""
    if rec.server_decode_ms is None:
        return np.zeros(0)
    keep = rec.ok & (rec.server_decode_ms > 0) & (rec.output_tokens > 1)
    own: np.ndarray = rec.server_decode_ms[keep] / (rec.output_tokens[keep] - 1)
    return own


# One step's chunks reach the client within this of each other: at least
# STEP_GROUP_NS, or STEP_GROUP_SHARE of a stream's usual gap between its chunks (a step
# or more), at most STEP_GROUP_MAX_NS. A fixed 1.5 ms split one step's last chunks on a
# slowed VM (2026-12-06: a 1-thread CPU model, 45 ms steps, the ends of two streams in one
# step 2.3-2.4 ms apart at the client), and the slot replay then took them for two steps.
STEP_GROUP_NS = 1_500_000
STEP_GROUP_SHARE = 0.1
STEP_GROUP_MAX_NS = 20_000_000


def step_window_ns(rec: RunRecords, ok: np.ndarray) -> int:
    """How far apart one step's chunks may reach the client (see STEP_GROUP_SHARE): the
    median over the streams `ok` of each one's median gap between chunks."""
    gaps = [float(np.median(np.diff(rec.chunk_ns[i]))) for i in ok
            if rec.chunk_ns[i].size >= 3]
    if not gaps:
        return STEP_GROUP_NS
    return int(min(max(STEP_GROUP_NS, STEP_GROUP_SHARE * float(np.median(gaps))),
                   STEP_GROUP_MAX_NS))
# a stream's chunk sooner than this share of its median gap after its previous one was read
# late by the client, not made in a step that short: with 1.1-1.3 ms steps (2 layers, AMD
# VM, 2026-12-05) 1% of a stream's gaps were 0.07-0.4 ms, each after one as much too long
BUNCH_SHARE = 0.3
STEP_NOTE_MIN = 20  # decode steps of one size seen at least this often are noted
MIXED_NOTE_MIN = 5  # and steps where a prompt joined decodes, this often


def replay_slots(rec: RunRecords, slots: int) -> np.ndarray:
    """Which llama.cpp slot each completed request ran in, replayed from the client's
    times with the server's rule (llm/llama_cpp.py): first come first served, each
    request to the idle slot least recently released (of never-used slots the highest
    id). A slot is freed when its last token came: the server releases it as it sends
    the end of the stream, which reaches the client later, and a request sent in
    between found the slot free. Streams that ended in one step (`step_groups`) were
    released in slot order, lowest id first (the server walks its slots in order after
    each step), whatever order their ends reached the client in.
    -1 where a request did not complete, or where the client's times cannot tell (a
    request that ended while the replay still had it waiting)."""
    ok = np.flatnonzero(rec.ok)
    out = np.full(rec.ok.size, -1, np.int64)
    # each release at the start of the step that made its last token (`step_groups`)
    step_of = {int(i): int(rec.done_ns[i]) for i in ok}
    for step in step_groups(rec, ok):
        for _, i, k in step:
            if k == rec.chunk_ns[i].size - 1:
                step_of[i] = step[0][0]
    # events in time order: a step's releases (0) before an arrival (1) at that instant
    ev = sorted([(step_of[i], 0, i) for i in step_of] + [(int(rec.sent_ns[i]), 1, int(i))
                                                      for i in ok])
    last_used: list[tuple[int, int]] = [(-1, 0)] * slots
    holder = [-1] * slots
    waiting: list[int] = []
    for (t, kind), group in itertools.groupby(ev, key=lambda e: (e[0], e[1])):
        ids = [e[2] for e in group]
        if kind == 1:
            waiting.extend(ids)
        else:
            for i in ids:
                if out[i] >= 0:
                    holder[out[i]] = -1
                    last_used[out[i]] = (t, int(out[i]))  # one step: lower ids first
                elif i in waiting:
                    waiting.remove(i)
        while waiting and -1 in holder:
            s = min((x for x in range(slots) if holder[x] < 0),
                    key=lambda x: (last_used[x], -x))
            holder[s] = waiting.pop(0)
            out[holder[s]] = s
    return out


def steps_seen(rec: RunRecords, limits: ServerLimits | None = None) -> np.ndarray:
    """The server's steps as the streams show them, where each chunk is one token
    (llama.cpp): chunks within `step_window_ns` of each other came out of one step, and a
    step's time is the gap from the step before, kept only where the server was busy in
    between (every decode in the step had its previous token in the step before; a gap
    after idle would read as a long step), and neither side of a chunk the client read
    late (BUNCH_SHARE). Rows: prefill tokens (prompts whose first
    token the step made), decode sequences, KV tokens read, passes over the model and
    those of 2+ tokens (`limits.passes`, from the slots `replay_slots` gives; one pass
    without `limits`), measured ms; empty where the server bunches tokens into chunks."""
    ok = np.flatnonzero(rec.ok)
    if not ok.size or any(rec.chunk_ns[i].size != rec.output_tokens[i] for i in ok):
        return np.zeros((0, 6))
    slot = (replay_slots(rec, limits.slots) if limits is not None
            else np.zeros(rec.ok.size, np.int64))
    groups = step_groups(rec, ok)
    bunch = {int(i): BUNCH_SHARE * float(np.median(np.diff(rec.chunk_ns[i])))
             if rec.chunk_ns[i].size >= 2 else 0.0 for i in ok}
    bunched = [any(k > 0 and rec.chunk_ns[i][k] - rec.chunk_ns[i][k - 1] < bunch[i]
                   for _, i, k in step) for step in groups]
    rows = []
    for j, (before, step) in enumerate(itertools.pairwise(groups)):
        prev = {(i, k) for _, i, k in before}
        decodes = [(i, k) for _, i, k in step if k > 0]
        if not decodes or any((i, k - 1) not in prev for i, k in decodes):
            continue
        if bunched[j + 1] or (j + 2 < len(groups) and bunched[j + 2]):
            continue  # a chunk the client read late: this step long, the next one short
        batch = sorted((Seq(int(slot[i]), 1, int(rec.prompt_tokens[i]) + k, True, True)
                        for i, k in decodes), key=attrgetter("slot")) + sorted(
            (Seq(int(slot[i]), int(rec.prompt_tokens[i]), 0, False, True)
             for _, i, k in step if k == 0), key=attrgetter("slot"))
        n, x = (limits.passes(batch) if limits is not None
                else (1, int(sum(b.new for b in batch) >= 2)))
        rows.append((sum(b.new for b in batch if not b.decode), len(decodes),
                     sum(b.context for b in batch if b.decode), n, x,
                     (step[0][0] - before[0][0]) / 1e6))
    return np.array(rows, float).reshape(-1, 6)


def step_notes(rows: np.ndarray, model: ProfileStepModel) -> tuple[str, ...]:
    """Decode steps under load (`steps_seen`'s rows), by the number of sequences, and the
    steps where a prompt joined running decodes, measured against the step model (each
    row priced as its passes): where the step model misses under load."""
    parts = []
    mixed = (rows[:, 0] > 0) if rows.size else np.zeros(0, bool)
    if mixed.sum() >= MIXED_NOTE_MIN:
        measured = float(np.median(rows[mixed, 5]))
        model_ms = float(np.median([model.row_ms(*r[:5]) for r in rows[mixed]]))
        parts.append(f"a prompt joining decodes {measured:.1f} ms vs {model_ms:.1f} "
                     f"({(model_ms - measured) / measured * 100:+.0f}%, "
                     f"{int(mixed.sum())} steps)")
    for c in np.unique(rows[:, 1]).astype(int) if rows.size else []:
        sel = (rows[:, 0] == 0) & (rows[:, 1] == c)
        if sel.sum() < STEP_NOTE_MIN:
            continue
        measured = float(np.median(rows[sel, 5]))
        model_ms = float(np.median([model.row_ms(0, c, kv, n, x)
                                    for kv, n, x in rows[sel, 2:5]]))
        parts.append(f"{c} seq {measured:.1f} ms vs {model_ms:.1f} "
                     f"({(model_ms - measured) / measured * 100:+.0f}%, {int(sel.sum())} steps)")
    if not parts:
        return ()
    return ("decode steps under load, from the streams' chunk times (median, measured vs "
            "the step model): " + "; ".join(parts),)


CACHED_NOTE_SHARE = 0.05  # a unique prompt shares a token or two with others at most


def cache_note(rec: RunRecords) -> tuple[str, ...]:
    """A note when the server served a step's prompts from its cache (llama.cpp's
    `timings.cache_n`, vLLM's cached_tokens): the simulator prefills every prompt, so
    its TTFT is then too long. A second validate against the same server with the same
    --seed sends the same prompts."""
    told = rec.ok & (rec.cached_tokens >= 0)
    prompt = int(rec.prompt_tokens[told].sum())
    cached = int(rec.cached_tokens[told].sum())
    if prompt <= 0 or cached <= CACHED_NOTE_SHARE * prompt:
        return ()
    return (f"prompt cache: the server served {cached:,} of {prompt:,} prompt tokens from "
            "its cache, which the prediction does not; a repeat run against the same server "
            "sends the same prompts: give another --seed or restart the server",)


def given_run_steps(rec: RunRecords, seen: np.ndarray, limits: ServerLimits,
                    profile: Profile) -> tuple[Compared, ...]:
    """The v2 side's "given the run's batch times", for an LLM server: the step model
    refitted on the profile's rows and the steps this load made (`steps_seen`), and the
    simulator run again: its figures, none under STEP_NOTE_MIN steps.
    Where that holds TPOT, the scheduling rule is right and the miss is in how fast the
    steps ran under load; where it does not, the rule is off."""
    if seen.shape[0] < STEP_NOTE_MIN:
        return ()
    rows = np.column_stack([profile.prefill_tokens, profile.decode_seqs,
                            profile.kv_tokens_read, *profile.pass_columns(), profile.step_ms])
    both = np.vstack([rows, seen])
    model = ProfileStepModel.fit(both[:, 0], both[:, 1], both[:, 2], both[:, 5],
                                 source="the profile and this load's steps", relative=True,
                                 passes=both[:, 3], multi_passes=both[:, 4])
    again = simulate_same(rec, limits, profile, model=model)
    return _figures(rec, again, profile.overhead_ms)


GIVEN_NOTE_FIGURES = ("TTFT p50 (ms)", "TPOT p50 (ms)", "E2EL p50 (ms)")


def _beside(these: tuple[Compared, ...], those: tuple[Compared, ...], label: str) -> str:
    """GIVEN_NOTE_FIGURES' errors in `these`, each with `those`' in brackets after
    `label`: "TTFT p50 -3.0% (label -7.6%), ..."."""
    a = {f.name: f for f in these}
    b = {f.name: f for f in those}
    return ", ".join(f"{name.split(' (')[0]} {a[name].error_pct:+.1f}% ({label} "
                     f"{b[name].error_pct:+.1f}%)" for name in GIVEN_NOTE_FIGURES)


def first_profile_note(first: tuple[Compared, ...], figures: tuple[Compared, ...]
                       ) -> tuple[str, ...]:
    """The first profile's figures beside those of the profile re-measured just before
    the step (which the prediction uses), as a note."""
    if not first:
        return ()
    return ("on the first profile, minutes before: " + _beside(first, figures, "again"),)


def given_note(steps: int, given: tuple[Compared, ...], figures: tuple[Compared, ...]
               ) -> tuple[str, ...]:
    """given_run_steps' figures beside the profile's, as a note."""
    if not given:
        return ()
    return (f"given this load's own {steps} steps (refitted with the profile): "
            + _beside(given, figures, "profile alone"),)


def simulate_same(rec: RunRecords, limits: ServerLimits, profile: Profile,
                  max_concurrency: int = 0, model: ProfileStepModel | None = None
                  ) -> ServingResult:
    """The simulator on a step's own intended times and the lengths the server counted
    (`model`: another step model than the profile's)."""
    ok = rec.ok
    req = Requests(arrival_s=rec.intended_ns[ok] / 1e9,
                   prompt=np.maximum(rec.prompt_tokens[ok], 1),
                   output=np.maximum(rec.output_tokens[ok], 1),
                   prefix_hit=np.zeros(int(ok.sum()), bool))
    return simulate(req, limits.scheduler(), model or profile.model, max_concurrency)


def _figures(rec: RunRecords, sim: ServingResult, overhead_ms: float) -> tuple[Compared, ...]:
    m = compute(rec, percentiles=(50.0, 90.0, 99.0))
    out = []
    for name, dist, pred_s, add in (("TTFT", m.ttft, sim.ttft_s, overhead_ms),
                                    ("TPOT", m.tpot, sim.tpot_s, 0.0),
                                    ("E2EL", m.e2el, sim.e2e_s, overhead_ms)):
        pred = pred_s[np.isfinite(pred_s)] * 1e3 + add
        for (p, measured), key in zip(dist.percentiles, ("p50", "p90", "p99"), strict=True):
            predicted = float(np.percentile(pred, p)) if pred.size else math.nan
            out.append(Compared(f"{name} {key} (ms)", predicted, measured, TOLERANCE[key]))
    duration_pred = max(float(sim.end_s) + overhead_ms / 1e3, 1e-9)
    out.append(Compared("throughput (req/s)", m.completed / duration_pred,
                        m.request_throughput, TOLERANCE["throughput"]))
    return tuple(out)


EDGE_RANKS = 2  # requests either side of a median, for median_edge_notes
SPEED_WINDOW_S = 5.0  # speed_note: a lone stream's steps in windows of this many seconds
SPEED_WINDOW_STEPS = 20  # a window with fewer lone steps is left out
SPEED_NOTE_PCT = 15.0  # the windows' medians this far apart are noted
SPEED_NOTE = "server speed within this step"  # speed_note's first words
EDGE_NOTE = "p50 sits in a gap of its distribution"  # edge_note's, after the figure


def step_groups(rec: RunRecords, ok: np.ndarray) -> list[list[tuple[int, int, int]]]:
    """The requests `ok`'s chunks as (ns, request, token index), in time order, grouped
    into the server's steps: chunks within `step_window_ns` of each other came out of one,
    and a step makes one token a request, so a request's next chunk starts the next step.
    Without that rule, steps shorter than the window ran together: with a 2-layer model
    (1.1-1.3 ms steps, AMD VM, 2026-12-05) a lone stream's steps read as one, 10-19% of
    the groups held a request twice, and steps of one sequence read 2.1-2.3 ms. The
    window is `step_window_ns`."""
    ev = sorted((int(t), int(i), k) for i in ok for k, t in enumerate(rec.chunk_ns[i]))
    window = step_window_ns(rec, ok)
    groups: list[list[tuple[int, int, int]]] = []
    members: set[int] = set()
    for e in ev:
        if groups and e[0] - groups[-1][-1][0] < window and e[1] not in members:
            groups[-1].append(e)
        else:
            groups.append([e])
            members = set()
        members.add(e[1])
    return groups


def lone_steps(rec: RunRecords) -> np.ndarray:
    """The steps in which one stream alone made one token, right after its previous one
    (nothing else in either step): rows of (s from the start, ms). A step of one decode
    is the server's speed with nothing else in it, so these track the machine's speed
    through a load step."""
    ok = np.flatnonzero(rec.ok)
    groups = step_groups(rec, ok)
    rows = [(step[0][0] / 1e9, (step[0][0] - before[0][0]) / 1e6)
            for before, step in itertools.pairwise(groups)
            if len(before) == len(step) == 1 and step[0][1] == before[0][1]
            and step[0][2] == before[0][2] + 1]
    return np.array(rows, float).reshape(-1, 2)


def lone_speed(rec: RunRecords) -> tuple[float, float] | None:
    """The least and the most of a lone stream's median step (ms) over the load step's
    SPEED_WINDOW_S windows (those with SPEED_WINDOW_STEPS lone steps or more): how far
    the machine's own speed moved during the load. None where fewer than two windows
    tell (a load that always kept two or more streams running)."""
    rows = lone_steps(rec)
    if not rows.size:
        return None
    window = (rows[:, 0] // SPEED_WINDOW_S).astype(np.int64)
    meds = [float(np.median(rows[window == w, 1])) for w in np.unique(window)
            if (window == w).sum() >= SPEED_WINDOW_STEPS]
    return (min(meds), max(meds)) if len(meds) >= 2 else None


def spread_pct(speed: tuple[float, float] | None) -> float | None:
    """`lone_speed`'s most over its least, in % above it."""
    return None if speed is None else (speed[1] / speed[0] - 1) * 100


def speed_note(speed: tuple[float, float] | None) -> tuple[str, ...]:
    """A line where the server's one-stream step moved more than SPEED_NOTE_PCT within
    the load step (`speed`, from `lone_speed`): no profile before or after can foresee
    that. On the
    AMD VM (2026-12-04) every step whose windows spread 30% or more missed TPOT p50 by
    12-28%, where the spread ran 5-55% in quiet runs (steal 0, other processes about
    1%); on an Intel VM later that day it ran 58-151% in two of eight quiet runs, and
    the six whose steps held within 15% (but one, 22%) met the whole bar within 6%."""
    pct = spread_pct(speed)
    if speed is None or pct is None or pct <= SPEED_NOTE_PCT:
        return ()
    return (f"{SPEED_NOTE}: a lone stream's step ran {speed[0]:.2f}-"
            f"{speed[1]:.2f} ms from one {SPEED_WINDOW_S:.0f} s to another "
            f"({pct:+.0f}%): the machine's speed moved "
            "during the load, which no profile before or after it can foresee",)


def median_edge_notes(rec: RunRecords, sim: ServingResult, overhead_ms: float
                      ) -> tuple[str, ...]:
    """A line for a TTFT or TPOT p50 that sits in a gap of its own distribution, where
    EDGE_RANKS requests either side of the median span more than the p50 bar: there
    one request more or fewer in either group moves the p50 past the bar whatever the
    model, so the line gives the prediction request by request too (the simulator runs
    the same requests). At 30% load on the test's llama-server about half the requests
    decode alone (TPOT 4 ms) and half share steps with another's prompt (6-7 ms): in one
    quiet bench run the p50 came out -12% where the two groups' shares differed by one
    request and the median per-request TPOT error was 3% (2026-12-04)."""
    ttft, _, tpot = request_times(rec)
    out = []
    for name, meas_s, pred_s, add in (("TTFT", ttft, sim.ttft_s, overhead_ms),
                                      ("TPOT", tpot, sim.tpot_s, 0.0)):
        if meas_s.shape == pred_s.shape:
            note = edge_note(name, meas_s * 1e3, pred_s * 1e3 + add)
            out += [note] if note else []
    return tuple(out)


def edge_note(name: str, measured_ms: np.ndarray, predicted_ms: np.ndarray) -> str | None:
    """median_edge_notes' line for one figure, the same requests measured and predicted
    (NaN or 0 where a request has no such figure), or None where its p50 is no edge."""
    both = np.isfinite(measured_ms) & np.isfinite(predicted_ms) & (measured_ms > 0)
    m, p = measured_ms[both], predicted_ms[both]
    n = m.size
    if n < 4 * EDGE_RANKS:
        return None
    med = float(np.median(m))
    lo, hi = (float(np.percentile(m, 50 + sign * 100 * EDGE_RANKS / n)) for sign in (-1, 1))
    if hi - lo <= TOLERANCE["p50"] / 100 * med:
        return None
    each = float(np.median(np.abs(p / m - 1))) * 100
    return (f"{name} {EDGE_NOTE}: {EDGE_RANKS} requests either "
            f"side of the median span {lo:.1f}-{hi:.1f} ms ({(lo / med - 1) * 100:+.0f}% to "
            f"{(hi / med - 1) * 100:+.0f}% of it), so a request more or fewer in either group "
            "moves it past the bar whatever the model; request by request the prediction "
            f"is within {each:.0f}% at the median")


def through_prompts(first: np.ndarray, last: np.ndarray, within: float) -> np.ndarray:
    """Whether each request decoded through another's prompt: another request's first
    token came out after this one's first and no later than its last (times in one unit;
    `within` of each other count as one step: another prompt done in the step that made
    this one's first token is not counted, one done in the step of its last is)."""
    firsts = np.sort(first)
    after = np.searchsorted(firsts, first + within, side="right")
    upto = np.searchsorted(firsts, last + within, side="right")
    out: np.ndarray = upto > after
    return out


def shared_steps(rec: RunRecords, sim: ServingResult) -> SharedSteps | None:
    """`through_prompts` on the streams' chunk times (a step's chunks within
    STEP_GROUP_NS) and on the simulator's token times for the same requests, with the
    mean decode spans. When the steps ran slower than modelled the spans are longer, so
    more requests meet another's prompt, and a TPOT p50 falls among them: on the Intel VM
    (2026-12-05, 2 layers) 91 against 82 of 120, spans 273 ms against 210, where a step
    whose speed held had 36 against 37 and met the bar. None where fewer than two
    requests made two or more tokens each way."""
    ok = np.flatnonzero(rec.ok)
    if sim.ttft_s.shape != ok.shape:
        return None
    first_ns = np.array([rec.chunk_ns[i][0] if rec.chunk_ns[i].size else -1 for i in ok],
                        np.int64)
    last_ns = np.array([rec.chunk_ns[i][-1] if rec.chunk_ns[i].size else -1 for i in ok],
                       np.int64)
    arrive_s = rec.intended_ns[ok] / 1e9
    first_s, last_s = arrive_s + sim.ttft_s, arrive_s + sim.e2e_s
    both = ((rec.output_tokens[ok] >= 2) & (first_ns >= 0) & (last_ns > first_ns)
            & np.isfinite(first_s) & np.isfinite(last_s))
    if both.sum() < 2:
        return None
    meas = through_prompts(first_ns[both].astype(float), last_ns[both].astype(float),
                           STEP_GROUP_NS)
    pred = through_prompts(first_s[both], last_s[both], 1e-9)
    return SharedSteps(int(meas.sum()), int(pred.sum()), int(both.sum()),
                       float(np.mean(last_ns[both] - first_ns[both])) / 1e6,
                       float(np.mean(last_s[both] - first_s[both])) * 1e3)


# counts this far apart (a share of the requests, and at least SHARED_NOTE_MIN) are noted:
# on the same arrivals a few requests either side of another's prompt step flip with any
# small shift in time (3 of 30 in a test-sized run whose spans agreed within 9%)
SHARED_NOTE_SHARE = 0.05
SHARED_NOTE_MIN = 5


def shared_note(shared: SharedSteps | None) -> tuple[str, ...]:
    """A line where measured and simulated differ in how many requests decoded through
    another's prompt by more than SHARED_NOTE_SHARE of the requests (and
    SHARED_NOTE_MIN), saying whether the decode spans differ too (the steps' speed, which
    moves the count) or not (which points at the scheduling)."""
    if shared is None:
        return ()
    s = shared
    if abs(s.measured - s.predicted) < max(SHARED_NOTE_MIN, SHARED_NOTE_SHARE * s.requests):
        return ()
    span = (s.span_predicted_ms - s.span_measured_ms) / s.span_measured_ms * 100
    why = ("the decode spans differ too, so the steps' speed, not the scheduling, "
           "set who overlapped" if abs(span) > TOLERANCE["p50"] else
           "with decode spans that agree, which points at the scheduling rule")
    return (f"requests that decoded through another's prompt: {s.measured} of {s.requests} "
            f"measured, {s.predicted} simulated; their decode spans {s.span_measured_ms:.0f} "
            f"ms measured, {s.span_predicted_ms:.0f} simulated ({span:+.0f}%): {why}",)


async def run_validation(ep: Endpoint, *, rule: SchedulingRule = SchedulingRule.LLAMA_CPP,
                         slots: int | None = None, ctx_per_slot: int | None = None,
                         n_batch: int | None = None, input_len: int = 256,
                         output_len: int = 64, num_prompts: int = 60,
                         shares: tuple[float, ...] = (0.3, 0.6, 0.85), seed: int = 0,
                         reprofile: bool = True,
                         say: Callable[[str], None] = lambda s: None) -> LlmValidationReport:
    """Profile, fit, saturate, load and compare (see the module docstring)."""
    if not shares or len(shares) > 10 or not all(0 < s <= 2 for s in shares):
        raise invalid("--shares", shares, "1 to 10 shares of saturation above 0, at most 2",
                      "e.g. --shares 0.3,0.6,0.85")
    async with new_session(1000) as session:
        if not ep.model:
            ep = Endpoint(ep.base, ep.path, await model_name(session, ep.base))
        tpw = await tokens_per_word(session, ep, seed=seed, timeout_s=600)
        limits = await discover_limits(session, ep.base, rule, slots, ctx_per_slot, n_batch)
        say(f"limits: {limits.rule} with {limits.slots} slots of {limits.ctx_per_slot} tokens "
            f"({limits.source})")
        first = 0

        def workload(n: int) -> list[Any]:
            nonlocal first
            reqs = random_requests(n, input_len=input_len, output_len=output_len,
                                   tokens_per_word=tpw, seed=seed, first_index=first)
            first += n
            return reqs

        touches = itertools.count(seeded_index(TOUCH_INDEX, seed), limits.slots)

        async def touch() -> None:  # llama.cpp: its slots' order as a fresh server's
            if limits.rule is SchedulingRule.LLAMA_CPP:
                await touch_slots(session, ep, limits.slots, tpw, next(touches), seed)

        # the saturation run first: the load steps' rates follow from it, and the profile
        # then runs just before the first step (with --reprofile, the first step's "before")
        conc = 2 * limits.slots
        await touch()
        rec = await run_step(session, ep, workload(num_prompts),
                             LoadPlan(max_concurrency=conc), seed=seed, timeout_s=600,
                             ignore_eos=True)
        kept = [rec]
        sat_measured = compute(rec).request_throughput
        mean_in = float(rec.prompt_tokens[rec.ok].mean()) if rec.ok.any() else input_len
        mean_out = float(rec.output_tokens[rec.ok].mean()) if rec.ok.any() else output_len
        say(f"saturation: {sat_measured:.2f} req/s measured")
        profile = await profile_server(session, ep, limits, tpw, say, seed)
        m = profile.model
        say(f"fit: step = {m.base_ms:.3f} ms + {m.per_prefill_token_ms:.4f} ms/prefill token "
            f"+ {m.per_decode_seq_ms:.3f} ms/decode seq + {m.per_kv_token_ms:.5f} ms/KV "
            f"token + {m.multi_token_ms:.3f} ms a step of 2+ tokens; outside the steps "
            f"{profile.overhead_ms:.2f} ms")
        sat_pred = saturation_predicted(rec, limits, profile, conc)
        saturation = Compared("saturation (req/s)", sat_pred, sat_measured,
                              TOLERANCE["saturation"])
        say(f"saturation: {sat_pred:.2f} req/s predicted from the profile just after its run")
        profiled = profile.one_decode_ms

        async def again(k: int) -> Profile:
            return await profile_server(session, ep, limits, tpw, lambda s: None, seed,
                                        REPROFILE_INDEX + k * REPROFILE_SPAN)

        # measure every step first; --reprofile: the profile again before each step but the
        # first (the first profile ran just before it) and once after the last (around[k]
        # and around[k + 1] are step k's two)
        done = []
        around: list[Profile] = [profile] if reprofile else []
        for k, share in enumerate(shares):
            rate = share * sat_measured
            if not reprofile:
                probed = await probe_decode_ms(session, ep, tpw,
                                               seeded_index(PROBE_INDEX, seed) + 10 * k, seed)
            elif k == 0:
                probed = profiled  # the first profile ran just before this step
            else:
                around.append(await again(k))
                probed = around[-1].one_decode_ms
                say(f"profile again before {share:.0%}: a decode step "
                    f"{(probed - profiled) / profiled * 100:+.0f}% against the first")
            await touch()
            before = await read_metrics(session, ep.base)
            rec = await run_step(session, ep, workload(num_prompts), LoadPlan(rate=rate),
                                 seed=seed + k + 1, timeout_s=600, ignore_eos=True)
            after = await read_metrics(session, ep.base)
            kept.append(rec)
            done.append((share, rate, rec, counter_diff(before, after),
                         (probed - profiled) / profiled * 100))
            say(f"{share:.0%} of saturation ({rate:.2f}/s): {int(rec.ok.sum())} served")
        report_notes = (f"saturation measured first (the steps' rates follow from it) and "
                        f"predicted from the profile measured just after its run: "
                        f"{sat_pred:.2f} req/s",)
        if reprofile:
            around.append(await again(len(shares)))
            say(f"profile again after the last step: a decode step "
                f"{(around[-1].one_decode_ms - profiled) / profiled * 100:+.0f}% against "
                "the first")
        rates = []
        for k, (share, rate, rec, counters, drift) in enumerate(done):
            now = profile
            bracket: tuple[str, ...] = ()
            if reprofile:
                now = Profile.pooled(around[k], around[k + 1])
                a, b = around[k].one_decode_ms, around[k + 1].one_decode_ms
                bracket = (f"profiled again just before and just after this step, the "
                           f"prediction from both: a decode step {a:.2f} ms before, "
                           f"{b:.2f} after ({(b - a) / a * 100:+.0f}%)",)
            sim = simulate_same(rec, limits, now)
            metrics = compute(rec)
            figures = _figures(rec, sim, now.overhead_ms)
            on_first = (_figures(rec, simulate_same(rec, limits, profile),
                                 profile.overhead_ms) if reprofile else ())
            steps_measured = engine_steps(counters)
            own = server_tpot_ms(rec)
            own_p50 = float(np.median(own)) if own.size else None
            seen = steps_seen(rec, limits)
            given = given_run_steps(rec, seen, limits, now)
            speed = lone_speed(rec)
            shared = shared_steps(rec, sim)
            notes = (bracket + now.fit_note() + _diagnose(figures, sim.steps, steps_measured,
                                         metrics.send_late_p99_ms, drift, own_p50, reprofile,
                                         spread_pct(speed))
                     + first_profile_note(on_first, figures) + step_notes(seen, now.model)
                     + given_note(seen.shape[0], given, figures) + cache_note(rec)
                     + median_edge_notes(rec, sim, now.overhead_ms) + speed_note(speed)
                     + shared_note(shared))
            rates.append(RateResult(rate, share, figures, sim.steps, steps_measured,
                                    metrics.send_late_p99_ms, metrics.failed, notes, drift,
                                    own_p50, given, now if reprofile else None, on_first,
                                    speed, shared))
            say(f"{share:.0%} of saturation ({rate:.2f}/s): "
                + ", ".join(f"{f.name} {f.error_pct:+.1f}%" for f in figures
                            if "p50" in f.name))
    return LlmValidationReport(ep.base + ep.path, ep.model, limits, profile, saturation,
                               tuple(rates), input_len, output_len, tpw, mean_in, mean_out,
                               notes=report_notes, records=tuple(kept))


def saturation_predicted(rec: RunRecords, limits: ServerLimits, profile: Profile,
                         conc: int) -> float:
    """The saturation run's requests a second, simulated on its own lengths with the same
    closed loop of `conc` clients, from the first profile, which runs just after it.
    (Until 2026-12-05 the profile ran first, the saturation run after it, and with
    `--reprofile` the profile again before the first load step: four profiles for two
    steps where three now bracket both; the saturation was predicted from the two
    around it, as the server's decode step once ran 33% faster in the second than in
    the first, which alone put saturation 13% short.)"""
    sim = simulate_same(rec, limits, profile, max_concurrency=conc)
    return int(rec.ok.sum()) / max(sim.end_s, 1e-9)


def _diagnose(figures: tuple[Compared, ...], steps_pred: int, steps_meas: float | None,
              late_p99_ms: float, drift_pct: float = 0.0,
              server_tpot_p50_ms: float | None = None, reprofiled: bool = False,
              speed_spread_pct: float | None = None) -> tuple[str, ...]:
    """Where a step's misses come from: the machine (its speed moved since the profile,
    or within the step), the client (sent late), the scheduling (steps simulated
    against the server's count), or the step times."""
    notes = []
    if abs(drift_pct) > DRIFT_NOTE_PCT:
        uses = ("the profiles measured again just before and after it" if reprofiled
                else "the first profile, as --no-reprofile asks")
        notes.append(f"server speed: a decode step took {drift_pct:+.0f}% against the first "
                     f"profile just before this step (the machine's speed moved; the "
                     f"prediction uses {uses})")
    if late_p99_ms > 10:
        notes.append(f"client: sent up to {late_p99_ms:.1f} ms late (p99); the client, not "
                     "the server, may have limited this step")
    tpot = next(f for f in figures if f.name.startswith("TPOT p50"))
    if steps_meas:
        err = (steps_pred - steps_meas) / steps_meas * 100
        notes.append(f"scheduling: {steps_pred:,} steps simulated, {steps_meas:,.0f} decode "
                     f"calls by the server's count ({err:+.1f}%)")
        if abs(err) <= 10 and not tpot.ok:
            moved = speed_spread_pct is not None and speed_spread_pct > SPEED_NOTE_PCT
            notes.append("step model: the steps agree but TPOT misses; the step times are "
                         "off" + (f", and the server's own speed moved {speed_spread_pct:+.0f}% "
                                  "within this step (its speed note): the machine's, which "
                                  "the profiles around it cannot hold" if moved else ""))
    if server_tpot_p50_ms is not None and math.isfinite(tpot.measured) and tpot.measured > 0:
        # where the client's TPOT goes: the server's steps, or the way to the client
        outside = (tpot.measured - server_tpot_p50_ms) / tpot.measured * 100
        notes.append(f"TPOT p50 by the server's own clock {server_tpot_p50_ms:.2f} ms, the "
                     f"client's {tpot.measured:.2f} ms ({outside:+.1f}% outside the server), "
                     f"predicted {tpot.predicted:.2f} ms")
    return tuple(notes)


HTML_FIGURES = ("TTFT p50 (ms)", "TTFT p99 (ms)", "TPOT p50 (ms)", "TPOT p99 (ms)",
                "E2EL p50 (ms)", "throughput (req/s)")


def write_html(report: LlmValidationReport, path: Any) -> None:
    """Predicted and measured against the offered rate, one chart per figure, the
    saturation in the title; plotly.js is written beside the page, so it opens offline."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    x = [r.offered_per_s for r in report.rates]
    fig = make_subplots(rows=3, cols=2, subplot_titles=HTML_FIGURES)
    for i, name in enumerate(HTML_FIGURES):
        row, col = i // 2 + 1, i % 2 + 1
        figs = [next(f for f in r.figures if f.name == name) for r in report.rates]
        for side, style in (("measured", {"mode": "lines+markers", "line": {"color": "#222"}}),
                            ("predicted", {"mode": "lines+markers",
                                           "line": {"color": "#1f77b4", "dash": "dash"}})):
            fig.add_trace(go.Scatter(x=x, y=[getattr(f, side) for f in figs], name=side,
                                     showlegend=i == 0, legendgroup=side, **style),
                          row=row, col=col)
        fig.update_xaxes(title_text="offered rate (requests/s)", row=row, col=col)
        fig.update_yaxes(title_text=name, rangemode="tozero", row=row, col=col)
    s = report.saturation
    fig.update_layout(title=f"servelab llm validate: {report.model} at {report.endpoint}: "
                            f"{report.verdict}; saturation {s.predicted:.2f} predicted, "
                            f"{s.measured:.2f} measured req/s", height=1000)
    fig.write_html(str(path), include_plotlyjs="directory", full_html=True)
