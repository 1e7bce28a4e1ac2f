"""The routing table and in-flight load of the gateway; transport-neutral, no gRPC.

:class:`RoutingTable` maps each model to its :class:`ModelRoute` (replicas, max batch, measured
cost, a meta's callees) and is replaced whole by :meth:`hloserve.gateway.routing.Router.swap_table`;
:class:`Lease` is one routed request and :class:`Load` the items and work in flight per worker,
which :mod:`hloserve.gateway.schedulers` read to choose replicas (docs/gateway.md, "Routing").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from hloserve.errors import NotFoundError, UnavailableError

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
