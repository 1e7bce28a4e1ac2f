"""The bundle format: how a model reaches hloserve.

A bundle is a directory named after the model holding ``manifest.yaml``, one StableHLO portable
artifact per compiled batch size (and shape variant), ``weights.safetensors``, and optional
``model.py`` hooks; a meta bundle holds ``manifest.yaml`` and ``model.py`` only. This package
parses and checks it; it never imports Triton or gRPC.

The names below are imported from their modules on first use (PEP 562): the typed manifest
pulls in pydantic and PyYAML (about 13 MiB per process), which the front's Triton stubs never
need (they read :mod:`hloserve.bundle.front_spec`; docs/serving.md, "Front model config").

Modules:
    bundle: :class:`Bundle`, a bundle on disk (manifest, executables, weights); discovery.
    manifest: the typed ``manifest.yaml`` (formats 1 to 3), its parser and rules.
    manifest_sections: the manifest's sections: tensors, batching, variants, weights, meta.
    notation: the named-axis tensor notation, as plain functions.
    files: ``model.py`` import and its file name, without the typed manifest.
    safetensors_file: the one reader of ``weights.safetensors`` headers and tensors.
    front_spec: the small JSON spec a front model reads instead of the manifest.
    stablehlo: StableHLO artifacts: recognize, convert text to portable, read ``main``.
    convert: rewrite a bundle's MLIR text executables as portable artifacts, in place.
    validate: check a bundle end to end (:func:`check_bundle`, :func:`validate_bundle`).
    inspect: a readable summary of a bundle.
    dtypes: the one dtype table (manifest, NumPy, KServe V2, Triton, StableHLO, safetensors).
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

_MODULES = {
    "hloserve.bundle.bundle": ("Bundle", "discover_bundles", "load_bundle"),
    "hloserve.bundle.files": ("MODEL_PY",),
    "hloserve.bundle.manifest": (
        "FORMAT_VERSION",
        "MAX_FORMAT_VERSION",
        "META_FORMAT_VERSION",
        "MIN_FORMAT_VERSION",
        "Manifest",
        "load_manifest",
        "parse_manifest",
    ),
    "hloserve.bundle.manifest_sections": (
        "ClientTensorSpec",
        "MetaSection",
        "TensorSpec",
        "Variant",
        "Variants",
    ),
    "hloserve.bundle.safetensors_file": ("WeightInfo",),
    "hloserve.bundle.validate": ("Problem", "check_bundle", "validate_bundle"),
    "hloserve.errors": ("BundleError", "ManifestError"),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    """Import ``name`` from its module on first use (PEP 562; the typed manifest is heavy)."""
    try:
        module = _WHERE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)
