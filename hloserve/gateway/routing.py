"""The gateway's routing table and :class:`Router`, its thread-safe holder (no gRPC)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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
        self._routes: Mapping[str, ModelRoute] = MappingProxyType(dict(routes or {}))
        self.unready: Mapping[str, Mapping[str, str]] = MappingProxyType(
            {m: MappingProxyType(dict(w)) for m, w in (unready or {}).items()}
        )
        self.unreachable: Mapping[str, str] = MappingProxyType(dict(unreachable or {}))

    @property
    def routes(self) -> Mapping[str, ModelRoute]:
        """Read-only view of every route."""
        return self._routes

    def get(self, model: str) -> ModelRoute | None:
        """The route of ``model``, or None."""
        return self._routes.get(model)

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
        if model in self._routes:
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
        self._table = table or RoutingTable()
        self._scheduling: SchedulingConfig | None = None
        self._routed: Mapping[tuple[str, str], int] = {}
        self._outstanding: Mapping[tuple[str, str], int] = {}

    @property
    def scheduling(self) -> SchedulingConfig | None:
        """The knobs last handed to :meth:`update_scheduling` (None: the config's)."""
        return self._scheduling

    @property
    def table(self) -> RoutingTable:
        """The current table (an immutable snapshot)."""
        return self._table

    def swap_table(self, table: RoutingTable) -> None:
        """Replace the table atomically."""
        with self._lock:
            self._table = table

    def update_scheduling(self, scheduling: SchedulingConfig) -> None:
        """Keep new knobs (the next HAProxy layout uses them)."""
        with self._lock:
            self._scheduling = scheduling

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
