"""A Triton model repository as Triton lays it out, its config.pbtxt read through
Triton's own ModelConfig message, and bad configs as one-line errors."""

from __future__ import annotations

import re

import pytest

from servelab.errors import InputError
from servelab.gateway.demo import write_mlp
from servelab.gateway.repository import check_declared, load_repository
from servelab.gateway.runner import OnnxModel

CONFIG = """
name: "fraud"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 1500
  default_queue_policy { max_queue_size: 64 default_timeout_microseconds: 20000 }
}
instance_group [ { count: 2 kind: KIND_CPU } ]
"""


def repo(tmp_path, config=CONFIG, version="3"):  # type: ignore[no-untyped-def]
    d = tmp_path / "fraud"
    (d / version).mkdir(parents=True)
    (d / "1").mkdir(exist_ok=True)
    write_mlp(d / version / "model.onnx")
    (d / "config.pbtxt").write_text(config)
    return tmp_path


def test_config_pbtxt_gives_the_policy_and_the_highest_version(tmp_path):
    [m] = load_repository(repo(tmp_path))
    assert m.name == "fraud"
    assert m.path == tmp_path / "fraud" / "3" / "model.onnx"
    p = m.policy
    assert (p.max_batch_size, p.preferred_batch_size, p.max_queue_delay_microseconds) == (
        16, (4, 8), 1500)
    assert (p.max_queue_size, p.default_timeout_microseconds, m.instances) == (64, 20000, 2)


@pytest.mark.parametrize(("config", "needle"), [
    ("max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: -1 }",
     "not a valid Triton model config"),
    ("max_batch_size: 8 nonsense_field: 3", "not a valid Triton model config"),
    ("max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 16 ] }",
     "preferred_batch_size"),
    ("max_batch_size: 8 instance_group [ { count: 500 } ]", "instances_per_gpu"),
])
def test_bad_configs_are_one_line(tmp_path, config, needle):
    with pytest.raises(InputError, match=needle) as e:
        load_repository(repo(tmp_path, config))
    assert "\n" not in str(e.value)


def test_missing_pieces_are_named(tmp_path):
    with pytest.raises(InputError, match="not a folder"):
        load_repository(tmp_path / "nope")
    with pytest.raises(InputError, match=r"no model with a config\.pbtxt"):
        load_repository(tmp_path)
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.pbtxt").write_text("max_batch_size: 4")
    with pytest.raises(InputError, match="no version folder"):
        load_repository(tmp_path)
    (d / "1").mkdir()
    with pytest.raises(InputError, match=r"no .*model.onnx"):
        load_repository(tmp_path)


# Fields Triton runs that the gateway does not: each refused at load with one line naming
# it (issue 31: served silently, they ran differently from Triton).
@pytest.mark.parametrize(("config", "needle"), [
    ("max_batch_size: 8 sequence_batching { }", "sequence_batching"),
    ("max_batch_size: 8 dynamic_batching { default_queue_policy { timeout_action: DELAY "
     "default_timeout_microseconds: 1000 } }", "timeout_action"),
    ("max_batch_size: 8 dynamic_batching { priority_levels: 2 default_priority_level: 1 }",
     "priority_levels"),
    ("max_batch_size: 8 response_cache { enable: true }", "response_cache"),
    ('max_batch_size: 8 parameters { key: "a" value: { string_value: "b" } }', "parameters"),
    ("max_batch_size: 8 model_warmup [ { name: \"w\" batch_size: 1 } ]", "model_warmup"),
    ('platform: "ensemble" max_batch_size: 8 ensemble_scheduling { }', "ensemble"),
    ('backend: "python" max_batch_size: 8', "backend 'python'"),
    ('name: "other" max_batch_size: 8', "differs from its folder"),
    ("max_batch_size: 0", "max_batch_size 0"),
    ("max_batch_size: 8 instance_group [ { kind: KIND_GPU } ]", "KIND_GPU"),
    ("max_batch_size: 8 version_policy { latest { num_versions: 0 } }", "num_versions: 0"),
    ("max_batch_size: 8 version_policy { specific { versions: [ 3, 5 ] } }",
     "version(s) [5] with no folder"),
    ("max_batch_size: 8 version_policy { specific { } }", "one or more version numbers"),
    ('max_batch_size: 8 input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] '
     'reshape { shape: [ 4, 4 ] } } ]', "input.reshape"),
])
def test_fields_not_run_as_triton_runs_them_are_refused(tmp_path, config, needle):
    with pytest.raises(InputError, match=re.escape(needle)) as e:
        load_repository(repo(tmp_path, config))
    assert "\n" not in str(e.value)
    assert "fix:" in str(e.value)


@pytest.mark.parametrize(("io", "needle"), [
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 15 ] } ]', "dims [15]"),
    ('input [ { name: "x" data_type: TYPE_INT64 dims: [ 16 ] } ]', "INT64"),
    ('input [ { name: "z" data_type: TYPE_FP32 dims: [ 16 ] } ]', "['z']"),
    ('output [ { name: "y" data_type: TYPE_FP32 dims: [ 4, 1 ] } ]', "dims [4, 1]"),
])
def test_declared_inputs_and_outputs_must_be_the_models(tmp_path, io, needle):
    [m] = load_repository(repo(tmp_path, f"max_batch_size: 8 {io}"))
    model = OnnxModel(m.path, m.name)
    with pytest.raises(InputError, match=re.escape(needle)) as e:
        check_declared(m.declared, model, "fraud/config.pbtxt")
    assert "\n" not in str(e.value)


def test_the_full_config_declares_what_the_model_has(tmp_path):
    [m] = load_repository(repo(tmp_path))
    assert [(d.kind, d.name, d.datatype, d.dims) for d in m.declared] == [
        ("input", "x", "FP32", (16,)), ("output", "y", "FP32", (4,))]
    check_declared(m.declared, OnnxModel(m.path, m.name), "fraud/config.pbtxt")


@pytest.mark.parametrize(("label_file", "needle"), [
    ("../secret.txt", "a file name in the model's folder"),
    ("/etc/passwd", "a file name in the model's folder"),
    ("nope.txt", "no "),
])
def test_a_label_file_is_a_file_beside_the_config(tmp_path, label_file, needle):
    io = ('output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] label_filename: '
          f'"{label_file}" }} ]')
    with pytest.raises(InputError, match=re.escape(needle)) as e:
        load_repository(repo(tmp_path, f"max_batch_size: 8 {io}"))
    assert "\n" not in str(e.value)


def test_label_file_lines_are_the_labels(tmp_path):
    io = 'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "l.txt" } ]'
    root = repo(tmp_path, f"max_batch_size: 8 {io}")
    (root / "fraud" / "l.txt").write_text("a\n\nc\n")
    [m] = load_repository(root)
    assert m.labels == (("y", ("a", "", "c")),)


@pytest.mark.parametrize(("policy", "served"), [
    ("", ["7"]),  # Triton's default: the highest alone
    ("version_policy { latest { num_versions: 2 } }", ["3", "7"]),
    ("version_policy { latest { num_versions: 9 } }", ["1", "3", "7"]),
    ("version_policy { all { } }", ["1", "3", "7"]),
    ("version_policy { specific { versions: [ 1, 7 ] } }", ["1", "7"]),
])
def test_version_policy_picks_the_versions_triton_serves(tmp_path, policy, served):
    d = tmp_path / "fraud"
    for v in ("1", "3", "7", "x"):  # "x" is no version folder
        (d / v).mkdir(parents=True)
        write_mlp(d / v / "model.onnx")
    (d / "config.pbtxt").write_text(f"max_batch_size: 8 {policy}")
    models = load_repository(tmp_path)
    assert [m.version for m in models] == served
    assert {m.path.parent.name for m in models} == set(served)
