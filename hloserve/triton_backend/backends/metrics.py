"""Weight cache metrics on Triton's Prometheus endpoint (:8002) through Python-backend metrics.

The runtime shim passes ``triton_python_backend_utils`` in; this module never imports it.
Triton 2.51's Python backend offers ``pb_utils.MetricFamily(name, description, kind)`` with
kinds COUNTER, GAUGE and HISTOGRAM, and ``family.Metric(labels, buckets=...)`` with
``increment``, ``set`` and ``observe`` (python_backend README, "Custom Metrics").

Series (docs/on_demand_weights.md, "Metrics"); ``model`` labels name the bundle:

==========================================  =========  ============================================
``hloserve_weight_cache_budget_bytes``      gauge      the budget (0 = none)
``hloserve_weight_cache_resident_bytes``    gauge      bytes of weights on the device, all models
``hloserve_weight_bytes{model,residency}``  gauge      the model's weight bytes (once registered)
                                                       or a foreign model's hint (``foreign``)
``hloserve_weight_resident_bytes{model}``   gauge      the model's bytes on the device (0 or all)
``hloserve_weight_loads_total{model}``      counter    host-to-device loads
``hloserve_weight_evictions_total{model}``  counter    evictions (compaction included)
``hloserve_weight_load_seconds{model}``     histogram  seconds per load
``hloserve_weight_load_bytes_total{model}`` counter    bytes loaded to the device
==========================================  =========  ============================================

and the runtime's execution, executable and scheduler series (:class:`TritonRuntimeMetrics`).

Foreign models (Triton models of other backends in the repository, docs/serving.md "Foreign
models") have no weights in the cache; the repository builder lists their device memory hints
in the runtime's ``hloserve.foreign_memory_bytes`` parameter (:func:`foreign_bytes_from_args`)
and :class:`TritonCacheMetrics` publishes each, from the start, as
``hloserve_weight_bytes{model, residency="foreign"}``, the series the gateway's ``lpt_packing``
sizes models by (docs/gateway.md). The budget and resident bytes do not count them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from hloserve import metric_names, names
from hloserve.model_parameters import RuntimeParameters

#: Histogram buckets of load seconds: 100 us to 10 s (a 1 GiB load from pinned host memory
#: takes ~21 ms on an H200, docs/on_demand_weights.md "GPU figures").
LOAD_SECONDS_BUCKETS = (1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
#: ``residency`` label of a foreign model's ``hloserve_weight_bytes`` series.
FOREIGN_RESIDENCY = "foreign"
#: Counter per (model, source): executables made ready (:meth:`TritonRuntimeMetrics.counted`).
EXECUTABLES = "hloserve_executables_total"


def foreign_bytes_from_args(args: Any) -> dict[str, int]:
    """Foreign model -> device memory hint (bytes), from the runtime's
    ``hloserve.foreign_memory_bytes`` parameter (absent = none).

    Args:
        args: the runtime's :class:`~hloserve.model_parameters.ModelArgs`.

    Raises:
        InvalidArgumentError: a malformed value (the parameter and the item are named).
    """
    return dict(RuntimeParameters.read(args.name, args.parameters, names.PARAM_FOREIGN_BYTES))


#: (name, description, kind) of every metric family, in the order ``__init__`` unpacks them.
_FAMILIES = (
    (
        metric_names.WEIGHT_CACHE_BUDGET_BYTES,
        "Weight cache byte budget, pinned weights included (0 = none)",
        "GAUGE",
    ),
    (
        metric_names.WEIGHT_CACHE_RESIDENT_BYTES,
        "Bytes of weights on the device, all models",
        "GAUGE",
    ),
    (
        metric_names.WEIGHT_BYTES,
        "Bytes of the model's weights, labelled with its residency",
        "GAUGE",
    ),
    (metric_names.WEIGHT_RESIDENT_BYTES, "Bytes of the model's weights on the device", "GAUGE"),
    (metric_names.WEIGHT_LOADS, "Host-to-device loads of the model's weights", "COUNTER"),
    (
        metric_names.WEIGHT_EVICTIONS,
        "Evictions of the model's weights from the device",
        "COUNTER",
    ),
    (
        metric_names.WEIGHT_LOAD_SECONDS,
        "Seconds per load of the model's weights to the device",
        "HISTOGRAM",
    ),
    (metric_names.WEIGHT_LOAD_BYTES, "Bytes of weights loaded to the device", "COUNTER"),
)


class TritonCacheMetrics:
    """A :class:`~hloserve.triton_backend.runtime.weight_cache.CacheObserver` writing Triton
    metrics.

    Args:
        pb_utils: the ``triton_python_backend_utils`` module (or a stand-in).
        budget_bytes: the cache's budget (None or 0 = none).
        models: the model names to create series for up front (all at 0); others get theirs
            when the cache registers them (a front loads its bundle).
        foreign: foreign model -> device memory hint in bytes, published at once as
            ``hloserve_weight_bytes{model, residency="foreign"}`` (no other series).
    """

    def __init__(
        self,
        pb_utils: Any,
        budget_bytes: int | None,
        models: Iterable[str],
        foreign: Mapping[str, int] | None = None,
    ) -> None:
        family = pb_utils.MetricFamily
        self._lock = threading.Lock()
        self._families = [
            family(name=name, description=description, kind=getattr(family, kind))
            for name, description, kind in _FAMILIES
        ]
        budget, total, self._sizes, _resident, _loads, _evictions, _seconds, _bytes = self._families
        self._budget = budget.Metric(labels={})
        self._budget.set(float(budget_bytes or 0))
        self._total = total.Metric(labels={})
        self._total.set(0.0)
        self._resident: dict[str, Any] = {}
        self._loads: dict[str, Any] = {}
        self._evictions: dict[str, Any] = {}
        self._seconds: dict[str, Any] = {}
        self._bytes: dict[str, Any] = {}
        self._size: dict[str, Any] = {}
        for name in sorted(models):
            self._series(name)
        for name, nbytes in sorted((foreign or {}).items()):
            self._size[name] = self._sizes.Metric(
                labels={"model": name, "residency": FOREIGN_RESIDENCY}
            )
            self._size[name].set(float(nbytes))

    def _series(self, name: str) -> None:
        """Create ``name``'s series (at 0) unless they exist; call with the lock held or from
        ``__init__``."""
        if name in self._resident:
            return
        _, _, _, resident, loads, evictions, seconds, nbytes = self._families
        labels = {"model": name}
        self._resident[name] = resident.Metric(labels=labels)
        self._resident[name].set(0.0)
        self._loads[name] = loads.Metric(labels=labels)
        self._evictions[name] = evictions.Metric(labels=labels)
        self._seconds[name] = seconds.Metric(labels=labels, buckets=list(LOAD_SECONDS_BUCKETS))
        self._bytes[name] = nbytes.Metric(labels=labels)

    def close(self) -> None:
        """Drop every series, then the families (Triton wants the metrics deleted first)."""
        with self._lock:
            tables = (
                self._size,
                self._resident,
                self._loads,
                self._evictions,
                self._seconds,
                self._bytes,
            )
            for table in tables:
                table.clear()
            self._budget = self._total = self._sizes = None
            self._families.clear()

    def announce(self, name: str) -> None:
        """Create ``name``'s series at 0 (a front asked the runtime to load it)."""
        with self._lock:
            if self._families:
                self._series(name)

    def registered(self, name: str, nbytes: int, residency: str) -> None:
        with self._lock:
            if not self._families:
                return
            self._series(name)
            if name not in self._size:
                self._size[name] = self._sizes.Metric(
                    labels={"model": name, "residency": residency}
                )
            self._size[name].set(float(nbytes))

    def loaded(self, name: str, nbytes: int, seconds: float, resident_bytes: int) -> None:
        with self._lock:
            if name in self._resident:
                self._resident[name].set(float(nbytes))
                self._loads[name].increment(1.0)
                self._bytes[name].increment(float(nbytes))
                self._seconds[name].observe(seconds)
            self._total.set(float(resident_bytes))

    def evicted(self, name: str, nbytes: int, resident_bytes: int) -> None:
        with self._lock:
            if name in self._resident:
                self._resident[name].set(0.0)
                self._evictions[name].increment(1.0)
            self._total.set(float(resident_bytes))

    def resized(self, budget_bytes: int) -> None:
        with self._lock:
            if self._budget is not None:
                self._budget.set(float(budget_bytes))


class TritonRuntimeMetrics:
    """The runtime's execution, executable and scheduler metrics; series appear on first use.

    Counted by the runtime itself and handed over once a second (a metric call is a synchronous
    stub -> server message) by :class:`~hloserve.triton_backend.runtime.server.RuntimeServer`:
    its ``publish`` (:meth:`executed`) and ``publish_state`` (:meth:`publish`):

    - ``hloserve_executions_total{model,variant,batch_size}`` (counter): executions per compiled
      executable (``variant`` e.g. ``s32``, empty without variants; docs/serving.md);
    - ``hloserve_execution_items_total{model,variant}`` (counter): real items executed;
    - ``hloserve_execution_padding_total{model,variant}`` (counter): zero-padding items;
    - ``hloserve_scheduler_queue_depth{model}`` (gauge): requests queued;
    - ``hloserve_scheduler_share{model}`` (gauge): weight / sum of weights;
    - ``hloserve_scheduler_recent_compute_share{model}`` (gauge): the model's share of the
      recent-compute EMA (docs/scheduling.md);
    - ``hloserve_scheduler_cost_seconds{model,variant,batch_size}`` (gauge): learned cost;
    - ``hloserve_scheduler_shed_total{model,reason}`` (counter): requests shed, ``reason`` =
      ``deadline`` (passed), ``laxity`` (cannot be met), ``cancelled`` (its client gave up)
      or ``stopping``;
    - ``hloserve_device_memory_bytes{kind}`` (gauge): the runtime's device memory by kind
      (``metric_names.DEVICE_MEMORY_KINDS``); absent on CPU;

    and, from :meth:`counted` at once, ``hloserve_executables_total{model,source}`` (counter):
    executables made ready, ``source`` ``compiled`` or ``cache`` (docs/serving.md, "Executable
    cache").
    """

    _SHED_REASONS = ("deadline", "laxity", "cancelled", "stopping")

    def __init__(self, pb_utils: Any) -> None:
        family = pb_utils.MetricFamily
        specs = (
            (
                metric_names.EXECUTIONS,
                "Runtime executions per compiled executable (variant, batch size)",
                family.COUNTER,
            ),
            (
                EXECUTABLES,
                "Executables made ready by the runtime, by source (compiled or cache)",
                family.COUNTER,
            ),
            ("hloserve_execution_items_total", "Real items executed", family.COUNTER),
            ("hloserve_execution_padding_total", "Zero-padding items executed", family.COUNTER),
            ("hloserve_scheduler_queue_depth", "Requests queued in the runtime", family.GAUGE),
            ("hloserve_scheduler_share", "fair: weight / sum of weights", family.GAUGE),
            (
                "hloserve_scheduler_recent_compute_share",
                "The model's share of the recent-compute EMA",
                family.GAUGE,
            ),
            (
                "hloserve_scheduler_cost_seconds",
                "Learned execution cost per (variant, batch size)",
                family.GAUGE,
            ),
            ("hloserve_scheduler_shed_total", "Requests shed before device work", family.COUNTER),
            (
                metric_names.DEVICE_MEMORY_BYTES,
                "The runtime's device memory by kind, bytes",
                family.GAUGE,
            ),
            (
                metric_names.SEQUENCE_STATE_BYTES,
                "Bytes of state kept for the model's live sequences",
                family.GAUGE,
            ),
        )
        self._families = {n: family(name=n, description=d, kind=k) for n, d, k in specs}
        self._series: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        self._lock = threading.Lock()

    def _metric(self, name: str, **labels: str) -> Any:
        key = (name, tuple(sorted(labels.items())))
        metric = self._series.get(key)
        if metric is None:
            metric = self._series[key] = self._families[name].Metric(labels=dict(labels))
        return metric

    def executed(self, key: tuple[str, str, int], count: int) -> None:
        """Add ``count`` executions of ``key``: (model, variant label, compiled batch size)."""
        model, variant, size = key
        with self._lock:
            if self._families:
                labels = {"model": model, "variant": variant, "batch_size": str(size)}
                self._metric(metric_names.EXECUTIONS, **labels).increment(float(count))

    def counted(self, model: str, source: str) -> None:
        """One executable of ``model`` made ready; ``source``: ``compiled`` or ``cache``."""
        with self._lock:
            if self._families:
                self._metric(EXECUTABLES, model=model, source=source).increment(1.0)

    def publish(self, state: Any) -> None:
        """Record one :class:`~hloserve.triton_backend.runtime.server.RuntimeState`."""
        with self._lock:
            if not self._families:
                return
            for (model, variant), (items, padding) in state.rows.items():
                self._metric(
                    "hloserve_execution_items_total", model=model, variant=variant
                ).increment(float(items))
                self._metric(
                    "hloserve_execution_padding_total", model=model, variant=variant
                ).increment(float(padding))
            recent_total = sum(m.recent_compute_s for m in state.models.values()) or 1.0
            for model, snap in state.models.items():
                self._metric("hloserve_scheduler_queue_depth", model=model).set(float(snap.queued))
                self._metric("hloserve_scheduler_share", model=model).set(float(snap.share))
                self._metric("hloserve_scheduler_recent_compute_share", model=model).set(
                    float(snap.recent_compute_s / recent_total)
                )
                for reason in self._SHED_REASONS:  # every series exists from the start at 0
                    self._metric("hloserve_scheduler_shed_total", model=model, reason=reason)
            for (model, variant, size), seconds in state.costs.items():
                self._metric(
                    "hloserve_scheduler_cost_seconds",
                    model=model,
                    variant=variant,
                    batch_size=str(size),
                ).set(float(seconds))
            for kind, nbytes in (state.memory or {}).items():
                self._metric(metric_names.DEVICE_MEMORY_BYTES, kind=kind).set(float(nbytes))
            for model, nbytes in state.sequence_bytes.items():
                self._metric(metric_names.SEQUENCE_STATE_BYTES, model=model).set(float(nbytes))
            for (model, reason), n in state.shed.items():
                self._metric("hloserve_scheduler_shed_total", model=model, reason=reason).increment(
                    float(n)
                )

    def close(self) -> None:
        """Drop every series, then the families."""
        with self._lock:
            self._series.clear()
            self._families.clear()


__all__ = [
    "FOREIGN_RESIDENCY",
    "LOAD_SECONDS_BUCKETS",
    "TritonCacheMetrics",
    "TritonRuntimeMetrics",
    "foreign_bytes_from_args",
]
