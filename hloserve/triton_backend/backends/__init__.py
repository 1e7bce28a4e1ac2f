"""The Python-based Triton backends: ``<name>/model.py``, selected by ``backend: "<name>"``.

:func:`backend_dirs` gives the directories a tritonserver's ``--backend-directory`` needs.
"""

from __future__ import annotations

from pathlib import Path

from hloserve import names

_HERE = Path(__file__).resolve().parent


def backend_dirs() -> dict[str, Path]:
    """Backend name -> directory holding its ``model.py`` (for ``extra_backend_dirs``)."""
    return {
        name: _HERE / name
        for name in (names.FRONT_BACKEND, names.RUNTIME_BACKEND, names.META_BACKEND)
    }


__all__ = ["backend_dirs"]
