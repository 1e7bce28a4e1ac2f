"""A bundle's files read without its manifest model: the weights' header and ``model.py``.

The weights' header is read by the one safetensors reader,
:func:`hloserve.bundle.safetensors_file.stored_tensors`.

The front reads these in every Triton stub (docs/serving.md, "Front model config"), so this
module imports only NumPy, the dtype table and, on use, ``safetensors``; the typed
:class:`~hloserve.bundle.bundle.Bundle` answers through the same functions.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType

from hloserve.errors import ModelPyImportError

#: The Python file of a meta bundle (and of a model's hooks), relative to the bundle directory.
MODEL_PY = "model.py"


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


__all__ = ["MODEL_PY", "import_model_py"]
