"""Triton Python-based backend ``hloserve_front`` (see ``model.py``)."""
