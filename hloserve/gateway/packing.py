"""The ``lpt_packing`` control loop, transport-neutral: statistics in, routing table out.

Each discovery tick hands :class:`LptController` the discovered table (every ready replica)
and each worker's cumulative counters per model (from Triton's ``ModelStatistics``:
items served and execution seconds). The controller keeps per-model EWMAs of arrival rate
(items/s) and cost per item (seconds), advances a :class:`~hloserve.gateway.placement.RepackClock`
with the fleet's compute seconds, repacks with
:func:`~hloserve.gateway.placement.compute_placement` at startup and when the clock says so
(ReactantServer rows 68, 69, 71), and returns the discovered table restricted to the placement.

Weight footprints and budgets come from the runtime's ``hloserve_weight_*`` metrics
(:func:`weights_from_metrics`) when the workers' metrics endpoints are configured; otherwise
every model weighs 0 and budgets are unlimited. Not done yet: operator repacks, EWMA half-life
decoupled from the rebalance budget.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from hloserve.errors import InvalidArgumentError
from hloserve.gateway.config import SchedulingConfig
from hloserve.gateway.placement import (
    ModelLoad,
    Placement,
    RepackClock,
    WorkerCapacity,
    compute_placement,
)
from hloserve.gateway.routing import ModelRoute, RoutingTable
from hloserve.node.status import cache_status

log = logging.getLogger("hloserve.gateway")


@dataclass(frozen=True)
class Counters:
    """Cumulative counters of one model on one worker.

    Attributes:
        items: items served (Triton ``inference_count``).
        compute_seconds: execution seconds (sum of ``batch_stats[*].compute_infer.ns`` / 1e9:
            once per execution, not once per request).
    """

    items: int
    compute_seconds: float


@dataclass(frozen=True)
class WeightInfo:
    """Weight footprints and budgets as the workers' runtimes publish them.

    Attributes:
        model_bytes: model -> device bytes of its weights (the largest any worker reports).
        budget_bytes: worker -> weight cache budget, bytes (0 or absent = unlimited).
    """

    model_bytes: Mapping[str, int] = field(default_factory=dict)
    budget_bytes: Mapping[str, int] = field(default_factory=dict)


def weights_from_metrics(texts: Mapping[str, str]) -> WeightInfo:
    """Read footprints and budgets from each worker's Prometheus text.

    Args:
        texts: worker (gRPC endpoint) -> text of its metrics endpoint; workers whose text
            holds no ``hloserve_weight_*`` series are left out.

    Source: the runtime's series ``hloserve_weight_cache_budget_bytes`` and
    ``hloserve_weight_bytes{model}`` (hloserve.triton_backend.metrics), parsed with
    :func:`hloserve.node.status.cache_status`.
    """
    models: dict[str, int] = {}
    budgets: dict[str, int] = {}
    for worker, text in texts.items():
        try:
            status = cache_status(text)
        except InvalidArgumentError:
            continue
        budgets[worker] = int(status.budget_bytes)
        for name, row in status.models.items():
            if row.nbytes is not None:
                models[name] = max(models.get(name, 0), int(row.nbytes))
    return WeightInfo(models, budgets)


@dataclass
class _Estimate:
    rate: float = 0.0  # items per second
    cost: float = 0.0  # seconds per item
    seen: bool = False


class LptController:
    """Turns discovery results and statistics into the ``lpt_packing`` routing table.

    Not thread-safe: one discovery loop owns it.

    Args:
        scheduling: the knobs (replica counts, hysteresis, rebalance budgets).
    """

    def __init__(self, scheduling: SchedulingConfig) -> None:
        self._scheduling = scheduling
        self.clock = RepackClock(
            scheduling.rebalance_compute_seconds, scheduling.first_rebalance_compute_seconds
        )
        self._last: dict[tuple[str, str], Counters] = {}
        self._estimates: dict[str, _Estimate] = {}
        self.placement: Placement | None = None
        self._placed_models: frozenset[str] = frozenset()
        self._placed_workers: frozenset[str] = frozenset()

    def estimates(self) -> dict[str, tuple[float, float]]:
        """Model -> (arrival rate in items/s, cost per item in seconds), current EWMAs."""
        return {m: (e.rate, e.cost) for m, e in self._estimates.items()}

    def observe(
        self, counters: Mapping[tuple[str, str], Counters], elapsed_seconds: float
    ) -> float:
        """Fold one tick's cumulative counters in; returns the fleet compute seconds spent.

        Deltas against the previous tick give items and compute per model; a counter that
        went down (worker restart) counts as a fresh start. The EWMA weight of the new sample
        is ``1 - 0.5 ** (fleet compute seconds / half-life)`` with the half-life equal to
        ``rebalance_compute_seconds`` (row 71: EWMAs decay against fleet compute seconds), or
        1 for a model's first sample.
        """
        items: dict[str, int] = {}
        compute: dict[str, float] = {}
        for key, now in counters.items():
            before = self._last.get(key)
            if (
                before is None
                or now.items < before.items
                or now.compute_seconds < before.compute_seconds
            ):
                before = Counters(0, 0.0) if before is not None else now
            model = key[0]
            items[model] = items.get(model, 0) + now.items - before.items
            compute[model] = compute.get(model, 0.0) + now.compute_seconds - before.compute_seconds
        self._last = dict(counters)
        fleet = sum(compute.values())
        if elapsed_seconds <= 0 or fleet <= 0:
            return max(fleet, 0.0)
        weight = 1.0 - 0.5 ** (fleet / self._scheduling.rebalance_compute_seconds)
        for model, n in items.items():
            if n <= 0:
                continue
            estimate = self._estimates.setdefault(model, _Estimate())
            rate, cost = n / elapsed_seconds, compute[model] / n
            w = weight if estimate.seen else 1.0
            estimate.rate += w * (rate - estimate.rate)
            estimate.cost += w * (cost - estimate.cost)
            estimate.seen = True
        return fleet

    def tick(
        self,
        discovered: RoutingTable,
        counters: Mapping[tuple[str, str], Counters],
        elapsed_seconds: float,
        weights: WeightInfo | None = None,
    ) -> RoutingTable:
        """One control step: observe, repack if due, and return the table to route with.

        A repack happens at the first tick, when the set of models or workers changed, and
        when the repack clock says traffic calls for one. Models the placement did not see
        (or whose placed workers are all gone) route over every discovered replica.
        """
        fleet = self.observe(counters, elapsed_seconds)
        workers = sorted({w for r in discovered.routes.values() for w in r.replicas})
        models = frozenset(discovered.routes)
        changed = models != self._placed_models or frozenset(workers) != self._placed_workers
        due = self.clock.advance(fleet)
        if workers and (self.placement is None or changed or due):
            self._repack(discovered, workers, weights or WeightInfo())
            self._placed_models, self._placed_workers = models, frozenset(workers)
        return self._restrict(discovered)

    def _repack(self, discovered: RoutingTable, workers: list[str], weights: WeightInfo) -> None:
        loads = []
        for name, route in discovered.routes.items():
            estimate = self._estimates.get(name, _Estimate())
            cost = estimate.cost or route.cost_per_item_seconds or 0.0
            loads.append(
                ModelLoad(
                    name,
                    arrival_rate=estimate.rate,
                    cost_per_item_seconds=cost,
                    weight_bytes=weights.model_bytes.get(name, 0),
                    replicas=self._scheduling.replicas_of(name),
                )
            )
        previous = self.placement.assignment if self.placement is not None else None
        self.placement = compute_placement(
            loads,
            [WorkerCapacity(w, weights.budget_bytes.get(w, 0)) for w in workers],
            previous=previous,
            hysteresis=self._scheduling.hysteresis,
            forbid_memory_oversubscription=self._scheduling.forbid_memory_oversubscription,
        )
        log.info(
            "lpt_packing: repack (models %d, moved %d, held_by_hysteresis %d)",
            len(loads),
            len(self.placement.moved),
            len(self.placement.held_by_hysteresis),
        )
        for warning in self.placement.warnings:
            log.warning("lpt_packing: %s", warning)

    def _restrict(self, discovered: RoutingTable) -> RoutingTable:
        assignment = self.placement.assignment if self.placement is not None else {}
        routes = {}
        for name, route in discovered.routes.items():
            placed = tuple(w for w in assignment.get(name, ()) if w in route.replicas)
            estimate = self._estimates.get(name)
            cost = estimate.cost if estimate is not None and estimate.cost > 0 else None
            routes[name] = ModelRoute(
                placed or route.replicas,
                max_batch=route.max_batch,
                cost_per_item_seconds=cost or route.cost_per_item_seconds,
            )
        return RoutingTable(routes)
