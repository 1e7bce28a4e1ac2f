"""JAX function + params + named input specs + batch sizes -> a bundle directory.

Public API: :func:`export_bundle`, :class:`OutputSpec`, and :class:`TensorSpec` /
:class:`ClientTensorSpec` (re-exported from :mod:`hloserve.bundle`).
"""

from hloserve.bundle.manifest import ClientTensorSpec, TensorSpec
from hloserve.export._export import ExportError, OutputSpec, export_bundle, weight_names

__all__ = [
    "ClientTensorSpec",
    "ExportError",
    "OutputSpec",
    "TensorSpec",
    "export_bundle",
    "weight_names",
]
