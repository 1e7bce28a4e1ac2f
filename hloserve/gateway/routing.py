"""Transport-neutral request routing: the routing table, in-flight accounting, schedulers.

The gRPC servicer calls :class:`Router` and nothing here imports gRPC. A request is routed
with :meth:`Router.acquire`, which picks a replica, charges the request's items to it and
returns a :class:`Lease` carrying the failover order; :meth:`Router.fail_over` moves the charge
to the next replica after an UNAVAILABLE answer; :meth:`Router.release` frees it when the
answer is back (on every path, idempotent). The table is replaced whole by
:meth:`Router.swap_table` (discovery builds a new one; requests never see half a table).

Every method takes the router's lock for a short, non-blocking section, so a router can be
shared by threads and by coroutines of one event loop alike.

Rules come from ReactantServer's gateway (docs/gateway.md, "ReactantServer's gateway"; hloserve's
rules under "Routing"): the table swapped whole, failover in the scheduler's order,
``round_robin``, ``least_outstanding``, work units (items x cost per item; unknown cost = fleet
mean; no batch axis = 1 item), the fill quantum, ``run``/``spread``, ``fill_least``/``fill_rr``
and the failover order "chosen, then least backed up".
"""

from __future__ import annotations

import abc
import dataclasses
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

from hloserve.errors import NotFoundError, UnavailableError
from hloserve.gateway.config import GatewayConfig, SchedulingConfig

#: Work amounts are compared after rounding to this many seconds, as ReactantServer's
#: ``fill_least`` quantizes them: exact ties rotate, and a drained fleet compares equal despite
#: float residue.
WORK_QUANTUM_SECONDS = 1e-9


@dataclass(frozen=True)
class ModelRoute:
    """Where one model can be served.

    Attributes:
        replicas: worker endpoints holding the model, distinct, in table order.
        max_batch: effective max batch of the model in items (Triton ``max_batch_size``);
            None when unknown or when the model does not batch.
        cost_per_item_seconds: measured compute seconds per item; None when not measured yet.
        calls: for a meta model, the models it calls (its placement group,
            docs/meta_models.md); empty for a plain model.
    """

    replicas: tuple[str, ...]
    max_batch: int | None = None
    cost_per_item_seconds: float | None = None
    calls: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(set(self.replicas)) != len(self.replicas):
            raise ValueError(f"replicas must be distinct, got {self.replicas}")


class RoutingTable:
    """Immutable map of model name -> :class:`ModelRoute`; build a new one to change it.

    Besides the routes it keeps why a model cannot be routed, for the error a client gets
    (UNAVAILABLE naming each worker's reason, NOT_FOUND only for a name no reachable worker
    lists).

    Args:
        routes: model name -> route.
        unready: model name -> {worker: why the model cannot be routed there}, e.g.
            ``"reports UNAVAILABLE: load failed"`` (RepositoryIndex) or ``"unreachable
            (failed its health probes)"``.
        unreachable: worker -> why it did not answer discovery; a model it might serve is
            unknown, not absent.
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
        costs = [r.cost_per_item_seconds for r in self._routes.values() if r.cost_per_item_seconds]
        #: Fleet-mean cost per item, the cost of an unmeasured model; 1.0 if none.
        self.mean_cost_per_item_seconds = sum(costs) / len(costs) if costs else 1.0

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
        """The error for a request of ``model`` that no replica can take.

        UNAVAILABLE with every worker's reason when some worker lists the model (or a worker
        that did not answer might); NOT_FOUND when every worker answered and none lists it.
        """
        reasons = [f"worker {w} {why}" for w, why in sorted(self.unready.get(model, {}).items())]
        if reasons:
            return UnavailableError(f"model {model!r} has no ready replica: {'; '.join(reasons)}")
        if model in self._routes:
            return UnavailableError(f"model {model!r} has no ready replica")
        if self.unreachable:
            down = "; ".join(f"{w} ({why})" for w, why in sorted(self.unreachable.items()))
            return UnavailableError(
                f"model {model!r} is not listed by any reachable worker; unreachable: {down}"
            )
        return NotFoundError(f"model {model!r} is not served by any worker")

    def cost_per_item(self, model: str) -> float:
        """Measured cost per item of ``model``, else the fleet mean."""
        route = self._routes.get(model)
        if route is not None and route.cost_per_item_seconds:
            return route.cost_per_item_seconds
        return self.mean_cost_per_item_seconds


@dataclass
class Lease:
    """One routed request. Created by :meth:`Router.acquire`; hand it back to the router.

    Attributes:
        model: model name.
        items: items charged (the batch extent; 1 when the model has no batch axis).
        order: replicas to try, first = chosen (docs/gateway.md, "Routing").
        worker: the replica currently charged and to call.
        work: in-flight work charged to ``worker``, compute seconds (items x cost per item).
        released: whether the charge was freed.
    """

    model: str
    items: int
    order: tuple[str, ...]
    worker: str
    work: float
    released: bool = False
    _position: int = field(default=0, repr=False)


class Load:
    """In-flight items per (model, worker) and work per worker. Only touched under the lock."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, str], int] = {}
        self._worker_items: dict[str, int] = {}
        self._worker_work: dict[str, float] = {}

    def outstanding(self, model: str, worker: str) -> int:
        """Items of ``model`` in flight on ``worker``."""
        return self._items.get((model, worker), 0)

    def worker_items(self, worker: str) -> int:
        """Items of every model in flight on ``worker``."""
        return self._worker_items.get(worker, 0)

    def worker_work(self, worker: str) -> float:
        """Compute seconds in flight on ``worker``, quantized; exactly 0 when drained."""
        if self._worker_items.get(worker, 0) == 0:
            return 0.0
        work = self._worker_work.get(worker, 0.0)
        return round(work / WORK_QUANTUM_SECONDS) * WORK_QUANTUM_SECONDS

    def snapshot(self) -> dict[tuple[str, str], int]:
        """Copy of the non-zero in-flight items per (model, worker)."""
        return dict(self._items)

    def add(self, model: str, worker: str, items: int, work: float) -> None:
        """Charge (positive) or free (negative) ``items`` and ``work``."""
        key = (model, worker)
        self._items[key] = self._items.get(key, 0) + items
        self._worker_items[worker] = self._worker_items.get(worker, 0) + items
        self._worker_work[worker] = self._worker_work.get(worker, 0.0) + work
        if self._items[key] == 0:
            del self._items[key]
        if self._worker_items[worker] == 0:
            del self._worker_items[worker]
            self._worker_work.pop(worker, None)


class Scheduler(abc.ABC):
    """Picks the replica of a request. Called by :class:`Router` under its lock only."""

    #: The ``mode`` value selecting this scheduler.
    mode: ClassVar[str]

    @abc.abstractmethod
    def choose(self, model: str, route: ModelRoute, items: int, load: Load) -> str:
        """The replica that serves this request; may update the scheduler's own state."""

    def order(self, model: str, route: ModelRoute, chosen: str, load: Load) -> tuple[str, ...]:
        """Failover order: ``chosen``, then the others least backed up first.

        "Backed up" is the model's in-flight items on the replica, then the worker's in-flight
        work, then table order.
        """
        rest = sorted(
            (w for w in route.replicas if w != chosen),
            key=lambda w: (load.outstanding(model, w), load.worker_work(w)),
        )
        return (chosen, *rest)

    def on_table(self, table: RoutingTable) -> None:  # noqa: B027 - optional hook
        """Called after a table swap; drop state of models whose replicas changed."""

    def update_scheduling(self, scheduling: SchedulingConfig) -> None:  # noqa: B027 - optional
        """Called when the control plane changes the knobs; the modes that read none ignore it."""


class _Rotation:
    """Per-model rotation counters."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def take(self, model: str) -> int:
        value = self._next.get(model, 0)
        self._next[model] = value + 1
        return value

    def peek(self, model: str) -> int:
        return self._next.get(model, 0)


def fill_quantum(max_batch: int | None, fill_factor: float) -> int | None:
    """Fill quantum in items: ``max_batch x fill_factor`` rounded, at least 1.

    Returns None when the max batch is unknown or the model does not batch.
    """
    if not max_batch:
        return None
    return max(1, round(max_batch * fill_factor))


def _rotated(replicas: tuple[str, ...], start: int) -> tuple[str, ...]:
    k = start % len(replicas)
    return replicas[k:] + replicas[:k]


class RoundRobinScheduler(Scheduler):
    """Uniform rotation over a model's replicas; no measurements."""

    mode = "round_robin"

    def __init__(self) -> None:
        self._rotation = _Rotation()

    def choose(self, model: str, route: ModelRoute, items: int, load: Load) -> str:
        return _rotated(route.replicas, self._rotation.take(model))[0]

    def order(self, model: str, route: ModelRoute, chosen: str, load: Load) -> tuple[str, ...]:
        """Failover continues the rotation after ``chosen``."""
        return _rotated(route.replicas, route.replicas.index(chosen))


class LeastOutstandingScheduler(Scheduler):
    """Each request to the replica whose worker has the least in-flight work.

    Work is compute seconds (items x cost per item, fleet-mean cost when unmeasured),
    summed over every model on the worker; ties go to the replica with fewer in-flight items of
    this model, then rotate.
    """

    mode = "least_outstanding"

    def __init__(self) -> None:
        self._rotation = _Rotation()

    def choose(self, model: str, route: ModelRoute, items: int, load: Load) -> str:
        candidates = _rotated(route.replicas, self._rotation.take(model))
        return min(candidates, key=lambda w: (load.worker_work(w), load.outstanding(model, w)))


@dataclass
class _Run:
    worker: str
    spent: int = 0


class LptPackingScheduler(Scheduler):
    """Routing among the replicas ``lpt_packing`` placed a model on (docs/gateway.md, "Routing").

    Fill quantum ``Q = max_batch x fill factor`` items (rounded, at least 1). Mode ``run``: a
    run sends requests to one replica until it has spent Q items, then the next request opens
    a run elsewhere; a run also ends early when nothing of the model is in flight on its
    replica (the batch it was filling has left) or when its replica is a whole quantum of items
    ahead of the least loaded sibling. Share guard (``run``, not in ReactantServer): the items
    a model's replicas received since its replica set last changed stay within one quantum of
    each other -- a run ends, and a replica is not opened, once that replica is a whole
    quantum ahead of the least served sibling (so with batch-1 traffic the shares differ by
    at most Q; a request may overshoot as within a run). Placement charges each replica u/k,
    so the replicas must get equal shares; a load-aware opening policy alone lets them drift
    apart. Mode ``spread``: each request to the replica with the fewest in-flight
    items of the model. Opening policy ``fill_least``: the replica whose worker has the least
    in-flight work (all models, compute seconds, quantized so exact ties rotate); ``fill_rr``:
    rotation, load-blind. Unknown max batch degrades to rotation.

    Args:
        scheduling: the knobs (fill mode/factor per model, routing policy).
    """

    mode = "lpt_packing"

    def __init__(self, scheduling: SchedulingConfig) -> None:
        self._scheduling = scheduling
        self._rotation = _Rotation()
        self._runs: dict[str, _Run] = {}
        # model -> (its replica set, items routed to each since the set last changed)
        self._served: dict[str, tuple[tuple[str, ...], dict[str, int]]] = {}

    def served(self, model: str, route: ModelRoute) -> dict[str, int]:
        """Items ``run`` routed to each replica of ``model`` since its replica set changed."""
        replicas, counts = self._served.get(model, ((), {}))
        if set(replicas) != set(route.replicas):
            counts = dict.fromkeys(route.replicas, 0)
            self._served[model] = (route.replicas, counts)
        return counts

    def fill_quantum(self, model: str, route: ModelRoute) -> int | None:
        """Fill quantum of ``model`` in items, or None when its max batch is unknown."""
        return fill_quantum(route.max_batch, self._scheduling.fill_factor_of(model))

    def update_scheduling(self, scheduling: SchedulingConfig) -> None:
        """Route with new knobs from now on; open runs keep their replica."""
        self._scheduling = scheduling

    def _open(self, model: str, route: ModelRoute, load: Load) -> str:
        candidates = _rotated(route.replicas, self._rotation.take(model))
        if self._scheduling.routing_policy == "fill_rr":
            return candidates[0]
        return min(candidates, key=load.worker_work)

    def choose(self, model: str, route: ModelRoute, items: int, load: Load) -> str:
        quantum = self.fill_quantum(model, route)
        if quantum is None:
            return _rotated(route.replicas, self._rotation.take(model))[0]
        if self._scheduling.fill_mode_of(model) == "spread":
            least = min(load.outstanding(model, w) for w in route.replicas)
            tied = tuple(w for w in route.replicas if load.outstanding(model, w) == least)
            return self._open(model, dataclasses.replace(route, replicas=tied), load)
        served = self.served(model, route)
        floor = min(served.values())
        fits = tuple(w for w in route.replicas if served[w] - floor < quantum)
        run = self._runs.get(model)
        if run is not None and (
            run.worker not in fits or not self._continues(model, route, run, quantum, load)
        ):
            run = None
        if run is None:  # fits holds at least the least served replica
            run = _Run(self._open(model, dataclasses.replace(route, replicas=fits), load))
            self._runs[model] = run
        run.spent += items
        served[run.worker] += items
        if run.spent >= quantum:
            del self._runs[model]
        return run.worker

    @staticmethod
    def _continues(model: str, route: ModelRoute, run: _Run, quantum: int, load: Load) -> bool:
        if run.worker not in route.replicas:
            return False
        mine = load.outstanding(model, run.worker)
        if run.spent > 0 and mine == 0:
            return False
        others = [load.outstanding(model, w) for w in route.replicas if w != run.worker]
        return not (others and mine - min(others) >= quantum)

    def on_table(self, table: RoutingTable) -> None:
        for model in list(self._runs):
            route = table.get(model)
            if route is None or self._runs[model].worker not in route.replicas:
                del self._runs[model]


def make_scheduler(config: GatewayConfig) -> Scheduler:
    """The scheduler of ``config.mode``, configured."""
    if config.mode == "lpt_packing":
        return LptPackingScheduler(config.scheduling)
    if config.mode == "least_outstanding":
        return LeastOutstandingScheduler()
    return RoundRobinScheduler()


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
