"""The runtime's process (``hloserve_runtime``, one per device), the only one importing JAX."""
