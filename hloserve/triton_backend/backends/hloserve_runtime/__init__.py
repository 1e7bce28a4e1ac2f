"""Triton Python-based backend ``hloserve_runtime`` (see ``model.py``)."""
