"""The typed core behind hloserve's Triton Python-based backends, one folder per process side.

A tritonserver serving bundles runs one stub process per front instance and one runtime stub
per device; they talk over the channel (docs/serving.md, "Front -> runtime (the channel)").
Nothing here but ``backends/*/model.py`` imports ``triton_python_backend_utils``.

Folders (tests/test_import_graph.py keeps front and runtime apart, and JAX out of the front):
    channel:  the channel between the processes: its messages, socket and shared memory
              (``channel/__init__.py``); ``batching``: the array helpers both sides use
              (concatenate with zero padding, split, variable-axis pad and cut).
    front:    a front instance's process, no JAX. ``core``:
              :class:`~hloserve.triton_backend.front.core.FrontModel`, one per bundle: validate,
              hooks, variant, pad; then cut. ``front_channel``: its side of the channel
              (:class:`~hloserve.triton_backend.front.front_channel.ChannelFront`). ``hooks``: a
              bundle's ``preprocess``/``postprocess``. ``tensors``: checking tensors against a
              manifest's specs (the meta's sub-calls too).
    runtime:  the one JAX process. ``core``:
              :class:`~hloserve.triton_backend.runtime.core.RuntimeModel` (loads bundles, runs
              executions); ``server``: its side of the channel, one reader thread; ``scheduler``,
              ``scheduler_config``: per-model queues, coalescing, cost learning, deadlines
              (docs/scheduling.md); ``config``: allocator, device memory and weight cache from
              the runtime's config; ``state``: what it publishes besides execution counts;
              ``loaded_bundle``; ``compile``: the one compile path (StableHLO -> executable);
              ``executable_cache``, ``executable_cache_settings``: serialized executables on
              disk (docs/serving.md, "Executable cache"); ``device_memory``: JAX's allocator and
              the weight budget from the card; ``weights``, ``weight_cache``, ``residency``,
              ``transfer``: on-demand weights (docs/on_demand_weights.md); ``sequence_state``:
              per-sequence state of stateful bundles.
    backends: the ``pb_utils`` shims. ``hloserve_front``, ``hloserve_runtime`` and
              ``hloserve_meta`` (``<name>/model.py``, the directories Triton loads); ``pb``:
              the Status -> TritonError code table, responses, ``initialize`` args; ``dlpack``:
              tensor moves between pb_utils and NumPy/JAX; ``metrics``: weight cache events and
              runtime state -> Triton custom metrics (pb_utils passed in).
"""
