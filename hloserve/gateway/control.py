"""The gateway's control plane: ``hloserve.gateway.v1.GatewayControl`` over gRPC.

:class:`SchedulingControl` holds the logic, :class:`GatewayControlServicer` serves it; changes
are live and not persisted (docs/gateway.md, "Control plane").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from pydantic import ValidationError

from hloserve.errors import HloserveError, InvalidArgumentError, NotFoundError, Status
from hloserve.gateway.config import KNOBS, REMOVED_KEYS, SchedulingConfig
from hloserve.gateway.dataplane import fill_quantum
from hloserve.gateway.packing import LptController
from hloserve.gateway.placement import Placement
from hloserve.gateway.routing import ModelRoute, Router
from hloserve.protos import gateway_control_pb2 as pb
from hloserve.protos import gateway_control_pb2_grpc as pb_grpc

#: Full gRPC service name, e.g. for grpcurl.
SERVICE = "hloserve.gateway.v1.GatewayControl"

_NO_PLACEMENT = Placement({}, {}, {})


def replicas_to_proto(value: int | str) -> pb.Replicas:
    """A replica count (positive int or ``"all"``) as a ``Replicas`` message."""
    return pb.Replicas(all=True) if value == "all" else pb.Replicas(count=int(value))


def replicas_from_proto(message: pb.Replicas, field: str) -> int | str:
    """The replica count a ``Replicas`` message names.

    Raises:
        InvalidArgumentError: neither ``count`` nor ``all=true`` is set.
    """
    which = message.WhichOneof("value")
    if which == "count":
        return int(message.count)
    if which == "all" and message.all:
        return "all"
    raise InvalidArgumentError(f"{field}: set count (a positive integer) or all=true")


def knobs_to_proto(scheduling: SchedulingConfig) -> pb.Knobs:
    """Every knob of ``scheduling`` as a ``Knobs`` message (all fields present)."""
    values: dict[str, Any] = {k: getattr(scheduling, k) for k in KNOBS}
    values["default_replicas"] = replicas_to_proto(values["default_replicas"])
    return pb.Knobs(**values)


def knobs_from_proto(message: pb.Knobs) -> dict[str, Any]:
    """The knobs present in ``message``, as ``SchedulingConfig`` field values."""
    names = (*KNOBS, *REMOVED_KEYS["SchedulingConfig"])  # a removed one is refused
    changes = {name: getattr(message, name) for name in names if message.HasField(name)}
    if "default_replicas" in changes:
        field = "scheduling.default_replicas"
        changes["default_replicas"] = replicas_from_proto(message.default_replicas, field)
    return changes


def _validated(data: Mapping[str, Any]) -> SchedulingConfig:
    try:
        return SchedulingConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in ("scheduling", *err["loc"]))
            problems.append(f"{where}: {err['msg'].removeprefix('Value error, ')}")
        raise InvalidArgumentError("; ".join(problems)) from None


@dataclass(eq=False)
class SchedulingControl:
    """The gateway's live scheduling state; changes are validated like the config file and handed
    to the router and the ``lpt_packing`` controller (FAILED_PRECONDITION in the other modes).
    Call from the gateway's event loop.
    """

    mode: str
    scheduling: SchedulingConfig
    workers: tuple[str, ...]
    router: Router
    controller: LptController | None = None
    on_repack: Callable[[], None] | None = None

    def _require_lpt(self, what: str) -> LptController:
        if self.controller is None:
            raise HloserveError(
                f"{what} needs mode lpt_packing; this gateway runs {self.mode}"
                " (the mode is fixed at startup)",
                status=Status.FAILED_PRECONDITION,
            )
        return self.controller

    def _apply(self, scheduling: SchedulingConfig) -> None:
        self.scheduling = scheduling
        self.router.update_scheduling(scheduling)
        if self.controller is not None:
            self.controller.update_scheduling(scheduling)

    def set_model(self, what: str, model: str, **changes: Any) -> pb.ModelStatus:
        """Change ``model``'s entry of ``scheduling.models``; ``what`` names the operation.

        Raises:
            NotFoundError: no worker serves ``model``.
            InvalidArgumentError: a value the config file would refuse (names the field).
        """
        self._require_lpt(what)
        self.model_status(model)  # NotFoundError for an unknown model
        data = self.scheduling.model_dump()
        entry = data["models"].get(model, {"replicas": self.scheduling.replicas_of(model)})
        data["models"][model] = {**entry, **changes}
        self._apply(_validated(data))
        return self.model_status(model)

    def set_knobs(self, changes: Mapping[str, Any]) -> SchedulingConfig:
        """Change the named :data:`~hloserve.gateway.config.KNOBS`, all or nothing.

        Raises:
            InvalidArgumentError: an unknown knob or an invalid value.
        """
        self._require_lpt("set")
        unknown = sorted(set(changes) - set(KNOBS) - set(REMOVED_KEYS["SchedulingConfig"]))
        if unknown:
            raise InvalidArgumentError(
                f"unknown knob(s) {', '.join(unknown)}; known: {', '.join(KNOBS)}"
            )
        self._apply(_validated({**self.scheduling.model_dump(), **changes}))
        return self.scheduling

    def repack(self) -> pb.RepackResponse:
        """Repack now, bypassing the compute budget."""
        controller = self._require_lpt("repack")
        self.router.swap_table(controller.repack_now())
        if self.on_repack is not None:
            self.on_repack()
        placement = controller.placement or _NO_PLACEMENT
        return pb.RepackResponse(
            repack=self._repack_status(controller), warnings=placement.warnings
        )

    @staticmethod
    def _repack_status(controller: LptController) -> pb.RepackStatus:
        placement = controller.placement or _NO_PLACEMENT
        return pb.RepackStatus(
            repacks=controller.repacks,
            accumulated_compute_seconds=controller.clock.accumulated_seconds,
            budget_compute_seconds=controller.clock.budget_seconds,
            moved=placement.moved,
            held_by_hysteresis=placement.held_by_hysteresis,
        )

    def model_status(self, model: str) -> pb.ModelStatus:
        """Status of one model in the current table.

        Raises:
            NotFoundError: no worker serves ``model``.
        """
        route = self.router.table.get(model)
        if route is None:
            raise NotFoundError(f"model {model!r} is not served by any worker")
        return self._model_status(model, route)

    def _model_status(self, model: str, route: ModelRoute) -> pb.ModelStatus:
        routed, outstanding = self.router.routed(), self.router.outstanding_all()
        rate, cost, weight = 0.0, route.cost_per_item_seconds or 0.0, 0
        if self.controller is not None:
            rate, measured = self.controller.estimates().get(model, (0.0, 0.0))
            cost = measured or cost
            weight = self.controller.weights.model_bytes.get(model, 0)
        factor = self.scheduling.fill_factor_of(model)
        return pb.ModelStatus(
            name=model,
            configured_replicas=replicas_to_proto(self.scheduling.replicas_of(model)),
            effective_replicas=len(route.replicas),
            fill_mode=self.scheduling.fill_mode_of(model),
            fill_factor=factor,
            fill_quantum=fill_quantum(route.max_batch, factor),
            max_batch=route.max_batch or 0,
            arrival_rate=rate,
            cost_per_item_seconds=cost,
            utilization=rate * cost,
            weight_bytes=weight,
            replicas=[
                pb.ReplicaStatus(
                    worker=w,
                    routed_total=routed.get((model, w), 0),
                    outstanding_items=outstanding.get((model, w), 0),
                )
                for w in route.replicas
            ],
        )

    def snapshot(self) -> pb.SchedulingStatus:
        """Everything ``GetSchedulingStatus`` reports, read now."""
        items = self.router.worker_items(self.workers)
        controller = self.controller
        placement = (controller.placement if controller else None) or _NO_PLACEMENT
        budgets = controller.weights.budget_bytes if controller is not None else {}
        status = pb.SchedulingStatus(
            mode=self.mode,
            knobs=knobs_to_proto(self.scheduling),
            models=[self._model_status(n, r) for n, r in sorted(self.router.table.routes.items())],
        )
        for w in self.workers:
            share = placement.compute_share.get(w, 0.0)
            weight, budget = placement.weight_bytes.get(w, 0), budgets.get(w, 0)
            status.workers.add(
                worker=w,
                models_placed=sum(w in ws for ws in placement.assignment.values()),
                outstanding_items=items.get(w, 0),
                compute_share=share,
                weight_bytes=weight,
                weight_budget_bytes=budget,
                pressure=max(share, weight / budget if budget else 0.0),
            )
        if controller is not None:
            status.repack.CopyFrom(self._repack_status(controller))
            status.warnings.extend(placement.warnings)
        return status


class GatewayControlServicer(pb_grpc.GatewayControlServicer):
    """``GatewayControl`` RPCs over a :class:`SchedulingControl`."""

    def __init__(self, control: SchedulingControl) -> None:
        self._control = control

    async def GetSchedulingStatus(
        self, request: pb.GetSchedulingStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.SchedulingStatus:
        """The placement, knobs, per-model and per-worker state, and the last repack."""
        return self._control.snapshot()

    async def SetModelReplicas(
        self, request: pb.SetModelReplicasRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelStatus:
        """Set one model's replica count (INVALID_ARGUMENT for a bad count or model)."""
        field = f"scheduling.models.{request.model}.replicas"
        replicas = replicas_from_proto(request.replicas, field)
        return self._control.set_model("set-replicas", request.model, replicas=replicas)

    async def SetModelFillMode(
        self, request: pb.SetModelFillModeRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelStatus:
        """Set one model's fill mode (``run`` or ``spread``)."""
        return self._control.set_model("set-fill-mode", request.model, fill_mode=request.fill_mode)

    async def SetKnobs(
        self, request: pb.SetKnobsRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetKnobsResponse:
        """Change the named scheduling knobs live; INVALID_ARGUMENT when none is named."""
        changes = knobs_from_proto(request.knobs)
        if not changes:
            raise InvalidArgumentError("knobs: no knob set; name at least one")
        return pb.SetKnobsResponse(knobs=knobs_to_proto(self._control.set_knobs(changes)))

    async def Repack(
        self, request: pb.RepackRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepackResponse:
        """Re-place every model now (lpt_packing) and answer what moved."""
        return self._control.repack()


def add_control_service(server: grpc.aio.Server, control: SchedulingControl) -> None:
    """Serve ``GatewayControl`` for ``control`` on ``server`` (before it starts)."""
    pb_grpc.add_GatewayControlServicer_to_server(GatewayControlServicer(control), server)
