"""The typed core behind hloserve's Triton Python-based backends, one folder per process side.

A tritonserver serving bundles runs one stub per front instance and one runtime stub per
device, talking over the ``channel`` (docs/serving.md, "Front -> runtime (the channel)"):
``front`` (no JAX) validates, runs hooks and pads; ``runtime`` (the one JAX process) compiles,
schedules and executes; ``backends`` holds the ``pb_utils`` shims and their adapters, the only
code importing ``triton_python_backend_utils``. tests/test_import_graph.py keeps them apart."""
