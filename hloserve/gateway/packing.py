"""The ``lpt_packing`` control loop: statistics in, routing table out (no I/O; docs/gateway.md,
"The lpt_packing control loop").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from hloserve.errors import InvalidArgumentError
from hloserve.gateway.config import SchedulingConfig
from hloserve.gateway.placement import (
    ModelLoad,
    Placement,
    RepackClock,
    WorkerCapacity,
    compute_placement,
)
from hloserve.gateway.routing import RoutingTable
from hloserve.names import RUNTIME_MODEL
from hloserve.prometheus_text import cache_status

log = logging.getLogger("hloserve.gateway")


@dataclass(frozen=True)
class Counters:
    """Cumulative counters of one model on one worker: Triton's ``inference_count`` and
    ``batch_stats[*].compute_infer.ns`` in seconds.
    """

    items: int
    compute_seconds: float


@dataclass(frozen=True)
class WeightInfo:
    """Model -> weight bytes (the largest reported), worker -> weight budget bytes (0: none)."""

    model_bytes: Mapping[str, int] = field(default_factory=dict)
    budget_bytes: Mapping[str, int] = field(default_factory=dict)


def weights_from_metrics(texts: Mapping[str, str]) -> WeightInfo:
    """Footprints and budgets from each worker's Prometheus text (:func:`cache_status`)."""
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

    Not thread-safe. A meta and its callees are one placement unit (docs/meta_models.md).
    """

    def __init__(self, scheduling: SchedulingConfig) -> None:
        self._scheduling = scheduling
        self._internal = frozenset({RUNTIME_MODEL})
        self.clock = RepackClock(
            scheduling.rebalance_compute_seconds, scheduling.first_rebalance_compute_seconds
        )
        self._last: dict[tuple[str, str], Counters] = {}
        self._estimates: dict[str, _Estimate] = {}
        self.placement: Placement | None = None
        #: Placements computed since start.
        self.repacks = 0
        self._placed_models: frozenset[str] = frozenset()
        self._placed_workers: frozenset[str] = frozenset()
        self._discovered = RoutingTable()
        self.weights = WeightInfo()

    def update_scheduling(self, scheduling: SchedulingConfig) -> None:
        """Use new knobs (the EWMAs and the accumulated compute are kept)."""
        self._scheduling = scheduling
        self.clock.retune(
            scheduling.rebalance_compute_seconds, scheduling.first_rebalance_compute_seconds
        )

    def repack_now(self) -> RoutingTable:
        """Repack the last discovered table now (the clock untouched); the table to route with."""
        workers = sorted({w for r in self._discovered.routes.values() for w in r.replicas})
        if workers:
            self._repack(self._discovered, workers, self.weights)
        return self._restrict(self._discovered)

    def estimates(self) -> dict[str, tuple[float, float]]:
        """Model -> (arrival rate in items/s, cost per item in seconds), current EWMAs."""
        return {m: (e.rate, e.cost) for m, e in self._estimates.items()}

    def observe(
        self, counters: Mapping[tuple[str, str], Counters], elapsed_seconds: float
    ) -> float:
        """Fold one tick's cumulative counters into the EWMAs; returns the fleet compute seconds."""
        items: dict[str, int] = {}
        compute: dict[str, float] = {}
        metas = {n for n, r in self._discovered.routes.items() if r.calls}
        for key, now in counters.items():
            if key[0] in self._internal or key[0] in metas:
                continue
            before = self._last.get(key, now)
            if now.items < before.items or now.compute_seconds < before.compute_seconds:
                before = Counters(0, 0.0)  # the worker restarted
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
        """One control step: observe, repack if due or the fleet changed, return the table."""
        self._discovered = discovered
        fleet = self.observe(counters, elapsed_seconds)
        if weights is not None:
            self.weights = weights
        workers = sorted({w for r in discovered.routes.values() for w in r.replicas})
        models = frozenset(discovered.routes)
        changed = models != self._placed_models or frozenset(workers) != self._placed_workers
        due = self.clock.advance(fleet)
        if workers and (self.placement is None or changed or due):
            self._repack(discovered, workers, self.weights)
            self._placed_models, self._placed_workers = models, frozenset(workers)
        return self._restrict(discovered)

    def place_new(
        self, model: str, workers: Sequence[str], calls: Sequence[str] = ()
    ) -> tuple[str, ...]:
        """The ``workers`` a model no worker holds should be loaded on, placed as a repack would
        (docs/gateway.md, "Model control").
        """
        if model in self._internal or not workers:
            return tuple(workers)
        loads = [load for load in self._loads(self._discovered, self.weights) if load.name != model]
        names = calls or (model,)
        loads.append(
            ModelLoad(
                model,
                weight_bytes=sum(self.weights.model_bytes.get(n, 0) for n in names),
                replicas=self._scheduling.replicas_of(model),
            )
        )
        chosen = self._place(loads, workers, self.weights).assignment[model]
        log.info("lpt_packing: new model %r goes to %s", model, ", ".join(chosen))
        return chosen

    def _loads(self, discovered: RoutingTable, weights: WeightInfo) -> list[ModelLoad]:
        loads = []
        for name, route in discovered.routes.items():
            if name in self._internal:
                continue
            replicas = self._scheduling.replicas_of(name)
            if route.calls:  # a meta: its callees' bytes, no compute of its own
                footprint = sum(weights.model_bytes.get(c, 0) for c in route.calls)
                loads.append(ModelLoad(name, weight_bytes=footprint, replicas=replicas))
                continue
            estimate = self._estimates.get(name, _Estimate())
            cost = estimate.cost or route.cost_per_item_seconds or 0.0
            loads.append(
                ModelLoad(name, estimate.rate, cost, weights.model_bytes.get(name, 0), replicas)
            )
        return loads

    def _place(
        self, loads: list[ModelLoad], workers: Sequence[str], weights: WeightInfo
    ) -> Placement:
        return compute_placement(
            loads,
            [WorkerCapacity(w, weights.budget_bytes.get(w, 0)) for w in workers],
            previous=self.placement.assignment if self.placement is not None else None,
            hysteresis=self._scheduling.hysteresis,
            forbid_memory_oversubscription=self._scheduling.forbid_memory_oversubscription,
        )

    def _repack(self, discovered: RoutingTable, workers: list[str], weights: WeightInfo) -> None:
        loads = self._loads(discovered, weights)
        self.placement = self._place(loads, workers, weights)
        self.repacks += 1
        log.info(
            "lpt_packing: repack (models %d, moved %d, held_by_hysteresis %d)",
            len(loads),
            len(self.placement.moved),
            len(self.placement.held_by_hysteresis),
        )
        for warning in self.placement.warnings:
            log.warning("lpt_packing: %s", warning)

    def _restrict(self, discovered: RoutingTable) -> RoutingTable:
        assignment = dict(self.placement.assignment) if self.placement is not None else {}
        for name, route in discovered.routes.items():  # callees go where their metas went
            for callee in route.calls:
                both = (*assignment.get(callee, ()), *assignment.get(name, ()))
                assignment[callee] = tuple(dict.fromkeys(both))
        routes = {}
        for name, route in discovered.routes.items():
            placed = tuple(w for w in assignment.get(name, ()) if w in route.replicas)
            cost = self._estimates.get(name, _Estimate()).cost or route.cost_per_item_seconds
            routes[name] = replace(
                route, replicas=placed or route.replicas, cost_per_item_seconds=cost
            )
        return discovered.with_routes(routes)
