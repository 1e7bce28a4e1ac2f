"""Triton Python-based backend ``hloserve_meta`` (see ``model.py``)."""
