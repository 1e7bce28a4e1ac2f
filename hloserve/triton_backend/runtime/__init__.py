"""The runtime's process (``hloserve_runtime``, one per device), the only one importing JAX;
importing the package itself imports none. Module map: ``hloserve/triton_backend/__init__.py``."""
