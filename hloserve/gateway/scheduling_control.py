"""What the gateway's control plane reads and changes of the scheduling state.

:class:`SchedulingControl` (used by :mod:`hloserve.gateway.control`, the
``hloserve.gateway.v1.GatewayControl`` service): the knobs (:data:`KNOBS`, validated like the
config file), per-model replicas and fill modes, operator repacks of the ``lpt_packing``
controller (:class:`hloserve.gateway.packing.LptController`), and the status snapshot
(:class:`SchedulingSnapshot` and its rows). docs/gateway.md, "Control plane".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from hloserve.errors import HloserveError, InvalidArgumentError, NotFoundError, Status
from hloserve.gateway.config import REMOVED_KEYS, SchedulingConfig
from hloserve.gateway.dataplane import fill_quantum
from hloserve.gateway.packing import LptController
from hloserve.gateway.routing import ModelRoute, Router


@dataclass(frozen=True)
class ReplicaRow:
    """One replica of one model in :class:`SchedulingSnapshot`.

    Attributes:
        worker: worker gRPC endpoint (host:port).
        routed_total: requests HAProxy routed there since start.
        outstanding_items: requests of the model in flight there now (HAProxy counts
            requests, not items).
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
        fill_quantum: requests one replica takes at once under fill mode ``run``
            (:func:`hloserve.gateway.dataplane.fill_quantum`).
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
    fill_quantum: int
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
    router (HAProxy's next layout) and to the ``lpt_packing`` controller. They are not persisted.
    Call from the gateway's event loop (the controller is not thread-safe).

    Args:
        mode: the gateway's mode (startup-only).
        scheduling: the knobs at startup.
        workers: every worker endpoint (the attribute ``workers``, which DNS discovery
            replaces as the fleet changes).
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
        self.workers = workers
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
        unknown = sorted(set(changes) - set(KNOBS) - set(REMOVED_KEYS["SchedulingConfig"]))
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
        items = self._router.worker_items(self.workers)
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
            for w in self.workers
        )
        return SchedulingSnapshot(self.mode, self._scheduling, models, workers, self._repack_row())
