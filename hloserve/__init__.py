"""hloserve: serve StableHLO models on NVIDIA Triton Inference Server.

Subpackages:
    bundle: the bundle format (manifest, portable artifacts, weights), validation, dtype table.
    export: JAX function + params -> bundle.
    triton_backend: the typed core behind the Triton Python-based backends.
"""

__version__ = "0.1.0"
