"""A front instance's process (``hloserve_front``): validation, hooks, variants, padding; no JAX."""
