"""The gateway's schedulers: which replica serves a request, and the failover order.

``round_robin``, ``least_outstanding`` and ``lpt_packing``'s fill routing (the fill quantum,
``run``/``spread``, ``fill_least``/``fill_rr``), each a :class:`Scheduler` called by
:class:`hloserve.gateway.routing.Router` under its lock. Rules as ReactantServer's gateway
(docs/gateway.md, "ReactantServer's gateway"; hloserve's rules under "Routing"): work units are
items x cost per item (unknown cost = fleet mean; no batch axis = 1 item), and the failover order
is "chosen, then least backed up".
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from hloserve.gateway.config import GatewayConfig, SchedulingConfig
from hloserve.gateway.routing_table import Load, ModelRoute, RoutingTable


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
