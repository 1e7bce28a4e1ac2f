"""The gateway's routing table, :class:`Router` (its thread-safe holder) and worker health."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from hloserve.errors import NotFoundError, UnavailableError
from hloserve.gateway.config import SchedulingConfig

#: tritonserver 2.51's answer (NOT_FOUND) for a model it does not know.
TRITON_UNKNOWN_MODEL = "Request for unknown model: '{model}' is not found"

#: tritonserver 2.51's answer (NOT_FOUND) for a model it lists with no version loaded.
TRITON_NO_VERSIONS = "Request for unknown model: '{model}' has no available versions"

#: How discovery starts the reason of a worker that lists a model not READY.
REPORTS = "reports "


@dataclass(frozen=True)
class ModelRoute:
    """Where one model can be served: distinct ``replicas``, Triton ``max_batch_size`` (None: not
    batching or unknown), measured seconds per item, a meta's or ensemble's callees, and whether
    it has a sequence batcher (one replica).
    """

    replicas: tuple[str, ...]
    max_batch: int | None = None
    cost_per_item_seconds: float | None = None
    calls: tuple[str, ...] = ()
    stateful: bool = False


class RoutingTable:
    """Immutable map of model name -> :class:`ModelRoute`; ``unready``: model -> {worker: why
    not routable there}; ``unreachable``: worker -> why it did not answer discovery.
    """

    def __init__(
        self,
        routes: Mapping[str, ModelRoute] | None = None,
        *,
        unready: Mapping[str, Mapping[str, str]] | None = None,
        unreachable: Mapping[str, str] | None = None,
    ) -> None:
        self.routes: Mapping[str, ModelRoute] = MappingProxyType(dict(routes or {}))
        self.unready: Mapping[str, Mapping[str, str]] = MappingProxyType(
            {m: MappingProxyType(dict(w)) for m, w in (unready or {}).items()}
        )
        self.unreachable: Mapping[str, str] = MappingProxyType(dict(unreachable or {}))

    def get(self, model: str) -> ModelRoute | None:
        """The route of ``model``, or None."""
        return self.routes.get(model)

    def with_routes(
        self,
        routes: Mapping[str, ModelRoute],
        unready: Mapping[str, Mapping[str, str]] | None = None,
    ) -> RoutingTable:
        """A table with other routes, this one's notes and ``unready`` merged into them."""
        merged = {m: dict(w) for m, w in self.unready.items()}
        for model, workers in (unready or {}).items():
            merged.setdefault(model, {}).update(workers)
        return RoutingTable(routes, unready=merged, unreachable=self.unreachable)

    def no_route_error(self, model: str) -> NotFoundError | UnavailableError:
        """The error for a request of ``model`` no replica can take: Triton's NOT_FOUND texts
        where one tritonserver would say them, else UNAVAILABLE naming the workers.
        """
        unready = sorted(self.unready.get(model, {}).items())
        reasons = "; ".join(f"worker {w} {why}" for w, why in unready)
        if unready and all(why.startswith(REPORTS) for _, why in unready):
            return NotFoundError(f"{TRITON_NO_VERSIONS.format(model=model)} ({reasons})")
        if reasons:
            return UnavailableError(f"model {model!r} has no ready replica: {reasons}")
        if model in self.routes:
            return UnavailableError(f"model {model!r} has no ready replica")
        if self.unreachable:
            down = "; ".join(f"{w} ({why})" for w, why in sorted(self.unreachable.items()))
            return UnavailableError(
                f"model {model!r} is not listed by any reachable worker; unreachable: {down}"
            )
        return NotFoundError(TRITON_UNKNOWN_MODEL.format(model=model))


class Router:
    """Thread-safe holder of the current table, the live knobs and HAProxy's counts."""

    def __init__(self, table: RoutingTable | None = None) -> None:
        self._lock = threading.Lock()
        #: The current table (an immutable snapshot).
        self.table = table or RoutingTable()
        #: The knobs last handed to :meth:`update_scheduling` (None: the config's).
        self.scheduling: SchedulingConfig | None = None
        self._routed: Mapping[tuple[str, str], int] = {}
        self._outstanding: Mapping[tuple[str, str], int] = {}

    def swap_table(self, table: RoutingTable) -> None:
        """Replace the table atomically."""
        with self._lock:
            self.table = table

    def update_scheduling(self, scheduling: SchedulingConfig) -> None:
        """Keep new knobs (the next HAProxy layout uses them)."""
        with self._lock:
            self.scheduling = scheduling

    def record_counts(
        self, routed: Mapping[tuple[str, str], int], outstanding: Mapping[tuple[str, str], int]
    ) -> None:
        """Replace HAProxy's routed and in-flight counts per (model, worker)."""
        with self._lock:
            self._routed = dict(routed)
            self._outstanding = dict(outstanding)

    def routed(self) -> dict[tuple[str, str], int]:
        """Requests routed so far per (model, worker)."""
        with self._lock:
            return dict(self._routed)

    def outstanding_all(self) -> dict[tuple[str, str], int]:
        """Requests in flight per (model, worker), only the non-zero ones."""
        with self._lock:
            return {k: v for k, v in self._outstanding.items() if v}

    def worker_items(self, workers: Iterable[str]) -> dict[str, int]:
        """Requests in flight per worker, every model together."""
        totals = dict.fromkeys(workers, 0)
        for (_, worker), count in self.outstanding_all().items():
            if worker in totals:
                totals[worker] += count
        return totals


class HealthTracker:
    """Which workers are healthy: out of the table after ``failure_threshold`` failed probes in a
    row, back after one passing probe (docs/gateway.md, "Health probes"); all start healthy.

    Raises:
        ValueError: ``failure_threshold`` < 1.
    """

    def __init__(self, workers: Iterable[str], failure_threshold: int) -> None:
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {failure_threshold}")
        self._threshold = failure_threshold
        self._failures = {w: 0 for w in workers}
        self._unhealthy: set[str] = set()

    def record(self, worker: str, ok: bool) -> bool:
        """Record one probe of ``worker``; True when its health changed."""
        if ok:
            self._failures[worker] = 0
            if worker in self._unhealthy:
                self._unhealthy.discard(worker)
                return True
            return False
        self._failures[worker] = self._failures.get(worker, 0) + 1
        if worker not in self._unhealthy and self._failures[worker] >= self._threshold:
            self._unhealthy.add(worker)
            return True
        return False

    def retain(self, workers: Iterable[str]) -> None:
        """Track exactly ``workers``: new ones start healthy, gone ones are forgotten."""
        kept = set(workers)
        self._failures = {w: self._failures.get(w, 0) for w in kept}
        self._unhealthy &= kept

    @property
    def unhealthy(self) -> frozenset[str]:
        """Workers currently out of the table."""
        return frozenset(self._unhealthy)

    def is_healthy(self, worker: str) -> bool:
        """Whether ``worker`` may be routed to."""
        return worker not in self._unhealthy


def restrict_to_healthy(table: RoutingTable, unhealthy: frozenset[str]) -> RoutingTable:
    """``table`` without the ``unhealthy`` workers (noted); a model keeps its entry, maybe empty."""
    if not unhealthy:
        return table
    why = "unreachable (failed its health probes)"
    return table.with_routes(
        {
            name: replace(route, replicas=tuple(w for w in route.replicas if w not in unhealthy))
            for name, route in table.routes.items()
        },
        unready={
            name: {w: why for w in route.replicas if w in unhealthy}
            for name, route in table.routes.items()
            if any(w in unhealthy for w in route.replicas)
        },
    )
