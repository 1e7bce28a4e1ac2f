"""The ``pb_utils`` shims: the Python-based Triton backends and their adapters.

``<name>/model.py`` (``hloserve_front``, ``hloserve_runtime``, ``hloserve_meta``) is selected by
``backend: "<name>"``; :func:`backend_dirs` gives the directories a tritonserver's
``--backend-directory`` needs. ``pb`` (error codes, responses), ``dlpack`` (tensor moves) and
``metrics`` (Triton custom metrics) take ``pb_utils`` as an argument and never import it.
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
