"""A Triton model repository: ``DIR/<model>/config.pbtxt`` and ``DIR/<model>/<version>/
model.onnx``. The config is parsed with protobuf's text format over Triton's own
``ModelConfig`` message (shipped in the tritonclient package), never with regular
expressions, and its batching settings are validated like a scenario's."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from servelab.errors import InputError, cut
from servelab.files import MAX_CONFIG_BYTES, read_text
from servelab.scenario import BatchingPolicy, scenario_from_dict


@dataclass(frozen=True, slots=True)
class RepoModel:
    name: str
    path: Path  # the .onnx file of the highest version
    policy: BatchingPolicy
    instances: int
    dynamic_batching: bool = True  # False: no dynamic_batching block, each request alone
    version: str = "1"  # the version folder served


@cache
def _model_config_pb2() -> ModuleType:
    """Triton's ModelConfig protobuf module from the tritonclient package.

    tritonclient keeps it under ``tritonclient/grpc``, whose ``__init__`` refuses to
    import without the grpc extra, though the message module needs only protobuf: load
    the module file itself.
    """
    spec = importlib.util.find_spec("tritonclient")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("config.pbtxt: reading it needs the tritonclient package; "
                         "fix: pip install tritonclient")
    path = Path(next(iter(spec.submodule_search_locations))) / "grpc" / "model_config_pb2.py"
    mspec = importlib.util.spec_from_file_location("servelab_triton_model_config_pb2", path)
    if mspec is None or mspec.loader is None or not path.is_file():
        raise InputError(f"config.pbtxt: tritonclient has no {path.name}; "
                         "fix: pip install --upgrade tritonclient")
    module = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(module)
    return module


def parse_config(text: str, where: str) -> Any:
    """A config.pbtxt's text as Triton's ModelConfig message."""
    from google.protobuf import text_format

    pb2 = _model_config_pb2()
    try:
        return text_format.Parse(text, pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise InputError(f"{where}: not a valid Triton model config ({cut(str(exc), 200)}); "
                         "fix: correct the config.pbtxt") from None


def policy_from_config(cfg: Any, where: str) -> tuple[BatchingPolicy, int]:
    """The batching policy and instance count a ModelConfig describes."""
    db = cfg.dynamic_batching
    qp = db.default_queue_policy
    raw = {
        "max_batch_size": cfg.max_batch_size or 1,
        "max_queue_delay_microseconds": int(db.max_queue_delay_microseconds),
        "preferred_batch_size": list(db.preferred_batch_size),
        "max_queue_size": int(qp.max_queue_size),
        "default_timeout_microseconds": int(qp.default_timeout_microseconds),
    }
    instances = sum(g.count or 1 for g in cfg.instance_group) or 1
    try:
        s = scenario_from_dict({"batching": {**raw, "instances_per_gpu": instances}})
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
    return s.batching, instances


def load_repository(root: str | Path) -> list[RepoModel]:
    """Every model with a config.pbtxt and an .onnx file in its highest version folder."""
    base = Path(root)
    if not base.is_dir():
        raise InputError(f"--model-repository = {cut(str(root))!r}: not a folder; "
                         "fix: give a Triton model repository (DIR/<model>/config.pbtxt)")
    models = []
    for d in sorted(p for p in base.iterdir() if p.is_dir()):
        cfg_path = d / "config.pbtxt"
        if not cfg_path.is_file():
            continue
        where = cut(str(cfg_path))
        cfg = parse_config(read_text(cfg_path, "config.pbtxt", max_bytes=MAX_CONFIG_BYTES,
                                     what="config.pbtxt"), where)
        versions = sorted((int(v.name), v) for v in d.iterdir()
                          if v.is_dir() and v.name.isdigit())
        if not versions:
            raise InputError(f"{where}: no version folder (e.g. {d.name}/1/model.onnx); "
                             "fix: put the model in a numbered folder")
        if cfg.HasField("version_policy") and not (
                cfg.version_policy.HasField("latest")
                and cfg.version_policy.latest.num_versions <= 1):
            raise InputError(
                f"{where}: version_policy {cut(str(cfg.version_policy).strip(), 80)!r}: "
                "servelab serves one version of a model, the highest numbered folder "
                "(Triton's default, latest { num_versions: 1 }); fix: remove version_policy "
                "or serve each version as a model of its own name")
        filename = cfg.default_model_filename or "model.onnx"
        onnx_path = versions[-1][1] / filename
        if not onnx_path.is_file():
            raise InputError(f"{where}: no {cut(str(onnx_path))}; fix: export the model "
                             f"there as {filename}")
        policy, instances = policy_from_config(cfg, where)
        models.append(RepoModel(cfg.name or d.name, onnx_path, policy, instances,
                                cfg.HasField("dynamic_batching"), str(versions[-1][0])))
    if not models:
        raise InputError(f"--model-repository = {cut(str(root))!r}: no model with a "
                         "config.pbtxt; fix: DIR/<model>/config.pbtxt and DIR/<model>/1/"
                         "model.onnx")
    return models
