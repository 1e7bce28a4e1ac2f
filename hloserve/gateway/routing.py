"""Transport-neutral request routing: :class:`Router` over the table, the load and a scheduler.

The gRPC servicer calls :class:`Router` and nothing here imports gRPC. A request is routed
with :meth:`Router.acquire`, which picks a replica, charges the request's items to it and
returns a :class:`Lease` carrying the failover order; :meth:`Router.fail_over` moves the charge
to the next replica after an UNAVAILABLE answer; :meth:`Router.release` frees it when the
answer is back (on every path, idempotent). The table is replaced whole by
:meth:`Router.swap_table` (discovery builds a new one; requests never see half a table).

Every method takes the router's lock for a short, non-blocking section, so a router can be
shared by threads and by coroutines of one event loop alike.

The table and the load are in :mod:`hloserve.gateway.routing_table`, the schedulers in
:mod:`hloserve.gateway.schedulers`; this module re-exports both, the import path every caller
uses. Rules come from ReactantServer's gateway (docs/gateway.md, "ReactantServer's gateway";
hloserve's rules under "Routing"): the table swapped whole, failover in the scheduler's order.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from hloserve.gateway.config import SchedulingConfig
from hloserve.gateway.routing_table import (
    WORK_QUANTUM_SECONDS,
    Lease,
    Load,
    ModelRoute,
    RoutingTable,
)
from hloserve.gateway.schedulers import (
    LeastOutstandingScheduler,
    LptPackingScheduler,
    RoundRobinScheduler,
    Scheduler,
    fill_quantum,
    make_scheduler,
)


class Router:
    """Thread-safe routing: the current table, in-flight load and a scheduler.

    Args:
        scheduler: picks replicas; owned by this router from now on.
        table: the initial table (empty when None).
    """

    def __init__(self, scheduler: Scheduler, table: RoutingTable | None = None) -> None:
        self._lock = threading.Lock()
        self._scheduler = scheduler
        self._table = table or RoutingTable()
        self._load = Load()
        self._routed: dict[tuple[str, str], int] = {}
        self._scheduling: SchedulingConfig | None = None
        self._external_routed: Mapping[tuple[str, str], int] = {}
        self._external_outstanding: Mapping[tuple[str, str], int] = {}

    @property
    def scheduling(self) -> SchedulingConfig | None:
        """The knobs last handed to :meth:`update_scheduling` (None: the config's)."""
        return self._scheduling

    @property
    def table(self) -> RoutingTable:
        """The current table (an immutable snapshot)."""
        return self._table

    def swap_table(self, table: RoutingTable) -> None:
        """Replace the table atomically; in-flight leases still release correctly."""
        with self._lock:
            self._table = table
            self._scheduler.on_table(table)

    def update_scheduling(self, scheduling: SchedulingConfig) -> None:
        """Hand new knobs to the scheduler (the control plane's knob and per-model changes)."""
        with self._lock:
            self._scheduling = scheduling
            self._scheduler.update_scheduling(scheduling)

    def acquire(self, model: str, items: int = 1) -> Lease:
        """Pick a replica for a request of ``items`` items and charge it.

        Args:
            model: model name from the request.
            items: batch extent of the request; values below 1 count as 1.

        Raises:
            NotFoundError: every worker answered discovery and none lists the model.
            UnavailableError: the model is known (or a worker that might serve it did not
                answer) but no replica can take it; the message gives each worker's reason.
        """
        items = max(1, items)
        with self._lock:
            route = self._table.get(model)
            if route is None or not route.replicas:
                raise self._table.no_route_error(model)
            chosen = self._scheduler.choose(model, route, items, self._load)
            order = self._scheduler.order(model, route, chosen, self._load)
            work = items * self._table.cost_per_item(model)
            self._load.add(model, chosen, items, work)
            key = (model, chosen)
            self._routed[key] = self._routed.get(key, 0) + 1
            return Lease(model=model, items=items, order=order, worker=chosen, work=work)

    def fail_over(self, lease: Lease) -> str | None:
        """Move the lease's charge to the next replica of its order; None when none is left.

        When None is returned the lease is released.
        """
        with self._lock:
            if lease.released:
                return None
            self._load.add(lease.model, lease.worker, -lease.items, -lease.work)
            lease._position += 1
            if lease._position >= len(lease.order):
                lease.released = True
                return None
            lease.worker = lease.order[lease._position]
            self._load.add(lease.model, lease.worker, lease.items, lease.work)
            key = (lease.model, lease.worker)
            self._routed[key] = self._routed.get(key, 0) + 1
            return lease.worker

    def release(self, lease: Lease) -> None:
        """Free the lease's charge; a second call does nothing."""
        with self._lock:
            if lease.released:
                return
            lease.released = True
            self._load.add(lease.model, lease.worker, -lease.items, -lease.work)

    def outstanding(self, model: str, worker: str) -> int:
        """Items of ``model`` in flight on ``worker``."""
        with self._lock:
            return self._load.outstanding(model, worker)

    def outstanding_all(self) -> dict[tuple[str, str], int]:
        """Items in flight per (model, worker), only the non-zero ones (the data plane's
        requests in flight included, one item each)."""
        with self._lock:
            merged = self._load.snapshot()
            for key, count in self._external_outstanding.items():
                if count:
                    merged[key] = merged.get(key, 0) + count
            return merged

    def record_external(
        self,
        routed: Mapping[tuple[str, str], int],
        outstanding: Mapping[tuple[str, str], int],
    ) -> None:
        """Counts of requests another data plane (HAProxy) routed and holds, per (model,
        worker); they replace the previous ones and are added to :meth:`routed` and
        :meth:`outstanding_all`."""
        with self._lock:
            self._external_routed = dict(routed)
            self._external_outstanding = dict(outstanding)

    def worker_items(self, workers: Iterable[str]) -> dict[str, int]:
        """In-flight items per worker, every model together."""
        with self._lock:
            return {w: self._load.worker_items(w) for w in workers}

    def routed(self) -> dict[tuple[str, str], int]:
        """Requests routed so far per (model, worker), failovers included (the data
        plane's included)."""
        with self._lock:
            merged = dict(self._routed)
            for key, count in self._external_routed.items():
                merged[key] = merged.get(key, 0) + count
            return merged


__all__ = [
    "WORK_QUANTUM_SECONDS",
    "Lease",
    "LeastOutstandingScheduler",
    "Load",
    "LptPackingScheduler",
    "ModelRoute",
    "RoundRobinScheduler",
    "Router",
    "RoutingTable",
    "Scheduler",
    "fill_quantum",
    "make_scheduler",
]
