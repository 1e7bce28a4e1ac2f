"""The bundle format: how a model reaches hloserve.

A bundle is a directory named after the model holding ``manifest.yaml``, one StableHLO portable
artifact per compiled batch size (and shape variant), ``weights.safetensors``, and optional
``model.py`` hooks; a
meta bundle holds ``manifest.yaml`` and ``model.py`` only. This
package parses and checks it; it never imports Triton or gRPC.
"""

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
