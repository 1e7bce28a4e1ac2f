"""JAX function + params (or a torch.nn.Module) + named input specs + batch sizes -> a bundle.

:func:`export_torch` needs the ``export-torch`` extra; docs/bundles.md shows both.
This package's names below are the public export API (README, docs/bundles.md): import them
from ``hloserve.export``. Modules: _export (:func:`export_bundle`), _torch (:func:`export_torch`),
_torchax_compat, _cli (``hloserve export``).
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
