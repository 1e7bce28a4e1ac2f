"""The bundle format: how a model reaches hloserve.

A bundle is a directory named after the model holding ``manifest.yaml``, one StableHLO portable
artifact per compiled batch size (and shape variant), ``weights.safetensors``, and optional
``model.py`` hooks; a meta bundle holds ``manifest.yaml`` and ``model.py`` only. This package
parses and checks it; it never imports Triton or gRPC.

The names below are imported from their modules on first use (PEP 562): the typed manifest
pulls in pydantic and PyYAML (about 13 MiB per process), which the front's Triton stubs never
need (they read :mod:`hloserve.bundle.front_spec`; docs/serving.md, "Front model config").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hloserve.bundle.bundle import Bundle, WeightInfo, discover_bundles, load_bundle
    from hloserve.bundle.manifest import (
        FORMAT_VERSION,
        MAX_FORMAT_VERSION,
        META_FORMAT_VERSION,
        MIN_FORMAT_VERSION,
        MODEL_PY,
        ClientTensorSpec,
        Manifest,
        ManifestError,
        MetaSection,
        TensorSpec,
        Variant,
        Variants,
        load_manifest,
        parse_manifest,
    )
    from hloserve.bundle.validate import BundleError, Problem, check_bundle, validate_bundle

_WHERE = {
    "Bundle": "bundle",
    "WeightInfo": "bundle",
    "discover_bundles": "bundle",
    "load_bundle": "bundle",
    "FORMAT_VERSION": "manifest",
    "MAX_FORMAT_VERSION": "manifest",
    "META_FORMAT_VERSION": "manifest",
    "MIN_FORMAT_VERSION": "manifest",
    "MODEL_PY": "manifest",
    "ClientTensorSpec": "manifest",
    "Manifest": "manifest",
    "ManifestError": "manifest",
    "MetaSection": "manifest",
    "TensorSpec": "manifest",
    "Variant": "manifest",
    "Variants": "manifest",
    "load_manifest": "manifest",
    "parse_manifest": "manifest",
    "BundleError": "validate",
    "Problem": "validate",
    "check_bundle": "validate",
    "validate_bundle": "validate",
}

__all__ = [
    "FORMAT_VERSION",
    "MAX_FORMAT_VERSION",
    "META_FORMAT_VERSION",
    "MIN_FORMAT_VERSION",
    "MODEL_PY",
    "Bundle",
    "BundleError",
    "ClientTensorSpec",
    "Manifest",
    "ManifestError",
    "MetaSection",
    "Problem",
    "TensorSpec",
    "Variant",
    "Variants",
    "WeightInfo",
    "check_bundle",
    "discover_bundles",
    "load_bundle",
    "load_manifest",
    "parse_manifest",
    "validate_bundle",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{_WHERE[name]}")
    return getattr(module, name)
