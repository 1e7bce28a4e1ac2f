"""JAX function + params + named input specs + batch sizes -> a bundle directory.

Public API: :func:`export_bundle`, :class:`OutputSpec`, and :class:`TensorSpec` (re-exported
from :mod:`hloserve.bundle`).
"""

from hloserve.bundle.manifest import TensorSpec
from hloserve.export._export import ExportError, OutputSpec, export_bundle, weight_names

__all__ = ["ExportError", "OutputSpec", "TensorSpec", "export_bundle", "weight_names"]
