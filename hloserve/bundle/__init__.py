"""The bundle format: how a model reaches hloserve (docs/bundles.md); no Triton or gRPC here.

Modules: bundle (:class:`~hloserve.bundle.bundle.Bundle`, discovery), manifest and
manifest_sections (the typed ``manifest.yaml``), notation, files (``model.py``),
safetensors_file, front_spec (what the front's Triton stubs read; no pydantic or PyYAML),
stablehlo, convert (text to portable artifacts), validate, inspect, dtypes.
"""
