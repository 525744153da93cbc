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
    path: Path  # the .onnx file of this version
    policy: BatchingPolicy
    instances: int
    dynamic_batching: bool = True  # False: no dynamic_batching block, each request alone
    version: str = "1"  # the version folder served
    declared: tuple[Declared, ...] = ()  # the config's inputs and outputs, if it has them
    labels: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (output, its label file's lines)
    version_policy: tuple[str, tuple[int, ...]] = ("latest", (1,))  # as config.pbtxt says


@dataclass(frozen=True, slots=True)
class Declared:
    """An input or output as config.pbtxt declares it (dims without the batch one)."""

    kind: str  # "input" or "output"
    name: str
    datatype: str  # the v2 protocol's name: FP32, INT64, ...
    dims: tuple[int, ...]


# Every ModelConfig field the gateway runs as Triton does. Any other field set in a
# config.pbtxt is refused at load with one line: served silently, it would run
# differently from Triton (sequence batching, ensembles, priorities, a response cache,
# timeout_action DELAY, ...).
HONOURED = frozenset({
    "name", "platform", "backend", "max_batch_size", "default_model_filename",
    "input", "input.name", "input.data_type", "input.dims",
    "output", "output.name", "output.data_type", "output.dims", "output.label_filename",
    "version_policy", "version_policy.latest", "version_policy.latest.num_versions",
    "version_policy.all", "version_policy.specific", "version_policy.specific.versions",
    "instance_group", "instance_group.name", "instance_group.count", "instance_group.kind",
    "dynamic_batching", "dynamic_batching.preferred_batch_size",
    "dynamic_batching.max_queue_delay_microseconds", "dynamic_batching.default_queue_policy",
    "dynamic_batching.default_queue_policy.max_queue_size",
    "dynamic_batching.default_queue_policy.default_timeout_microseconds",
})


def check_config(cfg: Any, folder: str, where: str) -> None:
    """Refuse, with one line, a config the gateway would not run as Triton does."""
    _check_fields(cfg, "", where)
    if cfg.name and cfg.name != folder:  # Triton refuses to load it too
        raise InputError(f"{where}: name {cut(cfg.name, 80)!r} differs from its folder "
                         f"{cut(folder, 80)!r}; fix: name the model as its folder")
    if cfg.platform not in ("", "onnxruntime_onnx") or cfg.backend not in ("", "onnxruntime"):
        raise InputError(f"{where}: platform {cfg.platform!r}, backend {cfg.backend!r}: the "
                         "gateway runs ONNX models (platform onnxruntime_onnx); fix: export "
                         "the model to ONNX, or serve it with tritonserver")
    if cfg.max_batch_size < 1:
        raise InputError(f"{where}: max_batch_size {cfg.max_batch_size}: the gateway serves "
                         "models whose first dimension is the batch; fix: max_batch_size of "
                         "1 or more, with a dynamic first axis in the model")
    for g in cfg.instance_group:
        if g.kind not in (0, 2):  # KIND_AUTO, KIND_CPU
            kind = type(g).Kind.Name(g.kind)
            raise InputError(f"{where}: instance_group kind {kind}: the gateway runs its "
                             "instances on the CPU; fix: kind: KIND_CPU")


def _check_fields(msg: Any, prefix: str, where: str) -> None:
    for field, value in msg.ListFields():
        path = prefix + field.name
        if path not in HONOURED:
            if field.enum_type is not None and isinstance(value, int):
                value = field.enum_type.values_by_number[value].name
            shown = cut(str(value).replace("\n", " ").strip(), 60)
            raise InputError(f"{where}: {path} ({shown}) is not run by servelab's gateway as "
                             "Triton runs it; fix: remove it from the config, or serve this "
                             "model with tritonserver")
        if field.message_type is not None:  # a message, or a repeated one
            for item in [value] if hasattr(value, "ListFields") else value:
                _check_fields(item, path + ".", where)


MAX_LABEL_BYTES = 16 * 1024 * 1024


def read_labels(cfg: Any, folder: Path, where: str
                ) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Each output's label file (`label_filename`, a file in the model's folder, as
    Triton reads it): its lines, the label of the class at that index ("" for none)."""
    out = []
    for t in cfg.output:
        if not t.label_filename:
            continue
        name = t.label_filename
        if "/" in name or "\\" in name or name in (".", ".."):
            raise InputError(f"{where}: output {t.name!r} label_filename {cut(name, 80)!r}: "
                             "expected a file name in the model's folder; fix: put the "
                             "labels beside config.pbtxt and name the file alone")
        path = folder / name
        if not path.is_file():
            raise InputError(f"{where}: output {t.name!r} label_filename: no "
                             f"{cut(str(path))}; fix: write one label a line there")
        text = read_text(path, "label_filename", max_bytes=MAX_LABEL_BYTES,
                         what="label file")
        out.append((t.name, tuple(text.splitlines())))
    return tuple(out)


def declared_io(cfg: Any) -> tuple[Declared, ...]:
    """The config's inputs and outputs, with v2 data type names."""
    out = []
    for kind, tensors in (("input", cfg.input), ("output", cfg.output)):
        for t in tensors:
            dtype = _model_config_pb2().DataType.Name(t.data_type)
            v2 = {"TYPE_STRING": "BYTES"}.get(dtype, dtype.removeprefix("TYPE_"))
            out.append(Declared(kind, t.name, v2, tuple(t.dims)))
    return tuple(out)


def check_declared(declared: tuple[Declared, ...], model: Any, where: str) -> None:
    """The config's inputs and outputs against the ONNX model's, as Triton's ONNX Runtime
    backend checks them at load: the same names, data types and dims (a config dim may
    fix one the model leaves dynamic). Nothing to check when the config declares none."""
    for kind, have in (("input", model.inputs), ("output", model.outputs)):
        said = [d for d in declared if d.kind == kind]
        if not said:
            continue
        by_name = {t.name: t for t in have}
        if sorted(d.name for d in said) != sorted(by_name):
            raise InputError(f"{where}: {kind}s {sorted(d.name for d in said)}; the model has "
                             f"{sorted(by_name)}; fix: declare the model's {kind}s")
        for d in said:
            t = by_name[d.name]
            dims = t.shape[1:]
            ok = len(dims) == len(d.dims) and all(m == -1 or c == m
                                                  for c, m in zip(d.dims, dims, strict=True))
            if d.datatype != t.datatype or not ok:
                raise InputError(
                    f"{where}: {kind} {d.name!r}: {d.datatype} dims {list(d.dims)}; the model "
                    f"has {t.datatype} dims {list(dims)}; fix: declare what the model has")


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


MAX_VERSIONS = 64  # versions of one model served at once (each loads its model)


def version_policy(cfg: Any, where: str) -> tuple[str, tuple[int, ...]]:
    """config.pbtxt's version_policy as (kind, numbers): ("latest", (n,)), ("all", ()) or
    ("specific", versions); Triton's default when none is set: the latest one."""
    vp = cfg.version_policy
    kind = vp.WhichOneof("policy_choice") if cfg.HasField("version_policy") else None
    if kind == "all":
        return "all", ()
    if kind == "specific":
        versions = tuple(sorted(set(vp.specific.versions)))
        if not versions or min(versions) < 0:
            raise InputError(f"{where}: version_policy specific {{ versions: "
                             f"{list(vp.specific.versions)} }}: expected one or more version "
                             "numbers; fix: list the version folders to serve")
        return "specific", versions
    n = vp.latest.num_versions if kind == "latest" else 1
    if not 1 <= n <= MAX_VERSIONS:
        raise InputError(f"{where}: version_policy latest {{ num_versions: {n} }}: expected "
                         f"1 to {MAX_VERSIONS}; fix: the number of latest versions to serve")
    return "latest", (n,)


def served_versions(policy: tuple[str, tuple[int, ...]], have: list[int], where: str
                    ) -> list[int]:
    """The version folders a policy serves, as Triton picks them; a specific version
    without its folder is refused (Triton would leave it unloaded)."""
    kind, numbers = policy
    if kind == "all":
        chosen = have
    elif kind == "specific":
        missing = sorted(set(numbers) - set(have))
        if missing:
            raise InputError(f"{where}: version_policy specific lists version(s) {missing} "
                             f"with no folder (folders: {have}); fix: add the folders or "
                             "list only those there")
        chosen = list(numbers)
    else:
        chosen = have[-numbers[0]:]
    if len(chosen) > MAX_VERSIONS:
        raise InputError(f"{where}: {len(chosen)} versions to serve; expected at most "
                         f"{MAX_VERSIONS}; fix: a version_policy that serves fewer")
    return chosen


def policy_json(policy: tuple[str, tuple[int, ...]]) -> dict[str, Any]:
    """The version_policy as Triton's config JSON reports it."""
    kind, numbers = policy
    if kind == "all":
        return {"all": {}}
    if kind == "specific":
        return {"specific": {"versions": list(numbers)}}
    return {"latest": {"num_versions": numbers[0]}}


def load_repository(root: str | Path) -> list[RepoModel]:
    """Every model with a config.pbtxt, one RepoModel per version its version_policy
    serves (Triton's default: the highest numbered folder), each with an .onnx file."""
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
        check_config(cfg, d.name, where)
        folders = {int(v.name): v for v in d.iterdir()
                   if v.is_dir() and v.name.isdigit() and len(v.name) < 19}
        if not folders:
            raise InputError(f"{where}: no version folder (e.g. {d.name}/1/model.onnx); "
                             "fix: put the model in a numbered folder")
        vp = version_policy(cfg, where)
        filename = cfg.default_model_filename or "model.onnx"
        policy, instances = policy_from_config(cfg, where)
        declared, labels = declared_io(cfg), read_labels(cfg, d, where)
        for v in served_versions(vp, sorted(folders), where):
            onnx_path = folders[v] / filename
            if not onnx_path.is_file():
                raise InputError(f"{where}: no {cut(str(onnx_path))}; fix: export the model "
                                 f"there as {filename}")
            models.append(RepoModel(cfg.name or d.name, onnx_path, policy, instances,
                                    cfg.HasField("dynamic_batching"), str(v), declared,
                                    labels, vp))
    if not models:
        raise InputError(f"--model-repository = {cut(str(root))!r}: no model with a "
                         "config.pbtxt; fix: DIR/<model>/config.pbtxt and DIR/<model>/1/"
                         "model.onnx")
    return models
