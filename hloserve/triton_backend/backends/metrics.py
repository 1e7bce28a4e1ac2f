"""Weight cache and runtime metrics on Triton's :8002 endpoint (docs/observability.md) through
the Python backend's custom metrics (``pb_utils.MetricFamily``, passed in). Foreign models'
memory hints (``residency="foreign"``) size models for the gateway's ``lpt_packing``; the budget
and resident bytes exclude them."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from hloserve import metric_names, names
from hloserve.model_parameters import RuntimeParameters

#: load seconds, 100 us to 10 s (1 GiB from pinned host memory: ~21 ms on an H200)
LOAD_SECONDS_BUCKETS = (1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
FOREIGN_RESIDENCY = "foreign"
EXECUTABLES = "hloserve_executables_total"


def foreign_bytes_from_args(args: Any) -> dict[str, int]:
    """Foreign model -> device memory hint (bytes) of ``hloserve.foreign_memory_bytes``;
    InvalidArgumentError for a malformed value."""
    return dict(RuntimeParameters.read(args.name, args.parameters, names.PARAM_FOREIGN_BYTES))


#: description per family name, by kind (a ``pb_utils.MetricFamily`` attribute)
_CACHE_FAMILIES = {
    "GAUGE": {
        metric_names.WEIGHT_CACHE_BUDGET_BYTES: (
            "Weight cache byte budget, pinned weights included (0 = none)"
        ),
        metric_names.WEIGHT_CACHE_RESIDENT_BYTES: "Bytes of weights on the device, all models",
        metric_names.WEIGHT_BYTES: "Bytes of the model's weights, labelled with its residency",
        metric_names.WEIGHT_RESIDENT_BYTES: "Bytes of the model's weights on the device",
    },
    "COUNTER": {
        metric_names.WEIGHT_LOADS: "Host-to-device loads of the model's weights",
        metric_names.WEIGHT_EVICTIONS: "Evictions of the model's weights from the device",
        metric_names.WEIGHT_LOAD_BYTES: "Bytes of weights loaded to the device",
    },
    "HISTOGRAM": {
        metric_names.WEIGHT_LOAD_SECONDS: "Seconds per load of the model's weights to the device",
    },
}
_RUNTIME_FAMILIES = {
    "COUNTER": {
        metric_names.EXECUTIONS: "Runtime executions per compiled executable (variant, batch size)",
        EXECUTABLES: "Executables made ready by the runtime, by source (compiled or cache)",
        "hloserve_execution_items_total": "Real items executed",
        "hloserve_execution_padding_total": "Zero-padding items executed",
        "hloserve_scheduler_shed_total": "Requests shed before device work",
    },
    "GAUGE": {
        "hloserve_scheduler_queue_depth": "Requests queued in the runtime",
        "hloserve_scheduler_share": "fair: weight / sum of weights",
        "hloserve_scheduler_recent_compute_share": "The model's share of the recent-compute EMA",
        "hloserve_scheduler_cost_seconds": "Learned execution cost per (variant, batch size)",
        metric_names.DEVICE_MEMORY_BYTES: "The runtime's device memory by kind, bytes",
        metric_names.SEQUENCE_STATE_BYTES: "Bytes of state kept for the model's live sequences",
    },
}


def _families(pb_utils: Any, kinds: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    family = pb_utils.MetricFamily
    return {
        name: family(name=name, description=description, kind=getattr(family, kind))
        for kind, named in kinds.items()
        for name, description in named.items()
    }


_RESIDENT, _SECONDS = metric_names.WEIGHT_RESIDENT_BYTES, metric_names.WEIGHT_LOAD_SECONDS
#: per-model series besides ``_SECONDS`` (a histogram)
_PER_MODEL = (
    _RESIDENT,
    metric_names.WEIGHT_LOADS,
    metric_names.WEIGHT_EVICTIONS,
    metric_names.WEIGHT_LOAD_BYTES,
)


class TritonCacheMetrics:
    """A weight cache observer writing Triton metrics; ``models`` get series at 0 up front
    (others when registered), ``foreign`` hints appear at once as
    ``hloserve_weight_bytes{residency="foreign"}``."""

    def __init__(
        self,
        pb_utils: Any,
        budget_bytes: int | None,
        models: Iterable[str],
        foreign: Mapping[str, int] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._families = _families(pb_utils, _CACHE_FAMILIES)
        self._budget = self._families[metric_names.WEIGHT_CACHE_BUDGET_BYTES].Metric(labels={})
        self._budget.set(float(budget_bytes or 0))
        self._total = self._families[metric_names.WEIGHT_CACHE_RESIDENT_BYTES].Metric(labels={})
        self._total.set(0.0)
        #: model -> its series by metric name; model -> its weight bytes series
        self._series: dict[str, dict[str, Any]] = {}
        self._size: dict[str, Any] = {}
        for name in sorted(models):
            self._add(name)
        for name, nbytes in sorted((foreign or {}).items()):
            self._set_size(name, FOREIGN_RESIDENCY, nbytes)

    def _add(self, name: str) -> None:
        """Create ``name``'s series at 0 unless they exist (lock held, or from ``__init__``)."""
        if name in self._series:
            return
        labels = {"model": name}
        series = {n: self._families[n].Metric(labels=labels) for n in _PER_MODEL}
        series[_SECONDS] = self._families[_SECONDS].Metric(
            labels=labels, buckets=list(LOAD_SECONDS_BUCKETS)
        )
        series[_RESIDENT].set(0.0)
        self._series[name] = series

    def _set_size(self, name: str, residency: str, nbytes: int) -> None:
        if name not in self._size:
            labels = {"model": name, "residency": residency}
            self._size[name] = self._families[metric_names.WEIGHT_BYTES].Metric(labels=labels)
        self._size[name].set(float(nbytes))

    def close(self) -> None:
        """Drop every series, then the families (Triton wants the metrics deleted first)."""
        with self._lock:
            self._size.clear()
            self._series.clear()
            self._budget = self._total = None
            self._families.clear()

    def announce(self, name: str) -> None:
        """Create ``name``'s series at 0 (a front asked the runtime to load it)."""
        with self._lock:
            if self._families:
                self._add(name)

    def registered(self, name: str, nbytes: int, residency: str) -> None:
        with self._lock:
            if self._families:
                self._add(name)
                self._set_size(name, residency, nbytes)

    def loaded(self, name: str, nbytes: int, seconds: float, resident_bytes: int) -> None:
        with self._lock:
            if (series := self._series.get(name)) is not None:
                series[_RESIDENT].set(float(nbytes))
                series[metric_names.WEIGHT_LOADS].increment(1.0)
                series[metric_names.WEIGHT_LOAD_BYTES].increment(float(nbytes))
                series[_SECONDS].observe(seconds)
            self._total.set(float(resident_bytes))

    def evicted(self, name: str, nbytes: int, resident_bytes: int) -> None:
        with self._lock:
            if (series := self._series.get(name)) is not None:
                series[_RESIDENT].set(0.0)
                series[metric_names.WEIGHT_EVICTIONS].increment(1.0)
            self._total.set(float(resident_bytes))

    def removed(self, name: str, resident_bytes: int) -> None:
        """``name``'s resident and weight bytes to 0 (its model was unloaded: the per-model rows
        add up to the total again, and placement counts no bytes for it). The series stay:
        the Python backend deletes a metric only with its family."""
        with self._lock:
            if (series := self._series.get(name)) is not None:
                series[_RESIDENT].set(0.0)
            if (size := self._size.get(name)) is not None:
                size.set(0.0)
            if self._total is not None:
                self._total.set(float(resident_bytes))

    def resized(self, budget_bytes: int) -> None:
        with self._lock:
            if self._budget is not None:
                self._budget.set(float(budget_bytes))


class TritonRuntimeMetrics:
    """The runtime's execution, executable, scheduler and device memory series (docs/
    observability.md), created on first use; handed over by the runtime server every flush
    (:meth:`executed`, :meth:`publish`), :meth:`counted` at once."""

    _SHED_REASONS = ("deadline", "laxity", "cancelled", "stopping")

    def __init__(self, pb_utils: Any) -> None:
        self._families = _families(pb_utils, _RUNTIME_FAMILIES)
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
