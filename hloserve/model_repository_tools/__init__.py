"""Bundles -> Triton model repository (docs/serving.md, "The generated model repository").

Modules: build_options (the typed build settings), repository_plan (validate and plan, nothing
written), build (write a plan atomically), config (``ModelConfig`` messages), batch_sizes,
foreign (models of other backends), validate (check a repository against its bundles).
"""
