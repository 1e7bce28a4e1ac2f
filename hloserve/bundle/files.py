"""A bundle's files read without its manifest model: the weights' header and ``model.py``.

The front reads these in every Triton stub (docs/serving.md, "Front model config"), so this
module imports only NumPy, the dtype table and, on use, ``safetensors``; the typed
:class:`~hloserve.bundle.bundle.Bundle` answers through the same functions.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from hloserve.bundle import dtypes
from hloserve.errors import InvalidArgumentError

#: The Python file of a meta bundle (and of a model's hooks), relative to the bundle directory.
MODEL_PY = "model.py"


@dataclass(frozen=True)
class WeightInfo:
    """Shape and dtype of one weight as stored in the safetensors file."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # manifest token

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * dtypes.from_token(self.dtype).itemsize


def read_weight_infos(path: Path) -> dict[str, WeightInfo]:
    """Every tensor in a safetensors file, by name, read from its header only.

    Raises:
        InvalidArgumentError: the file is missing, unreadable, or holds an unknown dtype.
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            infos = {}
            for key in f.keys():  # noqa: SIM118  (safe_open is not a Mapping)
                tensor = f.get_slice(key)
                token = dtypes.from_safetensors(tensor.get_dtype()).token
                infos[key] = WeightInfo(key, tuple(tensor.get_shape()), token)
            return infos
    except (OSError, SafetensorError) as exc:
        raise InvalidArgumentError(f"{path}: cannot read safetensors file: {exc}") from None


class ModelPyImportError(Exception):
    """A bundle's ``model.py`` could not be imported; ``str()`` is the exception, one line per
    ``traceback.format_exception_only`` line (file and line included for a syntax error)."""


def import_model_py(path: Path, module_name: str) -> ModuleType:
    """Import a bundle's ``model.py`` (hooks or a meta's ``run``) as ``module_name``.

    The module is registered in ``sys.modules`` (so its own dataclasses and pickling work) and
    removed again when its import fails.

    Raises:
        ModelPyImportError: the file cannot be loaded or running it raised.
    """
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ModelPyImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ModelPyImportError(
            "".join(traceback.format_exception_only(type(exc), exc)).strip()
        ) from None
    return module


__all__ = ["MODEL_PY", "ModelPyImportError", "WeightInfo", "import_model_py", "read_weight_infos"]
