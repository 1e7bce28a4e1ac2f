"""The typed core behind hloserve's Triton Python-based backends.

Nothing in this package imports ``triton_python_backend_utils``; the ``model.py`` shims under
``backends/`` adapt ``pb_utils`` objects and call into it (docs/serving.md is the contract).

Modules (front: no JAX; runtime: the one JAX process; the channel between them):
    front:    :class:`~hloserve.triton_backend.front.FrontModel`, one per bundle: validate,
              hooks, variant, pad; then cut. No JAX.
    front_channel: a front instance's side of the channel (:class:`ChannelFront`).
    hooks:    a bundle's ``preprocess``/``postprocess`` from its ``model.py`` (front only).
    tensors:  checking tensors against a manifest's specs (shared by front and runtime).
    batching: array helpers: concatenate with zero padding, split, variable-axis pad/cut.
    channel:  the local channel's messages and shared memory (docs/serving.md).
    runtime_server: the runtime's side of the channel: one reader thread, executes.
    scheduler: per-model queues, coalescing, cost learning (docs/scheduling.md).
    scheduler_config: the scheduler's settings and request deadlines.
    runtime:  :class:`~hloserve.triton_backend.runtime.RuntimeModel`, the one JAX process.
    runtime_config: the runtime's allocator, device memory and weight cache from its config.
    runtime_state: what the runtime publishes besides execution counts.
    loaded_bundle: a bundle the runtime has loaded; its generation and variant labels.
    compile:  the one compile path (StableHLO portable artifact -> loaded executable).
    executable_cache: serialized XLA executables on disk; executable_cache_settings: where and
              how big (docs/serving.md, "Executable cache").
    device_memory: JAX's allocator settings and the weight budget sized from the card.
    weights:  the :class:`~hloserve.triton_backend.weights.WeightStore` interface.
    weight_cache: :class:`~hloserve.triton_backend.weight_cache.WeightCache`, on-demand weights:
              LRU device cache under a byte budget, residency tiers (docs/on_demand_weights.md).
    residency: residency tiers and the weight budget rule (dependency-free).
    transfer: host <-> device weight copies with JAX (per array, or packed in chunks).
    metrics:  weight cache events and runtime state -> Triton custom metrics (pb_utils passed in).
    pb:       pb_utils adapters: the Status -> TritonError code table, responses, the
              ``initialize`` args.
    dlpack:   DLPack tensor moves between pb_utils and NumPy/JAX (bf16 included).
    backends: the ``model.py`` shims ``hloserve_front``, ``hloserve_runtime`` and
              ``hloserve_meta`` (docs/meta_models.md).
"""
