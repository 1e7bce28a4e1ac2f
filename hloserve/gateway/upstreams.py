"""The gateway's channels to its workers and the probes sent on them (raw bytes both ways)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from hloserve.errors import InvalidArgumentError, WorkerSchedulingError
from hloserve.gateway.config import GrpcLimits
from hloserve.gateway.packing import Counters
from hloserve.model_parameters import RuntimeParameters, string_values
from hloserve.names import PARAM_SCHEDULING, RUNTIME_BACKEND, RUNTIME_MODEL

log = logging.getLogger("hloserve.gateway")

_NO_RUNTIME = "gateway: worker %s serves no hloserve runtime; its scheduling is unknown"

SERVICE = "inference.GRPCInferenceService"

#: Reconnect backoff of the upstream channels, milliseconds: at most 2 s (gRPC's default grows
#: to 120 s, so a restarted worker would stay unreachable long after it is ready).
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def channel_options(limits: GrpcLimits) -> list[tuple[str, int]]:
    """gRPC options raising the message-size limits, for servers and channels alike."""
    return [
        ("grpc.max_receive_message_length", limits.max_recv_msg_bytes),
        ("grpc.max_send_message_length", limits.max_send_msg_bytes),
    ]


class Upstreams:
    """One ``grpc.aio`` channel per worker, raw bytes both ways; ``repository_metadata`` goes
    with every ``RepositoryIndex`` call (the workers' model-control key).
    """

    def __init__(
        self,
        workers: Sequence[str],
        limits: GrpcLimits,
        repository_metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.workers = tuple(workers)
        self.repository_metadata = tuple(repository_metadata)
        self._options = channel_options(limits) + RECONNECT_OPTIONS
        self._channels = {
            w: grpc.aio.insecure_channel(w, options=self._options) for w in self.workers
        }
        self._unary: dict[tuple[str, str], grpc.aio.UnaryUnaryMultiCallable] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def set_workers(self, workers: Sequence[str]) -> tuple[str, ...]:
        """Make ``workers`` the fleet; returns those gone (open until :meth:`drop`)."""
        self.workers = tuple(workers)
        for worker in self.workers:
            if worker not in self._channels:
                self._channels[worker] = grpc.aio.insecure_channel(worker, options=self._options)
        return tuple(w for w in self._channels if w not in self.workers)

    def drop(self, workers: Sequence[str], grace_s: float) -> None:
        """Close the channels of ``workers`` gone, each after its calls end or ``grace_s``."""
        for worker in workers:
            if worker in self.workers:
                continue
            channel = self._channels.pop(worker, None)
            self._unary = {k: v for k, v in self._unary.items() if k[0] != worker}
            if channel is not None:
                task = asyncio.ensure_future(channel.close(grace=grace_s))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    def raw(self, worker: str, method: str) -> grpc.aio.UnaryUnaryMultiCallable:
        """A cached callable sending bytes to ``method`` of ``worker``, returning reply bytes."""
        key = (worker, method)
        call = self._unary.get(key)
        if call is None:
            call = self._unary[key] = self._channels[worker].unary_unary(f"/{SERVICE}/{method}")
        return call

    def raw_stream(self, worker: str, method: str) -> grpc.aio.StreamStreamMultiCallable:
        """A bidirectional-streaming callable carrying bytes both ways."""
        return self._channels[worker].stream_stream(f"/{SERVICE}/{method}")

    async def repository_index(self, worker: str, timeout_s: float) -> Any:
        """``worker``'s ``RepositoryIndex`` rows.

        Raises:
            grpc.aio.AioRpcError: the worker's error (UNAVAILABLE when unreachable).
        """
        request = service_pb2.RepositoryIndexRequest(ready=False).SerializeToString()
        reply = await self.raw(worker, "RepositoryIndex")(
            request, timeout=timeout_s, metadata=self.repository_metadata
        )
        return service_pb2.RepositoryIndexResponse.FromString(reply).models

    async def model_config(self, worker: str, model: str, timeout_s: float) -> Any:
        """``model``'s ``inference.ModelConfig`` on ``worker``.

        Raises:
            grpc.aio.AioRpcError: the worker's error (NOT_FOUND: not loaded there).
        """
        request = service_pb2.ModelConfigRequest(name=model).SerializeToString()
        reply = await self.raw(worker, "ModelConfig")(request, timeout=timeout_s)
        return service_pb2.ModelConfigResponse.FromString(reply).config

    async def close(self) -> None:
        """Close every channel (those being dropped too, without waiting)."""
        for task in list(self._closing):
            task.cancel()
        await asyncio.gather(*self._closing, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in self._channels.values()))


async def probe_ready(upstreams: Upstreams, worker: str, timeout_s: float) -> bool:
    """One health probe: ``ServerReady`` of ``worker`` answered ``ready: true`` in time."""
    request = service_pb2.ServerReadyRequest().SerializeToString()
    try:
        reply = await upstreams.raw(worker, "ServerReady")(request, timeout=timeout_s)
    except grpc.aio.AioRpcError:
        return False
    return bool(service_pb2.ServerReadyResponse.FromString(reply).ready)


async def poll_counters(upstreams: Upstreams, timeout_s: float) -> dict[tuple[str, str], Counters]:
    """Cumulative :class:`Counters` per (model, worker) of the workers answering statistics."""
    request = service_pb2.ModelStatisticsRequest().SerializeToString()

    async def one(worker: str) -> tuple[str, bytes | None]:
        try:
            return worker, await upstreams.raw(worker, "ModelStatistics")(
                request, timeout=timeout_s
            )
        except grpc.aio.AioRpcError:
            return worker, None

    counters: dict[tuple[str, str], Counters] = {}
    for worker, reply in await asyncio.gather(*(one(w) for w in upstreams.workers)):
        if reply is None:
            continue
        for row in service_pb2.ModelStatisticsResponse.FromString(reply).model_stats:
            ns = sum(b.compute_infer.ns for b in row.batch_stats)
            counters[(row.name, worker)] = Counters(row.inference_count, ns / 1e9)
    return counters


async def _discipline(upstreams: Upstreams, worker: str, timeout_s: float) -> str | None:
    """``worker``'s scheduling discipline, or None when unknown (the reason is logged)."""
    try:
        config = await upstreams.model_config(worker, RUNTIME_MODEL, timeout_s)
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            log.warning(_NO_RUNTIME, worker)
        else:
            why = f"gateway: worker %s: cannot read {RUNTIME_MODEL}'s config (%s)"
            log.warning(why + "; its scheduling is unknown", worker, exc.code().name)
        return None
    if config.backend != RUNTIME_BACKEND:
        log.warning(_NO_RUNTIME, worker)
        return None
    params = string_values(config.parameters)
    try:
        return str(RuntimeParameters.read(RUNTIME_MODEL, params, PARAM_SCHEDULING))
    except InvalidArgumentError as exc:  # its runtime refuses it too; lpt_packing names it
        log.warning("gateway: worker %s: %s", worker, exc.message)
        return params[PARAM_SCHEDULING]


async def check_lpt_workers(upstreams: Upstreams, timeout_s: float) -> None:
    """``lpt_packing``'s precondition: every worker schedules ``fifo`` or ``edf``, not ``fair``
    (docs/scheduling.md, "The gateway's lpt_packing"); an unknown discipline is logged and accepted.

    Raises:
        WorkerSchedulingError: naming every worker that schedules otherwise and how to change it.
    """
    workers = upstreams.workers
    found = await asyncio.gather(*(_discipline(upstreams, w, timeout_s) for w in workers))
    wrong = {w: d for w, d in zip(workers, found, strict=True) if d not in (None, "fifo", "edf")}
    if wrong:
        listed = ", ".join(f"{w} ({d})" for w, d in sorted(wrong.items()))
        raise WorkerSchedulingError(
            f"gateway mode lpt_packing needs workers that schedule fifo or edf; {listed} "
            "schedule otherwise: rebuild their repositories with hloserve repo build "
            "--scheduling fifo (or edf), or serve them with hloserve serve --scheduling fifo "
            "(docs/scheduling.md)"
        )
