"""The ``pb_utils`` shims (``<name>/model.py``, selected by ``backend: "<name>"``) and their
adapters, which take ``pb_utils`` as an argument and never import it."""

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
