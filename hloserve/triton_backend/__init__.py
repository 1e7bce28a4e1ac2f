"""The typed core behind hloserve's Triton Python-based backends.

Nothing in this package imports ``triton_python_backend_utils``; the ``model.py`` shims under
``backends/`` adapt ``pb_utils`` objects and call into it (docs/serving.md is the contract).

Modules:
    batching: array helpers: concatenate with zero padding, split, variable-axis pad/cut.
    tensors:  checking tensors against a manifest's specs (shared by front and runtime).
    front:    :class:`~hloserve.triton_backend.front.FrontModel`, one per bundle; no JAX.
    runtime:  :class:`~hloserve.triton_backend.runtime.RuntimeModel`, the one JAX process.
    runtime_config: the runtime's weight cache from its config parameters.
    loaded_bundle: a bundle the runtime has loaded; its generation and variant labels.
    weights:  the :class:`~hloserve.triton_backend.weights.WeightStore` interface.
    weight_cache: :class:`~hloserve.triton_backend.weight_cache.WeightCache`, on-demand weights:
              LRU device cache under a byte budget, residency tiers (docs/on_demand_weights.md).
    metrics:  weight cache events -> Triton custom metrics (pb_utils passed in).
    transfer: host <-> device weight copies with JAX (per array, or packed in chunks).
    pb:       pb_utils adapters: the Status -> TritonError code table, responses, the
              ``initialize`` args (re-exports dlpack's names).
    dlpack:   DLPack tensor moves between pb_utils and NumPy/JAX (bf16 included).
    residency: residency tiers and the weight budget rule (dependency-free).
    compile:  the one compile path (StableHLO portable artifact -> loaded executable).
    backends: the ``model.py`` shims ``hloserve_front``, ``hloserve_runtime`` and
              ``hloserve_meta`` (docs/meta_models.md).
"""
