"""Names of the metrics the runtime model exports on Triton's metrics port (:8002).

Written by :mod:`hloserve.triton_backend.backends.metrics` and read back by
:func:`hloserve.prometheus_text.cache_status` (``hloserve status``, the gateway's lpt_packing
weights); the table of names, labels and meanings is docs/observability.md, "Metrics".
Standard library only, so every layer may import it.
"""

from __future__ import annotations

#: Prefix of every weight cache series.
WEIGHT_PREFIX = "hloserve_weight"
#: Gauge: the weight cache's byte budget, pinned weights included (0 = none).
WEIGHT_CACHE_BUDGET_BYTES = "hloserve_weight_cache_budget_bytes"
#: Gauge: bytes of weights on the device, all models.
WEIGHT_CACHE_RESIDENT_BYTES = "hloserve_weight_cache_resident_bytes"
#: Gauge per model (label ``residency``): bytes of the model's weights.
WEIGHT_BYTES = "hloserve_weight_bytes"
#: Gauge per model: bytes of the model's weights on the device.
WEIGHT_RESIDENT_BYTES = "hloserve_weight_resident_bytes"
#: Counter per model: host-to-device loads of its weights.
WEIGHT_LOADS = "hloserve_weight_loads_total"
#: Counter per model: evictions of its weights from the device.
WEIGHT_EVICTIONS = "hloserve_weight_evictions_total"
#: Histogram per model: seconds per load (``_sum``, ``_count``, ``_bucket`` series).
WEIGHT_LOAD_SECONDS = "hloserve_weight_load_seconds"
#: Counter per model: bytes of weights loaded to the device.
WEIGHT_LOAD_BYTES = "hloserve_weight_load_bytes_total"
#: Counter per (model, variant, batch_size): executions.
EXECUTIONS = "hloserve_executions_total"
#: Gauge ``{kind}``: the runtime's device memory, bytes, by kind (:data:`DEVICE_MEMORY_KINDS`);
#: absent where the device reports no statistics (CPU). docs/observability.md.
DEVICE_MEMORY_BYTES = "hloserve_device_memory_bytes"
#: Gauge ``{model}``: bytes of the state the runtime keeps for the live sequences of a stateful
#: model (live sequences x state bytes per sequence); docs/bundles.md, "Stateful bundles".
SEQUENCE_STATE_BYTES = "hloserve_sequence_state_bytes"
#: The ``kind`` labels of :data:`DEVICE_MEMORY_BYTES`: the card's total, the allocator's limit,
#: in use and peak (``memory_stats()``), resident weights, compiled executables, the largest
#: scratch of a loaded executable, headroom (limit - in use), the weight budget.
DEVICE_MEMORY_KINDS = (
    "total",
    "limit",
    "in_use",
    "peak",
    "weights",
    "executables",
    "scratch",
    "headroom",
    "budget",
)

__all__ = [
    "DEVICE_MEMORY_BYTES",
    "DEVICE_MEMORY_KINDS",
    "EXECUTIONS",
    "SEQUENCE_STATE_BYTES",
    "WEIGHT_BYTES",
    "WEIGHT_CACHE_BUDGET_BYTES",
    "WEIGHT_CACHE_RESIDENT_BYTES",
    "WEIGHT_EVICTIONS",
    "WEIGHT_LOADS",
    "WEIGHT_LOAD_BYTES",
    "WEIGHT_LOAD_SECONDS",
    "WEIGHT_PREFIX",
    "WEIGHT_RESIDENT_BYTES",
]
