"""The ``lpt_packing`` control loop, transport-neutral: statistics in, routing table out.

Each discovery tick hands :class:`LptController` the discovered table (every ready replica)
and each worker's cumulative counters per model (from Triton's ``ModelStatistics``:
items served and execution seconds). The controller keeps per-model EWMAs of arrival rate
(items/s) and cost per item (seconds), advances a :class:`~hloserve.gateway.placement.RepackClock`
with the fleet's compute seconds, repacks with
:func:`~hloserve.gateway.placement.compute_placement` at startup and when the clock says so
(docs/gateway.md, "The lpt_packing control loop"), and returns the discovered table restricted
to the placement.

Weight footprints and budgets come from the runtime's ``hloserve_weight_*`` metrics
(:func:`weights_from_metrics`) when the workers' metrics endpoints are configured; otherwise
every model weighs 0 and budgets are unlimited. What the control plane
(:mod:`hloserve.gateway.control`) reads and changes (knobs validated like the config file,
per-model replicas and fill modes, operator repacks, the status snapshot) is
:class:`hloserve.gateway.control.SchedulingControl`. Not done yet: EWMA half-life
decoupled from the rebalance budget.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
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
from hloserve.names import RUNTIME_MODEL
from hloserve.prometheus_text import cache_status

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
    ``hloserve_weight_bytes{model}`` (hloserve.triton_backend.backends.metrics), parsed with
    :func:`hloserve.prometheus_text.cache_status`.
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

    Internal models (hloserve's runtime model, which every front model calls over BLS) are
    left out of the estimates, the repack clock and the placement: clients never address
    them, and their execution time is already inside the front models' (counting it would
    count the fleet's compute twice and place the runtime as the heaviest "model"). They keep
    every discovered replica.

    A meta model (a route with ``calls``) and the models it calls are one placement unit
    (docs/meta_models.md): the meta is placed with the sum of its callees' weight bytes and no
    compute of its own (its execution time is its sub-calls', already measured on the
    callees, so it is left out of the estimates and the repack clock like the runtime), and
    every callee is also routed to the workers the meta was placed on.

    Args:
        scheduling: the knobs (replica counts, hysteresis, rebalance budgets).
        internal_models: names never placed (default: the runtime model).
    """

    def __init__(
        self,
        scheduling: SchedulingConfig,
        internal_models: frozenset[str] = frozenset({RUNTIME_MODEL}),
    ) -> None:
        self._scheduling = scheduling
        self._internal = internal_models
        self.clock = RepackClock(
            scheduling.rebalance_compute_seconds, scheduling.first_rebalance_compute_seconds
        )
        self._last: dict[tuple[str, str], Counters] = {}
        self._estimates: dict[str, _Estimate] = {}
        self.placement: Placement | None = None
        #: Placements computed since start (startup, fleet changes, traffic, operator).
        self.repacks = 0
        self._placed_models: frozenset[str] = frozenset()
        self._placed_workers: frozenset[str] = frozenset()
        self._discovered = RoutingTable()
        self.weights = WeightInfo()

    @property
    def scheduling(self) -> SchedulingConfig:
        """The knobs in force."""
        return self._scheduling

    def update_scheduling(self, scheduling: SchedulingConfig) -> None:
        """Use new knobs: replica counts and hysteresis at the next repack, budgets at once.

        The EWMAs and the compute accumulated toward the next repack are kept.
        """
        self._scheduling = scheduling
        self.clock.retune(
            scheduling.rebalance_compute_seconds, scheduling.first_rebalance_compute_seconds
        )

    def repack_now(self) -> RoutingTable:
        """Repack with the current estimates and the last discovered table (an operator repack).

        Does not touch the repack clock. Returns the table to route with; empty
        before the first :meth:`tick`.
        """
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
        """Fold one tick's cumulative counters in; returns the fleet compute seconds spent.

        Deltas against the previous tick give items and compute per model; a counter that
        went down (worker restart) counts as a fresh start. The EWMA weight of the new sample
        is ``1 - 0.5 ** (fleet compute seconds / half-life)`` with the half-life equal to
        ``rebalance_compute_seconds`` (EWMAs decay against fleet compute seconds, as
        ReactantServer's), or 1 for a model's first sample.
        """
        items: dict[str, int] = {}
        compute: dict[str, float] = {}
        metas = {n for n, r in self._discovered.routes.items() if r.calls}
        for key, now in counters.items():
            if key[0] in self._internal or key[0] in metas:
                continue
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
        """The workers a model that no worker holds yet should be loaded on (explicit model
        control through the gateway, docs/gateway.md "Model control").

        The current models and ``model`` (a meta: its group, placed with the footprint of
        ``calls``, as a repack places a meta) (no traffic seen: placed by memory, its weight bytes
        if the workers reported them, else 0, so it goes to the least loaded workers; its
        configured replica count) are placed as a repack would, with the current assignment
        and hysteresis; only ``model``'s share of that placement is returned. The next
        discovery tick, which finds ``model`` on those workers, repacks for real.

        Args:
            model: the model to load.
            workers: the candidate workers (the healthy ones), in fleet order.
            calls: ``model``'s callees when it is a meta; () for a model.

        Returns:
            ``model``'s workers, in placement order; all of ``workers`` when it is internal
            (the runtime model) or there are none.
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
        """What :func:`compute_placement` places: every discovered model but the internal ones
        (a meta with its callees' footprint and no compute of its own)."""
        loads = []
        for name, route in discovered.routes.items():
            if name in self._internal:
                continue
            if route.calls:  # a meta: its group's footprint, no compute of its own
                footprint = sum(weights.model_bytes.get(c, 0) for c in route.calls)
                replicas = self._scheduling.replicas_of(name)
                loads.append(ModelLoad(name, weight_bytes=footprint, replicas=replicas))
                continue
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
        return loads

    def _place(
        self, loads: list[ModelLoad], workers: Sequence[str], weights: WeightInfo
    ) -> Placement:
        """:func:`compute_placement` with the knobs, the budgets and the current assignment."""
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
            estimate = self._estimates.get(name)
            cost = estimate.cost if estimate is not None and estimate.cost > 0 else None
            routes[name] = ModelRoute(
                placed or route.replicas,
                max_batch=route.max_batch,
                cost_per_item_seconds=cost or route.cost_per_item_seconds,
                calls=route.calls,
                stateful=route.stateful,
            )
        return discovered.with_routes(routes)
