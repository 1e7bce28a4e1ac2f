"""The gateway's control plane: ``hloserve.gateway.v1.GatewayControl`` over gRPC.

A thin ``grpc.aio`` servicer: it converts between the messages of
``hloserve/protos/gateway_control.proto`` and
:class:`hloserve.gateway.scheduling_control.SchedulingControl`, which holds the logic, and
raises :class:`hloserve.errors.HloserveError`, which the gateway server's
:class:`hloserve.gateway.interceptor.ErrorInterceptor` answers with its gRPC status
(INVALID_ARGUMENT naming the field, NOT_FOUND for an unknown model, FAILED_PRECONDITION for a
mutation outside ``lpt_packing``). :func:`add_control_service` registers it on the gateway's
own gRPC server, next to ``inference.GRPCInferenceService``: KServe clients never call it and
are unaffected. Changes are live and not persisted.
"""

from __future__ import annotations

from typing import Any

import grpc

from hloserve.errors import InvalidArgumentError
from hloserve.gateway.config import REMOVED_KEYS, SchedulingConfig
from hloserve.gateway.scheduling_control import KNOBS, ModelRow, RepackRow, SchedulingControl
from hloserve.protos import gateway_control_pb2 as pb
from hloserve.protos import gateway_control_pb2_grpc as pb_grpc

#: Full gRPC service name, e.g. for grpcurl.
SERVICE = "hloserve.gateway.v1.GatewayControl"


def replicas_to_proto(value: int | str) -> pb.Replicas:
    """A replica count (positive int or ``"all"``) as a ``Replicas`` message."""
    return pb.Replicas(all=True) if value == "all" else pb.Replicas(count=int(value))


def replicas_from_proto(message: pb.Replicas, field: str) -> int | str:
    """The replica count a ``Replicas`` message names.

    Raises:
        InvalidArgumentError: neither ``count`` nor ``all=true`` is set (names ``field``).
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
    changes: dict[str, Any] = {}
    for name in (*KNOBS, *REMOVED_KEYS["SchedulingConfig"]):  # a removed one is refused
        if message.HasField(name):
            changes[name] = getattr(message, name)
    if "default_replicas" in changes:
        changes["default_replicas"] = replicas_from_proto(
            message.default_replicas, "scheduling.default_replicas"
        )
    return changes


def _model(row: ModelRow) -> pb.ModelStatus:
    return pb.ModelStatus(
        name=row.name,
        configured_replicas=replicas_to_proto(row.configured_replicas),
        effective_replicas=row.effective_replicas,
        fill_mode=row.fill_mode,
        fill_factor=row.fill_factor,
        fill_quantum=row.fill_quantum or 0,
        max_batch=row.max_batch or 0,
        arrival_rate=row.arrival_rate,
        cost_per_item_seconds=row.cost_per_item_seconds,
        utilization=row.utilization,
        weight_bytes=row.weight_bytes,
        replicas=[
            pb.ReplicaStatus(
                worker=r.worker, routed_total=r.routed_total, outstanding_items=r.outstanding_items
            )
            for r in row.replicas
        ],
    )


def _repack(row: RepackRow) -> pb.RepackStatus:
    return pb.RepackStatus(
        repacks=row.repacks,
        accumulated_compute_seconds=row.accumulated_compute_seconds,
        budget_compute_seconds=row.budget_compute_seconds,
        moved=row.moved,
        held_by_hysteresis=row.held_by_hysteresis,
    )


class GatewayControlServicer(pb_grpc.GatewayControlServicer):
    """``GatewayControl`` RPCs over a :class:`SchedulingControl`.

    Args:
        control: the gateway's scheduling state (shared with its discovery loop).
    """

    def __init__(self, control: SchedulingControl) -> None:
        self._control = control

    async def GetSchedulingStatus(
        self, request: pb.GetSchedulingStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.SchedulingStatus:
        """The placement, knobs, per-model and per-worker state, and the last repack."""
        snapshot = self._control.snapshot()
        status = pb.SchedulingStatus(
            mode=snapshot.mode,
            knobs=knobs_to_proto(snapshot.scheduling),
            models=[_model(m) for m in snapshot.models],
            workers=[
                pb.WorkerStatus(
                    worker=w.worker,
                    models_placed=w.models_placed,
                    outstanding_items=w.outstanding_items,
                    compute_share=w.compute_share,
                    weight_bytes=w.weight_bytes,
                    weight_budget_bytes=w.weight_budget_bytes,
                    pressure=w.pressure,
                )
                for w in snapshot.workers
            ],
        )
        if snapshot.repack is not None:
            status.repack.CopyFrom(_repack(snapshot.repack))
            status.warnings.extend(snapshot.repack.warnings)
        return status

    async def SetModelReplicas(
        self, request: pb.SetModelReplicasRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelStatus:
        """Set one model's replica count (INVALID_ARGUMENT for a bad count or model)."""
        field = f"scheduling.models.{request.model}.replicas"
        replicas = replicas_from_proto(request.replicas, field)
        return _model(self._control.set_model_replicas(request.model, replicas))

    async def SetModelFillMode(
        self, request: pb.SetModelFillModeRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelStatus:
        """Set one model's fill mode (``run`` or ``spread``)."""
        return _model(self._control.set_model_fill_mode(request.model, request.fill_mode))

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
        row = self._control.repack()
        return pb.RepackResponse(repack=_repack(row), warnings=row.warnings)


def add_control_service(server: grpc.aio.Server, control: SchedulingControl) -> None:
    """Serve ``GatewayControl`` for ``control`` on ``server`` (before it starts)."""
    pb_grpc.add_GatewayControlServicer_to_server(GatewayControlServicer(control), server)
