"""Foreign models: Triton models of any backend beside the bundles of a source directory.

A folder with a ``config.pbtxt`` is carried over as it is (after checks); one without gets a
minimal config from its model file (:data:`BACKEND_FILES`) and its ``hloserve.yaml``
(:class:`ForeignSpec`). docs/serving.md, "Foreign models", gives the rules and the file.
"""

from __future__ import annotations

import ast
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hloserve.errors import ForeignModelError

#: The file beside a foreign model that describes what its folder cannot say.
FOREIGN_FILE = "hloserve.yaml"
#: Triton's configuration file of a model.
CONFIG_FILE = "config.pbtxt"
#: Default model file name -> Triton backend (Triton docs, "Model Repository": model files).
BACKEND_FILES: Mapping[str, str] = {
    "model.onnx": "onnxruntime",
    "model.pt": "pytorch",
    "model.plan": "tensorrt",
    "model.savedmodel": "tensorflow",
    "model.py": "python",
}
#: Backends whose tensors Triton's auto-complete fills in from the model file itself.
AUTO_COMPLETE_BACKENDS = frozenset({"onnxruntime", "tensorrt", "tensorflow"})
#: Platforms tritonserver runs in its core, without a backend: an ensemble's steps run on
#: their own models' backends (Triton docs, "Ensemble Models").
BUILTIN_PLATFORMS = frozenset({"ensemble"})
#: Version directory the files of a flat foreign model are copied into.
FLAT_VERSION = "1"

_VERSION = re.compile(r"^[0-9]+$")


class ForeignTensor(BaseModel):
    """An input or output in ``hloserve.yaml``, in Triton's own terms."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    data_type: str
    dims: list[int]

    @field_validator("data_type")
    @classmethod
    def _type_ok(cls, value: str) -> str:
        from tritonclient.grpc import model_config_pb2 as m

        try:
            known = m.DataType.Value(value) != m.TYPE_INVALID
        except ValueError:
            known = False
        if not known:
            raise ValueError(f"data_type {value!r} is not a Triton type (TYPE_FP32, ...)")
        return value


class ForeignSpec(BaseModel):
    """``hloserve.yaml``: what a foreign model's folder does not say itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: str | None = None
    max_batch_size: int = Field(default=0, ge=0)
    inputs: list[ForeignTensor] = Field(default_factory=list)
    outputs: list[ForeignTensor] = Field(default_factory=list)
    memory_bytes: int | None = Field(default=None, ge=0)


@dataclass(frozen=True)
class ForeignModel:
    """A Triton model of another backend, planned for a repository.

    Attributes:
        flat: the model file sits at the folder's top and is copied into version ``1``.
        memory_bytes: device memory the gateway charges for it (``hloserve.yaml``'s hint, else
            the folder's size in bytes).
        inputs: the config's inputs as ``(name, data_type, dims)`` (empty when auto-completed).
    """

    name: str
    source: Path
    backend: str
    config_text: str
    flat: bool
    memory_bytes: int
    inputs: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
    max_batch_size: int = 0


def is_candidate(path: Path) -> bool:
    """Whether a subdirectory of a source directory is a model (not hidden, not __pycache__)."""
    return path.is_dir() and not path.name.startswith(".") and path.name != "__pycache__"


def plan_foreign(path: Path) -> ForeignModel:
    """Plan the folder ``path`` as a foreign Triton model; raises ForeignModelError: no recognizable
    model (naming the files found), model files of two backends, a config whose name differs from
    the folder or without a version directory, a bad ``hloserve.yaml``, or a model Triton cannot
    complete a config for."""
    name = path.name
    spec = _read_spec(path)
    config_path = path / CONFIG_FILE
    if config_path.is_file():
        config = _parse_config(config_path)
        if config.name and config.name != name:
            raise ForeignModelError(
                f"{path}: {CONFIG_FILE} names the model {config.name!r}, but its folder is "
                f"{name!r}; Triton requires the two to match (rename one)"
            )
        if not _versions(path):
            raise ForeignModelError(
                f"{path}: has a {CONFIG_FILE} but no version directory (e.g. {name}/1/ holding "
                f"the model file); found {_listing(path)}"
            )
        backend = config.backend or config.platform or (spec.backend if spec else None)
        if not backend:
            raise ForeignModelError(f"{path}: {CONFIG_FILE} sets neither backend nor platform")
        backend, text, flat = _backend_of_platform(backend), config_path.read_text(), False
    else:
        from hloserve.model_repository_tools.config import config_text

        backend, config, flat = _generate(path, spec)
        text = config_text(config)
    return ForeignModel(
        name=name,
        source=path,
        backend=backend,
        config_text=text,
        flat=flat,
        memory_bytes=_memory(path, spec),
        inputs=_inputs(config),
        max_batch_size=config.max_batch_size,
    )


def _generate(path: Path, spec: ForeignSpec | None) -> tuple[str, Any, bool]:
    """(backend, ``ModelConfig``, flat) of a folder without a config."""
    from tritonclient.grpc import model_config_pb2 as m

    backend, flat = _detect(path, spec)
    config = m.ModelConfig(name=path.name, backend=backend)
    if spec is not None:
        config.max_batch_size = spec.max_batch_size
        for role, tensors in (("input", spec.inputs), ("output", spec.outputs)):
            for t in tensors:
                getattr(config, role).add(
                    name=t.name, data_type=m.DataType.Value(t.data_type), dims=t.dims
                )
    if not config.input and not _auto_completes(backend, path, flat):
        what = "a TorchScript" if backend == "pytorch" else f"a {backend}"
        raise ForeignModelError(
            f"{path}: {what} model without a {CONFIG_FILE}: Triton cannot work out its inputs "
            f"and outputs. Add a {CONFIG_FILE}, or an {FOREIGN_FILE} with inputs and outputs "
            "(docs/serving.md, 'Foreign models')"
            + (
                ", or an auto_complete_config to its TritonPythonModel"
                if backend == "python"
                else ""
            )
        )
    return backend, config, flat


def write_foreign(model: ForeignModel, model_dir: Path) -> None:
    """Copy ``model`` into ``model_dir`` (a new directory) in Triton's layout, with its config."""
    skip = {FOREIGN_FILE, CONFIG_FILE}
    if model.flat:
        version = model_dir / FLAT_VERSION
        version.mkdir(parents=True)
        for entry in sorted(model.source.iterdir()):
            if entry.name in skip or entry.name.startswith("."):
                continue
            if entry.is_dir():
                shutil.copytree(entry, version / entry.name)
            else:
                shutil.copy2(entry, version / entry.name)
    else:
        shutil.copytree(
            model.source,
            model_dir,
            ignore=lambda _d, names: [n for n in names if n in skip or n.startswith(".")],
        )
    (model_dir / CONFIG_FILE).write_text(model.config_text)


def repository_backends(repository: Path) -> dict[str, list[str]]:
    """Backend -> models that need it, from every ``config.pbtxt`` of a model repository
    (ensembles need none; configs that do not parse are skipped)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as m

    needed: dict[str, list[str]] = {}
    if not repository.is_dir():
        return needed
    for file in sorted(repository.glob(f"*/{CONFIG_FILE}")):
        try:
            config = text_format.Parse(file.read_text(), m.ModelConfig())
        except (text_format.ParseError, OSError, UnicodeDecodeError):
            continue
        backend = config.backend or _backend_of_platform(config.platform)
        if backend and backend not in BUILTIN_PLATFORMS:
            needed.setdefault(backend, []).append(file.parent.name)
    return needed


def _read_spec(path: Path) -> ForeignSpec | None:
    file = path / FOREIGN_FILE
    if not file.is_file():
        return None
    try:
        data = yaml.safe_load(file.read_text()) or {}
        return ForeignSpec.model_validate(data)
    except yaml.YAMLError as exc:
        raise ForeignModelError(f"{file}: not valid YAML: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'file'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise ForeignModelError(f"{file}: {problems}") from None


def _parse_config(file: Path) -> Any:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as m

    try:
        return text_format.Parse(file.read_text(), m.ModelConfig())
    except text_format.ParseError as exc:
        raise ForeignModelError(f"{file}: not a Triton model configuration: {exc}") from None


def _versions(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and _VERSION.match(p.name))


def _listing(path: Path) -> list[str]:
    return [
        str(entry.relative_to(path)) + ("/" if entry.is_dir() else "")
        for entry in sorted(path.rglob("*"))
        if not any(part.startswith(".") or part == "__pycache__" for part in entry.parts)
    ][:20]


def _detect(path: Path, spec: ForeignSpec | None) -> tuple[str, bool]:
    """(backend, flat) of a folder without a config; ``hloserve.yaml``'s backend wins."""
    flat = [f for f in BACKEND_FILES if (path / f).exists()]
    versioned = {f for v in _versions(path) for f in BACKEND_FILES if (v / f).exists()}
    if flat and versioned:
        raise ForeignModelError(
            f"{path}: model files both at the top ({flat}) and in version directories "
            f"({sorted(versioned)}); use one layout"
        )
    files = flat or sorted(versioned)
    if spec is not None and spec.backend:
        if not files and not _versions(path):
            raise ForeignModelError(
                f"{path}: {FOREIGN_FILE} says backend {spec.backend!r} but the folder has no "
                f"version directory and no model file; found {_listing(path)}"
            )
        return spec.backend, bool(flat) or not _versions(path)
    backends = sorted({BACKEND_FILES[f] for f in files})
    if not backends:
        found = _listing(path) or "nothing"
        raise ForeignModelError(
            f"{path}: neither a bundle (no manifest.yaml) nor a Triton model (no {CONFIG_FILE} "
            f"and no model file among {sorted(BACKEND_FILES)}); found {found}"
        )
    if len(backends) > 1:
        raise ForeignModelError(
            f"{path}: model files of different backends {files} ({', '.join(backends)}); keep "
            f"one, or say which in {FOREIGN_FILE} (backend: ...)"
        )
    return backends[0], bool(flat)


def _auto_completes(backend: str, path: Path, flat: bool) -> bool:
    if backend in AUTO_COMPLETE_BACKENDS:
        return True
    if backend != "python":
        return False
    files = [path / "model.py"] if flat else [v / "model.py" for v in _versions(path)]
    return any(f.is_file() and _defines_auto_complete(f) for f in files)


def _defines_auto_complete(file: Path) -> bool:
    """Whether ``class TritonPythonModel`` in ``file`` defines ``auto_complete_config``."""
    try:
        tree = ast.parse(file.read_text(), str(file))
    except (SyntaxError, UnicodeDecodeError):
        return False
    return any(
        isinstance(node, ast.ClassDef)
        and node.name == "TritonPythonModel"
        and any(
            isinstance(item, ast.FunctionDef) and item.name == "auto_complete_config"
            for item in node.body
        )
        for node in tree.body
    )


def _backend_of_platform(name: str) -> str:
    """The backend a config's ``platform`` runs on (Triton docs, "Backends": platform names)."""
    platforms = {
        "onnxruntime_onnx": "onnxruntime",
        "pytorch_libtorch": "pytorch",
        "tensorrt_plan": "tensorrt",
        "tensorflow_savedmodel": "tensorflow",
        "tensorflow_graphdef": "tensorflow",
    }
    return platforms.get(name, name)


def _memory(path: Path, spec: ForeignSpec | None) -> int:
    if spec is not None and spec.memory_bytes is not None:
        return spec.memory_bytes
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _inputs(config: Any) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    from tritonclient.grpc import model_config_pb2 as m

    return tuple((t.name, m.DataType.Name(t.data_type), tuple(t.dims)) for t in config.input)
