"""The bundle format: how a model reaches hloserve (docs/bundles.md); no Triton or gRPC here.

Names below are imported from their modules on first use (PEP 562): the typed manifest pulls in
pydantic and PyYAML, which the front's Triton stubs never need (they read ``front_spec``).

Modules: bundle (:class:`Bundle`, discovery), manifest and manifest_sections (the typed
``manifest.yaml``), notation, files (``model.py``), safetensors_file, front_spec, stablehlo,
convert (text to portable artifacts), validate, inspect, dtypes.
"""

# ruff: noqa: F401 (the names re-exported on first use)
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names of __all__, for type checkers
    from hloserve.bundle.bundle import Bundle, discover_bundles, load_bundle
    from hloserve.bundle.files import MODEL_PY
    from hloserve.bundle.manifest import (
        FORMAT_VERSION,
        MAX_FORMAT_VERSION,
        META_FORMAT_VERSION,
        MIN_FORMAT_VERSION,
        Manifest,
        load_manifest,
        parse_manifest,
    )
    from hloserve.bundle.manifest_sections import (
        ClientTensorSpec,
        MetaSection,
        TensorSpec,
        Variant,
        Variants,
    )
    from hloserve.bundle.safetensors_file import WeightInfo
    from hloserve.bundle.validate import Problem, check_bundle, validate_bundle
    from hloserve.errors import BundleError, ManifestError

#: The names of ``__all__`` by defining module.
_MODULES = {
    "hloserve.bundle.bundle": "Bundle discover_bundles load_bundle",
    "hloserve.bundle.files": "MODEL_PY",
    "hloserve.bundle.manifest": "FORMAT_VERSION MAX_FORMAT_VERSION META_FORMAT_VERSION "
    "MIN_FORMAT_VERSION Manifest load_manifest parse_manifest",
    "hloserve.bundle.manifest_sections": "ClientTensorSpec MetaSection TensorSpec Variant Variants",
    "hloserve.bundle.safetensors_file": "WeightInfo",
    "hloserve.bundle.validate": "Problem check_bundle validate_bundle",
    "hloserve.errors": "BundleError ManifestError",
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names.split()}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    """Import ``name`` from its module on first use (PEP 562; the typed manifest is heavy)."""
    try:
        module = _WHERE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)
