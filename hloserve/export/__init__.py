"""JAX function + params (or a torch.nn.Module) + named input specs + batch sizes -> a bundle.

Public API: :func:`export_bundle` (JAX), :func:`export_torch` (PyTorch, through torchax; needs
the ``export-torch`` extra), :class:`OutputSpec`, and :class:`TensorSpec` /
:class:`ClientTensorSpec` (the bundle format's, :mod:`hloserve.bundle.manifest_sections`).
"""

from hloserve.bundle.manifest_sections import ClientTensorSpec, TensorSpec
from hloserve.errors import ExportError
from hloserve.export._export import OutputSpec, export_bundle, weight_names
from hloserve.export._torch import export_torch
from hloserve.export._torchax_compat import import_torchax

__all__ = [
    "ClientTensorSpec",
    "ExportError",
    "OutputSpec",
    "TensorSpec",
    "export_bundle",
    "export_torch",
    "import_torchax",
    "weight_names",
]
