"""``model.py`` import, without the typed manifest (the front's Triton stubs import this)."""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType

from hloserve.errors import ModelPyImportError

#: The Python file of a meta bundle or of a model's hooks, in the bundle directory.
MODEL_PY = "model.py"


def import_model_py(path: Path, module_name: str) -> ModuleType:
    """Import a bundle's ``model.py`` as ``module_name`` (in ``sys.modules`` unless it fails);
    raises ModelPyImportError: the file cannot be loaded or running it raised."""
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
