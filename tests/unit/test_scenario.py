"""Scenario loading, validation messages, overrides and the TOML round trip."""

from __future__ import annotations

import tomllib

import pytest

from servelab.errors import InputError
from servelab.scenario import (
    Arrival,
    ServiceKind,
    load_scenario,
    scenario_from_dict,
    scenario_to_toml,
)


def test_seed_loads_with_the_dashboard_figures():
    s = load_scenario("seed")
    assert s.workload.qps == 2000
    assert s.batching.max_queue_delay_microseconds == 2000
    assert s.hardware.gpu == "H100-SXM"
    assert s.hardware.num_gpus == 2
    assert (s.latency.feature_fetch_ms, s.latency.network_ms) == (3.0, 5.0)
    assert s.model.kind is ServiceKind.ROOFLINE
    assert s.llm is not None
    assert s.llm.context_tokens == 4096


def test_defaults_make_a_valid_scenario():
    s = scenario_from_dict({})
    assert s.workload.arrival is Arrival.POISSON
    assert s.batching.effective_preferred == (s.batching.max_batch_size,)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"batching": {"max_queue_delay_us": 10}},
         "did you mean 'max_queue_delay_microseconds'?"),
        ({"workload": {"qsp": 10}}, "did you mean 'qps'?"),
        ({"batchng": {}}, "did you mean 'batching'?"),
        ({"workload": {"qps": -5}}, "[workload] qps = -5: expected a number > 0"),
        ({"workload": {"qps": "fast"}}, "[workload] qps = 'fast'"),
        ({"batching": {"max_batch_size": 0}}, "[batching] max_batch_size = 0"),
        ({"batching": {"max_batch_size": 4, "preferred_batch_size": [8]}},
         "no larger than max_batch_size (4)"),
        ({"workload": {"arrival": "poison"}}, "did you mean 'poisson'?"),
        ({"hardware": {"gpu": "H10"}}, "[hardware] gpu = 'H10'"),
        ({"model": {"kind": "constant"}}, "[model] latency_ms"),
        ({"model": {"kind": "affine", "latency_ms": 2}},
         "remove latency_ms or set kind to constant"),
        ({"model": {"kind": "profile"}}, "exactly one source"),
        ({"model": {"kind": "profile", "points": [[1, 2], [1, 3]]}},
         "each batch size at most once"),
        ({"workload": {"arrival": "trace"}}, "[workload] trace_csv"),
        ({"latency": {"network_ms": 5, "network_p99_ms": 4}}, "[latency] network_p99_ms"),
        ({"model": {"kind": "roofline", "flops_per_row": 1e9, "precision": "fp8"},
          "hardware": {"gpu": "A100-80GB"}}, None),
    ],
)
def test_bad_input_names_field_value_and_fix(raw, expected):
    if expected is None:  # valid as a scenario; the GPU check happens when the model is built
        scenario_from_dict(raw)
        return
    with pytest.raises(InputError) as err:
        scenario_from_dict(raw)
    msg = str(err.value)
    assert expected in msg
    assert "fix:" in msg
    assert "\n" not in msg


def test_fp8_on_a_gpu_without_fp8_is_a_clear_error():
    from servelab.batching.service import build_service_model

    s = scenario_from_dict({"model": {"kind": "roofline", "flops_per_row": 1e9,
                                      "precision": "fp8"}, "hardware": {"gpu": "A100-80GB"}})
    with pytest.raises(InputError, match="no FP8"):
        build_service_model(s.model, s.hardware.spec(), 8)


def test_gpu_names_are_forgiving_and_figures_overridable():
    s = scenario_from_dict({"hardware": {"gpu": "h100", "hbm_bandwidth_tbps": 4.0,
                                         "price_per_gpu_hour": 1.5}})
    spec = s.hardware.spec()
    assert spec.key == "H100-SXM"
    assert spec.hbm_bandwidth_tbps == 4.0
    assert spec.price_per_gpu_hour_usd == 1.5
    assert dict(spec.sources)["hbm_bandwidth_tbps"].source == "scenario override"


def test_overrides_are_validated_like_the_file():
    s = load_scenario("seed")
    t = s.with_overrides({"workload.qps": 500, "batching.preferred_batch_size": [4, 8]})
    assert t.workload.qps == 500
    assert t.batching.preferred_batch_size == (4, 8)
    with pytest.raises(InputError, match=r"\[batching\] max_batch_size = -1"):
        s.with_overrides({"batching.max_batch_size": -1})


def test_toml_round_trip(tmp_path):
    s = load_scenario("seed").with_overrides({"batching.preferred_batch_size": [4],
                                              "hardware.hbm_bandwidth_tbps": 3.0})
    text = scenario_to_toml(s)
    tomllib.loads(text)
    path = tmp_path / "s.toml"
    path.write_text(text)
    back = load_scenario(path)
    assert scenario_to_toml(back) == text
    assert back.batching == s.batching
    assert back.model == s.model
    assert back.llm == s.llm


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_scenario(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[workload\nqps = 1")
    with pytest.raises(InputError, match="not valid TOML"):
        load_scenario(bad)
