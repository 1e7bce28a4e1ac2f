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
every model weighs 0 and budgets are unlimited. :class:`SchedulingControl` is what the control
plane (:mod:`hloserve.gateway.control`) reads and changes: knobs validated like the config file,
per-model replicas and fill modes, operator repacks, the status snapshot. Not done yet: EWMA
half-life decoupled from the rebalance budget.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from hloserve.errors import HloserveError, InvalidArgumentError, NotFoundError, Status
from hloserve.gateway.config import SchedulingConfig
from hloserve.gateway.placement import (
    ModelLoad,
    Placement,
    RepackClock,
    WorkerCapacity,
    compute_placement,
)
from hloserve.gateway.routing import ModelRoute, Router, RoutingTable, fill_quantum
from hloserve.model_repository_tools.names import RUNTIME_MODEL
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

    def _repack(self, discovered: RoutingTable, workers: list[str], weights: WeightInfo) -> None:
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
        previous = self.placement.assignment if self.placement is not None else None
        self.placement = compute_placement(
            loads,
            [WorkerCapacity(w, weights.budget_bytes.get(w, 0)) for w in workers],
            previous=previous,
            hysteresis=self._scheduling.hysteresis,
            forbid_memory_oversubscription=self._scheduling.forbid_memory_oversubscription,
        )
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
            )
        return discovered.with_routes(routes)


@dataclass(frozen=True)
class ReplicaRow:
    """One replica of one model in :class:`SchedulingSnapshot`.

    Attributes:
        worker: worker gRPC endpoint (host:port).
        routed_total: requests routed there since start, failovers included.
        outstanding_items: items of the model in flight there now.
    """

    worker: str
    routed_total: int
    outstanding_items: int


@dataclass(frozen=True)
class ModelRow:
    """One model in :class:`SchedulingSnapshot` (docs/gateway.md, "Control plane").

    Attributes:
        name: model name.
        configured_replicas: replica count from the config or the control plane.
        effective_replicas: replicas in the routing table now.
        fill_mode: ``run`` or ``spread``.
        fill_factor: multiplier of the max batch.
        fill_quantum: items; None when the max batch is unknown.
        max_batch: worker-reported ``max_batch_size``; None when unknown or 0.
        arrival_rate: items per second (EWMA; 0 outside ``lpt_packing``).
        cost_per_item_seconds: seconds per item (EWMA or table value; 0 when unmeasured).
        weight_bytes: device weight footprint from the workers' metrics (0 = unknown).
        replicas: per replica routed and in-flight counts, in table order.
    """

    name: str
    configured_replicas: int | str
    effective_replicas: int
    fill_mode: str
    fill_factor: float
    fill_quantum: int | None
    max_batch: int | None
    arrival_rate: float
    cost_per_item_seconds: float
    weight_bytes: int
    replicas: tuple[ReplicaRow, ...]

    @property
    def utilization(self) -> float:
        """Compute seconds per second: arrival rate x cost per item."""
        return self.arrival_rate * self.cost_per_item_seconds


@dataclass(frozen=True)
class WorkerRow:
    """One worker in :class:`SchedulingSnapshot`.

    Attributes:
        worker: worker gRPC endpoint.
        models_placed: models the last placement put there (0 outside ``lpt_packing``).
        outstanding_items: items of every model in flight there now.
        compute_share: placed compute seconds per second.
        weight_bytes: placed weight bytes.
        weight_budget_bytes: the worker's weight budget (0 = unlimited or unknown).
    """

    worker: str
    models_placed: int
    outstanding_items: int
    compute_share: float
    weight_bytes: int
    weight_budget_bytes: int

    @property
    def pressure(self) -> float:
        """max(compute share, weight bytes / budget) -- what placement balances."""
        memory = self.weight_bytes / self.weight_budget_bytes if self.weight_budget_bytes else 0.0
        return max(self.compute_share, memory)


@dataclass(frozen=True)
class RepackRow:
    """Repack bookkeeping (``lpt_packing`` only).

    Attributes:
        repacks: placements computed since start.
        accumulated_compute_seconds: fleet compute seconds toward the next traffic repack.
        budget_compute_seconds: fleet compute seconds that trigger it.
        moved: models the last repack moved.
        held_by_hysteresis: models the last repack kept home by hysteresis.
        warnings: the last repack's warnings.
    """

    repacks: int
    accumulated_compute_seconds: float
    budget_compute_seconds: float
    moved: tuple[str, ...]
    held_by_hysteresis: tuple[str, ...]
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class SchedulingSnapshot:
    """What ``GetSchedulingStatus`` reports: mode, knobs, models, workers, repack state."""

    mode: str
    scheduling: SchedulingConfig
    models: tuple[ModelRow, ...]
    workers: tuple[WorkerRow, ...]
    repack: RepackRow | None


#: Knobs the control plane may change; ``mode``, endpoints and ports are startup-only.
KNOBS = (
    "default_replicas",
    "forbid_memory_oversubscription",
    "hysteresis",
    "rebalance_compute_seconds",
    "first_rebalance_compute_seconds",
    "routing_fill_factor",
    "routing_fill_mode",
    "routing_policy",
)


def _validated(data: Mapping[str, Any]) -> SchedulingConfig:
    """``SchedulingConfig`` from ``data``, or InvalidArgumentError naming each bad field."""
    try:
        return SchedulingConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in ("scheduling", *err["loc"]))
            problems.append(f"{where}: {err['msg'].removeprefix('Value error, ')}")
        raise InvalidArgumentError("; ".join(problems)) from None


class SchedulingControl:
    """The gateway's live scheduling state, as the control plane reads and changes it.

    Changes are validated by the same pydantic model as the config file, then handed to the
    router's scheduler and to the ``lpt_packing`` controller. They are not persisted.
    Call from the gateway's event loop (the controller is not thread-safe).

    Args:
        mode: the gateway's mode (startup-only).
        scheduling: the knobs at startup.
        workers: every configured worker endpoint.
        router: the gateway's router.
        controller: the ``lpt_packing`` controller; None in the other modes.
        on_repack: called after each operator repack (a metrics counter).
    """

    def __init__(
        self,
        mode: str,
        scheduling: SchedulingConfig,
        workers: tuple[str, ...],
        router: Router,
        controller: LptController | None = None,
        on_repack: Callable[[], None] | None = None,
    ) -> None:
        self.mode = mode
        self._scheduling = scheduling
        self._workers = workers
        self._router = router
        self._controller = controller
        self._on_repack = on_repack

    @property
    def scheduling(self) -> SchedulingConfig:
        """The knobs in force."""
        return self._scheduling

    def _require_lpt(self, what: str) -> LptController:
        if self._controller is None:
            raise HloserveError(
                f"{what} needs mode lpt_packing; this gateway runs {self.mode}"
                " (the mode is fixed at startup)",
                status=Status.FAILED_PRECONDITION,
            )
        return self._controller

    def _known(self, model: str) -> None:
        if self._router.table.get(model) is None:
            raise NotFoundError(f"model {model!r} is not served by any worker")

    def _apply(self, scheduling: SchedulingConfig) -> None:
        self._scheduling = scheduling
        self._router.update_scheduling(scheduling)
        if self._controller is not None:
            self._controller.update_scheduling(scheduling)

    def _set_model(self, model: str, **changes: Any) -> ModelRow:
        data = self._scheduling.model_dump()
        entry = data["models"].get(model, {"replicas": self._scheduling.replicas_of(model)})
        entry.update(changes)
        data["models"][model] = entry
        self._apply(_validated(data))
        return self.model_row(model)

    def set_model_replicas(self, model: str, replicas: int | str) -> ModelRow:
        """Set ``model``'s replica count (a positive integer or ``"all"``), next repack on.

        Raises:
            HloserveError: FAILED_PRECONDITION outside ``lpt_packing``.
            NotFoundError: no worker serves ``model``.
            InvalidArgumentError: a count below 1 (message names the field).
        """
        self._require_lpt("set-replicas")
        self._known(model)
        return self._set_model(model, replicas=replicas)

    def set_model_fill_mode(self, model: str, fill_mode: str) -> ModelRow:
        """Set ``model``'s fill mode (``run`` or ``spread``); routing uses it at once.

        Raises:
            HloserveError: FAILED_PRECONDITION outside ``lpt_packing``.
            NotFoundError: no worker serves ``model``.
            InvalidArgumentError: another value.
        """
        self._require_lpt("set-fill-mode")
        self._known(model)
        return self._set_model(model, fill_mode=fill_mode)

    def set_knobs(self, changes: Mapping[str, Any]) -> SchedulingConfig:
        """Change the named knobs (:data:`KNOBS`), all or nothing.

        Raises:
            HloserveError: FAILED_PRECONDITION outside ``lpt_packing``.
            InvalidArgumentError: an unknown knob or an invalid value (named
                ``scheduling.<knob>``); nothing is changed then.
        """
        self._require_lpt("set")
        unknown = sorted(set(changes) - set(KNOBS))
        if unknown:
            raise InvalidArgumentError(
                f"unknown knob(s) {', '.join(unknown)}; known: {', '.join(KNOBS)}"
            )
        self._apply(_validated({**self._scheduling.model_dump(), **changes}))
        return self._scheduling

    def repack(self) -> RepackRow:
        """Repack now with the current estimates, bypassing the compute budget.

        Raises:
            HloserveError: FAILED_PRECONDITION outside ``lpt_packing``.
        """
        controller = self._require_lpt("repack")
        self._router.swap_table(controller.repack_now())
        if self._on_repack is not None:
            self._on_repack()
        row = self._repack_row()
        assert row is not None
        return row

    def _repack_row(self) -> RepackRow | None:
        if self._controller is None:
            return None
        placement = self._controller.placement
        clock = self._controller.clock
        return RepackRow(
            repacks=self._controller.repacks,
            accumulated_compute_seconds=clock.accumulated_seconds,
            budget_compute_seconds=clock.budget_seconds,
            moved=placement.moved if placement else (),
            held_by_hysteresis=placement.held_by_hysteresis if placement else (),
            warnings=placement.warnings if placement else (),
        )

    def model_row(self, model: str) -> ModelRow:
        """Status of one model in the current table.

        Raises:
            NotFoundError: no worker serves ``model``.
        """
        route = self._router.table.get(model)
        if route is None:
            raise NotFoundError(f"model {model!r} is not served by any worker")
        return self._model_row(model, route, self._router.routed(), self._router.outstanding_all())

    def _model_row(
        self,
        model: str,
        route: ModelRoute,
        routed: Mapping[tuple[str, str], int],
        outstanding: Mapping[tuple[str, str], int],
    ) -> ModelRow:
        scheduling = self._scheduling
        rate, cost = 0.0, route.cost_per_item_seconds or 0.0
        weight = 0
        if self._controller is not None:
            rate, measured = self._controller.estimates().get(model, (0.0, 0.0))
            cost = measured or cost
            weight = self._controller.weights.model_bytes.get(model, 0)
        factor = scheduling.fill_factor_of(model)
        return ModelRow(
            name=model,
            configured_replicas=scheduling.replicas_of(model),
            effective_replicas=len(route.replicas),
            fill_mode=scheduling.fill_mode_of(model),
            fill_factor=factor,
            fill_quantum=fill_quantum(route.max_batch, factor),
            max_batch=route.max_batch,
            arrival_rate=rate,
            cost_per_item_seconds=cost,
            weight_bytes=weight,
            replicas=tuple(
                ReplicaRow(w, routed.get((model, w), 0), outstanding.get((model, w), 0))
                for w in route.replicas
            ),
        )

    def snapshot(self) -> SchedulingSnapshot:
        """Everything ``GetSchedulingStatus`` reports, read now."""
        table = self._router.table
        routed, outstanding = self._router.routed(), self._router.outstanding_all()
        models = tuple(
            self._model_row(name, table.routes[name], routed, outstanding)
            for name in sorted(table.routes)
        )
        items = self._router.worker_items(self._workers)
        placement = self._controller.placement if self._controller is not None else None
        budgets = self._controller.weights.budget_bytes if self._controller is not None else {}
        workers = tuple(
            WorkerRow(
                worker=w,
                models_placed=sum(w in ws for ws in placement.assignment.values())
                if placement
                else 0,
                outstanding_items=items.get(w, 0),
                compute_share=placement.compute_share.get(w, 0.0) if placement else 0.0,
                weight_bytes=placement.weight_bytes.get(w, 0) if placement else 0,
                weight_budget_bytes=budgets.get(w, 0),
            )
            for w in self._workers
        )
        return SchedulingSnapshot(self.mode, self._scheduling, models, workers, self._repack_row())
