"""Each scenario field is declared once (scenario.spec on its section's dataclass): the rules
table, every command's flags, the lab's sidebar and the errors' field all follow from it."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import servelab.cli as cli
from servelab.errors import InputError
from servelab.scenario import (
    _CLASSES,
    _SECTIONS,
    FIELDS,
    flag_keys,
    lab_controls,
    scenario_from_dict,
)

TYPES = {"float": float, "int": int, "str": str, "bool": bool, "tuple[int, ...]": list[int]}


def test_the_rules_table_is_the_declarations():
    for key, f in FIELDS.items():
        assert f.help.strip(), key
        assert _SECTIONS[f.section][1][f.name] is f.rule, key
        declared = {x.name: x for x in dataclasses.fields(_CLASSES[f.section])}[f.name]
        assert declared.default == f.default, key
    # every field of a section is declared, but Hardware.overrides (the catalog figures)
    for section, cls in _CLASSES.items():
        names = {x.name for x in dataclasses.fields(cls)} - {"overrides"}
        assert names == {f.name for f in FIELDS.values() if f.section == section}, section


def test_every_flag_is_the_declared_one_with_the_declared_type():
    """The CLI's flag aliases (cli.*Opt) take their names and help from the declaration;
    their Python type, written beside them for the type checker, is the declared one."""
    by_flags: dict[tuple[str, ...], list] = {}  # --gpu is [hardware]'s and [llm]'s
    for f in FIELDS.values():
        if f.flags:
            by_flags.setdefault(f.flags, []).append(f)
    seen = set()
    for name, alias in vars(cli).items():
        if not name.endswith("Opt") or typing.get_origin(alias) is not typing.Annotated:
            continue
        base, info = typing.get_args(alias)[:2]
        # typer.Option(*names) keeps the first name as its `default` (Annotated reads it so)
        decls = (info.default, *info.param_decls) if isinstance(info.default, str) else ()
        got = [a for a in typing.get_args(base) if a is not type(None)]
        for f in by_flags.get(decls, []):
            seen.add(f.key)
            want = TYPES.get(f.type.removesuffix(" | None"), str)
            assert got, name
            assert got[0] == want or f.name.endswith("_csv"), (name, got, want)
    # the common and [llm] flags are all here
    assert set(flag_keys("workload", "batching", "hardware", "latency").values()) <= seen
    assert {"llm.tp", "llm.request_rate", "llm.kv_dtype", "llm.scheduler"} <= seen


def test_the_labs_sidebar_is_the_declared_controls():
    groups = lab_controls()
    keys = [c["key"] for g in groups for c in g["items"]]
    assert keys == [k for k, f in FIELDS.items() if f.control is not None]
    qps = next(c for g in groups for c in g["items"] if c["key"] == "workload.qps")
    assert qps == {"key": "workload.qps", "label": "QPS", "min": 100, "max": 50000,
                   "step": 100, "flags": ["--qps"]}
    # the LLM serving section's sliders are declared as the sidebar's are
    serving = next(g["items"] for g in groups if g["group"] == "LLM serving")
    rate = next(c for c in serving if c["key"] == "llm.request_rate")
    assert rate["flags"] == ["--rate", "--request-rate"]
    assert {c["key"] for c in serving} == {
        "llm.request_rate", "llm.prompt_tokens", "llm.output_tokens", "llm.max_num_seqs",
        "llm.max_num_batched_tokens"}


@settings(max_examples=200, deadline=None)
@given(key=st.sampled_from(sorted(FIELDS)),
       value=st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                       st.floats(allow_nan=True), st.text(max_size=20),
                       st.lists(st.integers(-5, 5), max_size=3)))
def test_an_error_carries_its_field(key, value):
    """Any value for any declared field is taken, or refused by an InputError whose key is
    that field's: a caller (the CLI naming its flag) needs no message parsing."""
    f = FIELDS[key]
    raw = {f.section: {f.name: value}}
    error: InputError | None = None
    try:
        scenario_from_dict(raw)
    except InputError as exc:
        error = exc
    if error is not None and str(error).startswith(f.toml + " ="):
        assert error.key == key
        assert str(error) == f.toml + error.detail


def test_a_flags_error_names_the_flag_by_its_key():
    with pytest.raises(InputError) as err:
        cli._load({"scenario": "seed", "qps": -3.0})
    assert str(err.value).startswith("--qps ([workload] qps) = -3.0: expected")
    assert err.value.field == "--qps"


def test_the_scenario_reference_names_every_field():
    """docs/scenario.md's table is written for people; it must not miss a declared field."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "scenario.md").read_text()
    missing = [k for k, f in FIELDS.items() if f"`{f.name}`" not in text and k not in text]
    assert missing == []


def test_sweep_takes_every_numeric_field_by_its_flag_key_or_dotted_key():
    """`servelab sweep`'s names follow from the declarations: a new numeric field of a v2
    section is sweepable without a line elsewhere; each name runs the field it names."""
    from servelab.api import load, run_sweep
    from servelab.scenario import SWEEP_SECTIONS, sweep_names, sweep_params

    params = sweep_params()
    numeric = {k for k, f in FIELDS.items() if f.section in SWEEP_SECTIONS
               and f.type.removesuffix(" | None") in ("int", "float")}
    assert {key for key, _ in params.values()} == numeric
    assert len(sweep_names()) == len(numeric)
    for key in numeric:
        assert params[key] == (key, FIELDS[key].type.startswith("int"))
    # the flag's name, the TOML key and the dotted key are one parameter
    assert (params["max_queue_delay_us"] == params["max_queue_delay_microseconds"]
            == params["batching.max_queue_delay_microseconds"])
    assert params["slo_ms"] == params["p99_slo_ms"] == ("latency.p99_slo_ms", False)
    assert "cv" not in params  # two sections have it: only as workload.cv or model.cv
    s = load("seed", {"workload.num_requests": 2000})
    rows = run_sweep(s, "max_queue_delay_microseconds", [0, 4000])
    assert [r["max_queue_delay_microseconds"] for r in rows] == [0, 4000]
    assert rows[0]["mean_batch_size"] < rows[1]["mean_batch_size"]
    with pytest.raises(InputError) as e:
        run_sweep(s, "cv", [1.0])
    assert "give it as workload.cv or model.cv" in str(e.value)


def test_the_removed_absorb_rule_is_refused_with_its_fix():
    """`closing = "absorb"` (removed in 0.2.0) is one clear line; "triton", which every
    exported scenario holds, still loads."""
    assert scenario_from_dict({"batching": {"closing": "triton"}}).batching.closing.value \
        == "triton"
    with pytest.raises(InputError) as e:
        scenario_from_dict({"batching": {"closing": "absorb"}})
    assert e.value.key == "batching.closing"
    assert "removed in 0.2.0" in str(e.value)
    assert "fix: remove the key" in str(e.value)
