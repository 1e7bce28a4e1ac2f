"""The typed core behind hloserve's Triton Python-based backends.

Nothing in this package imports ``triton_python_backend_utils``; the ``model.py`` shims adapt
``pb_utils`` objects and call into it.
"""
