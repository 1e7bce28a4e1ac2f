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

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_WHERE = {
    "Bundle": "hloserve.bundle.bundle",
    "WeightInfo": "hloserve.bundle.safetensors_file",
    "discover_bundles": "hloserve.bundle.bundle",
    "load_bundle": "hloserve.bundle.bundle",
    "FORMAT_VERSION": "hloserve.bundle.manifest",
    "MAX_FORMAT_VERSION": "hloserve.bundle.manifest",
    "META_FORMAT_VERSION": "hloserve.bundle.manifest",
    "MIN_FORMAT_VERSION": "hloserve.bundle.manifest",
    "MODEL_PY": "hloserve.bundle.files",
    "ClientTensorSpec": "hloserve.bundle.manifest_sections",
    "Manifest": "hloserve.bundle.manifest",
    "ManifestError": "hloserve.errors",
    "MetaSection": "hloserve.bundle.manifest_sections",
    "TensorSpec": "hloserve.bundle.manifest_sections",
    "Variant": "hloserve.bundle.manifest_sections",
    "Variants": "hloserve.bundle.manifest_sections",
    "load_manifest": "hloserve.bundle.manifest",
    "parse_manifest": "hloserve.bundle.manifest",
    "BundleError": "hloserve.errors",
    "Problem": "hloserve.bundle.validate",
    "check_bundle": "hloserve.bundle.validate",
    "validate_bundle": "hloserve.bundle.validate",
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
    module = importlib.import_module(_WHERE[name])
    return getattr(module, name)
