"""A front instance's process (``hloserve_front``): validation, hooks, variants, padding; no JAX.

Modules: ``core`` (:class:`~hloserve.triton_backend.front.core.FrontModel`), ``front_channel``
(the front's side of the channel), ``hooks`` (a bundle's ``preprocess``/``postprocess``),
``tensors`` (checking tensors against a manifest's specs).
"""
