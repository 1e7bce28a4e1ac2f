"""The typed core behind hloserve's Triton Python-based backends, one folder per process side.

A tritonserver serving bundles runs one stub per front instance and one runtime stub per
device, talking over the channel (docs/serving.md, "Front -> runtime (the channel)"); only
``backends/*/model.py`` imports ``triton_python_backend_utils``. Folders (kept apart by
tests/test_import_graph.py):

    channel:  messages, sockets, shared memory; ``batching``: the array helpers both sides use.
    front:    a front instance, no JAX: ``core`` (validate, hooks, variants, padding),
              ``front_channel``, ``hooks``, ``tensors``.
    runtime:  the one JAX process: ``core``, ``server``, ``scheduler``, ``compile``,
              ``executable_cache``, ``device_memory``, ``weights``, ``weight_cache``,
              ``residency``, ``transfer``, ``sequence_state``, ``config``.
    backends: the ``pb_utils`` shims ``hloserve_front``, ``hloserve_runtime``, ``hloserve_meta``
              and their adapters ``pb``, ``dlpack``, ``metrics``."""
