"""Names of the metrics the runtime model exports on Triton's metrics port (:8002), shared by
their writer and readers; the table is docs/observability.md, "Metrics". Standard library only.
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
#: Gauge ``{kind}``: the runtime's device memory, bytes (absent on CPU).
DEVICE_MEMORY_BYTES = "hloserve_device_memory_bytes"
#: Gauge ``{model}``: bytes of the state kept for a stateful model's live sequences.
SEQUENCE_STATE_BYTES = "hloserve_sequence_state_bytes"
#: The ``kind`` labels of :data:`DEVICE_MEMORY_BYTES` (docs/observability.md).
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
