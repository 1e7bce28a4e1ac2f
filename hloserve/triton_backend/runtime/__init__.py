"""The runtime's process (``hloserve_runtime``, one per device): the only one that imports JAX.

Modules: ``core`` (:class:`~hloserve.triton_backend.runtime.core.RuntimeModel`), ``server``
(its side of the channel), ``scheduler`` and ``scheduler_config`` (docs/scheduling.md),
``config``, ``state``, ``loaded_bundle``, ``compile``, ``executable_cache`` and
``executable_cache_settings``, ``device_memory``, ``weights``, ``weight_cache``, ``residency``,
``transfer``, ``sequence_state``. Importing the package itself imports no JAX.
"""
