"""The gateway's Python servicer: ``inference.GRPCInferenceService`` over several workers.

With ``data_plane: haproxy`` (the default) HAProxy carries ModelInfer straight to the workers
(:mod:`hloserve.gateway.dataplane`, :mod:`hloserve.gateway.haproxy`) and this ``grpc.aio``
servicer, on a loopback port behind it, answers every other RPC and the ModelInfer calls
HAProxy's map does not route (unknown models, models with no ready replica, BYTES first
inputs); with ``data_plane: python`` it carries every RPC (docs/gateway.md, "Data plane" and
"Proxy"). Replica choice, in-flight accounting and failover order come from
:class:`hloserve.gateway.routing.Router`, the channels from
:class:`hloserve.gateway.upstreams.Upstreams`, the table from
:func:`hloserve.gateway.discovery.discover_table`; this module only moves bytes.

- ``ModelInfer`` is forwarded as the bytes the client sent and answered with the bytes the
  worker sent: :func:`hloserve.gateway.wire.peek_infer_request` reads the model name and the
  input shapes, nothing is re-marshalled (as ReactantServer's gateway). Shapes no model can run
  (negative extents; for a batching model 0 rows or more than ``max_batch_size``) are
  answered INVALID_ARGUMENT and never forwarded (:func:`hloserve.gateway.wire.check_shapes`).
  Failover follows the rule of gRPC's and Envoy's retry policies for requests that
  are not idempotent (retry on ``connect-failure`` / ``refused-stream``, never on ``reset``):
  the request goes to the next replica of the lease's order only when it provably did not
  run there -- the gateway could not connect to the worker (it connects before sending), or
  the worker answered NOT_FOUND (the model is not loaded there; also refreshes the table in
  the background), or the worker answered UNAVAILABLE and still answers ``ServerLive``
  afterwards (its own status, e.g. a model not ready; at most one such re-send per request).
  A connection lost while the worker held the request (the worker died: maybe the request
  killed it, a "query of death") is answered UNAVAILABLE and never re-sent, so one bad
  request cannot take down every replica. Any other error is returned with its code and
  message.
- ``ModelStreamInfer``: passed through (bytes) to the replica chosen by the stream's first
  request; no failover once open.

The other RPCs are answered from the workers by :class:`hloserve.gateway.fanout.FleetRpcs`;
this module registers them beside its own two:

- ``ServerLive``: the gateway's own liveness. ``ServerReady``: true when at least one worker
  answers ready.
- ``ModelReady``, ``ModelMetadata``, ``ModelConfig``: forwarded (raw bytes) to a replica of the
  model, with the same failover; to every worker in turn when the model is not in the table.
- ``RepositoryIndex``: every worker's index merged, one row per (name, version); READY wins.
- ``ModelStatistics``: every worker's statistics summed (:mod:`hloserve.gateway.aggregate`).
- ``SystemSharedMemoryRegister`` and ``CudaSharedMemoryRegister`` fan out to every worker and
  are rolled back on partial failure; ``...Unregister`` succeeds if any worker succeeds;
  ``...Status`` comes from the first worker (register and unregister as ReactantServer's
  gateway).
- ``ServerMetadata``: the first answering worker's (perf_analyzer needs it).
- ``RepositoryModelLoad`` / ``RepositoryModelUnload``: where
  :class:`hloserve.gateway.model_control.ModelControl` decides (the workers whose index lists
  the model; a model none lists where the placement mode puts it, a meta with its callees),
  with the client's restricted-API key passed on; the table is rediscovered before the answer.
- Every other RPC of the service answers UNIMPLEMENTED (not registered yet).

Handlers raise :class:`hloserve.errors.HloserveError` (a worker's error answer relayed as
:class:`~hloserve.errors.UpstreamError` with its code); the server's
:class:`hloserve.gateway.interceptor.ErrorInterceptor` answers it with its status.

Message-size limits (:class:`hloserve.gateway.config.GrpcLimits`) are set on the server and
on every upstream channel: gRPC's default receive limit is 4 MiB
(``grpc.max_receive_message_length``, gRPC core's ``GRPC_DEFAULT_MAX_RECV_MESSAGE_LENGTH``) and
Triton's limit is 2 GiB - 1 byte (``INT32_MAX``; tritonclient's
``tritonclient.grpc.MAX_GRPC_MESSAGE_SIZE``), which the defaults match.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from hloserve.errors import HloserveError, NotFoundError, UnavailableError
from hloserve.gateway.admin import GatewayMetrics
from hloserve.gateway.admission import Admission, Ticket
from hloserve.gateway.config import GrpcLimits
from hloserve.gateway.discovery import SingleFlight, discover_table
from hloserve.gateway.fanout import FleetRpcs
from hloserve.gateway.interceptor import ErrorInterceptor, relayed
from hloserve.gateway.model_control import ModelControl, Place
from hloserve.gateway.routing import Router
from hloserve.gateway.upstreams import (
    RECONNECT_OPTIONS,
    SERVICE,
    Upstreams,
    channel_options,
    poll_counters,
    probe_ready,
)
from hloserve.gateway.wire import InferHead, check_shapes, peek_infer_request

log = logging.getLogger("hloserve.gateway")

#: Upstream codes after which ModelInfer may try the next replica (as ReactantServer's gateway),
#: under the conditions of :meth:`GatewayProxy.model_infer`.
_FAILOVER_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND)

#: Re-sends of one ModelInfer request after a live worker answered UNAVAILABLE (re-sends
#: after a connect failure or a NOT_FOUND answer are not counted: the model did not run).
MAX_RESENDS_AFTER_UNAVAILABLE = 1


#: KServe request parameter carrying the client's time budget, microseconds (tritonclient's
#: ``infer(timeout=)``; 0 or absent = none). hloserve's metas answer UNAVAILABLE when it runs
#: out (Triton 2.51 gives backends no DEADLINE_EXCEEDED; hloserve/meta/deadline.py).
TIMEOUT_PARAMETER = "timeout"


def budget_spent(request: bytes, received_at: float, context: Any) -> bool:
    """Whether the client's time budget for ``request`` has run out: the gRPC deadline has
    passed or the KServe ``timeout`` parameter (microseconds) has elapsed since
    ``received_at`` (``time.perf_counter()``). Keyed on time, never on an error's text."""
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        return True
    message = service_pb2.ModelInferRequest.FromString(request)
    if TIMEOUT_PARAMETER not in message.parameters:
        return False
    budget_us = message.parameters[TIMEOUT_PARAMETER].int64_param
    return budget_us > 0 and (time.perf_counter() - received_at) * 1e6 >= budget_us


class GatewayProxy:
    """Handlers of the gateway's ``inference.GRPCInferenceService``.

    Args:
        router: replica choice and in-flight accounting.
        upstreams: channels to the workers.
        request_timeout_s: deadline of one forwarded call, seconds.
        probe_timeout_s: deadline of one ServerReady / RepositoryIndex probe, seconds.
        batch_inputs: model name -> name of its batched input (default: the first input).
        refresh: called (then routing retried once) when a request names a model that is not
            in the table, e.g. a :class:`SingleFlight` over a discovery pass.
        metrics: where upstream calls of ModelInfer are recorded (none when None).
        admission: bounds on ModelInfer calls and items in flight (none when None).
        place: where RepositoryModelLoad puts a model no worker holds (``(model, callees)`` ->
            workers; :class:`~hloserve.gateway.model_control.ModelControl`, shared with the
            KServe HTTP server as :attr:`model_control`).
    """

    def __init__(
        self,
        router: Router,
        upstreams: Upstreams,
        *,
        request_timeout_s: float = 60.0,
        probe_timeout_s: float = 8.0,
        batch_inputs: Mapping[str, str] | None = None,
        refresh: Callable[[], Awaitable[None]] | None = None,
        metrics: GatewayMetrics | None = None,
        admission: Admission | None = None,
        place: Place | None = None,
    ) -> None:
        self._admission = admission
        self._refresh = refresh
        self._metrics = metrics
        self._background: set[asyncio.Future[None]] = set()
        self._router = router
        self._upstreams = upstreams
        self._timeout = request_timeout_s
        self._probe_timeout = probe_timeout_s
        self._batch_inputs = dict(batch_inputs or {})
        self.model_control = ModelControl(router, upstreams, probe_timeout_s, refresh, place)
        self._fleet = FleetRpcs(
            router, upstreams, request_timeout_s, probe_timeout_s, self.model_control
        )

    async def model_infer(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Forward one inference request to a replica.

        Shapes are checked first (:func:`hloserve.gateway.wire.check_shapes`: INVALID_ARGUMENT,
        not forwarded). The request moves to the next replica of the lease's order only when
        it provably did not run on the one tried (module docstring): the connection could
        not be made, the worker answered NOT_FOUND, or the worker answered UNAVAILABLE and is
        still live (once per request). A connection lost mid-request is answered UNAVAILABLE
        without a re-send. When no replica is left the answer is NOT_FOUND if every replica
        said so, else UNAVAILABLE naming each replica's failure.
        """
        received_at = time.perf_counter()
        head = await self._checked_head(request)
        route = self._router.table.get(head.model_name)
        batching = route is not None and route.max_batch is not None
        # A model that does not batch (max_batch_size 0) counts 1 item per request.
        items = (head.batch or 1) if batching else 1
        ticket = self._admit(head.model_name, items)
        try:
            lease = self._router.acquire(head.model_name, items)
        except HloserveError:
            if ticket is not None:
                self._release_ticket(ticket)
            raise
        model = head.model_name
        try:
            worker: str | None = lease.worker
            failures: list[str] = []
            all_not_found = True
            resends = 0
            while worker is not None:
                start = time.perf_counter()
                why = await self._upstreams.connect(worker, self._probe_timeout)
                if why is not None:  # never sent: the next replica is safe
                    self._observe(model, worker, "failover", start)
                    log.warning("worker %s: %s; ModelInfer fails over", worker, why)
                    failures.append(f"worker {worker} unreachable ({why})")
                    all_not_found = False
                    worker = self._router.fail_over(lease)
                    continue
                try:
                    reply: bytes = await self._upstreams.raw(worker, "ModelInfer")(
                        request, timeout=self._timeout
                    )
                    self._observe(model, worker, "ok", start)
                    return reply
                except grpc.aio.AioRpcError as exc:
                    code, details = exc.code(), exc.details() or ""
                    if code not in _FAILOVER_CODES:
                        self._observe(model, worker, "error", start)
                        raise relayed(exc) from None
                    if code == grpc.StatusCode.UNAVAILABLE and budget_spent(
                        request, received_at, context
                    ):
                        # The client's time budget ran out (Triton 2.51 has no
                        # DEADLINE_EXCEEDED for backends, so metas answer UNAVAILABLE): another
                        # replica cannot meet it either; re-running would only repeat the work.
                        self._observe(model, worker, "error", start)
                        raise relayed(exc) from None
                    if code == grpc.StatusCode.UNAVAILABLE:
                        all_not_found = False
                        if not await self._upstreams.alive(worker, self._probe_timeout):
                            self._observe(model, worker, "error", start)
                            log.error(
                                "worker %s: connection lost during a ModelInfer of %r (%s); "
                                "not re-sent",
                                worker,
                                model,
                                details,
                            )
                            raise UnavailableError(
                                f"model {model!r}: worker {worker} failed while it held the "
                                f"request ({details}); the gateway does not send a request "
                                "that may have crashed a worker to another replica"
                            ) from None
                        if resends >= MAX_RESENDS_AFTER_UNAVAILABLE:
                            self._observe(model, worker, "error", start)
                            failures.append(f"worker {worker} answered UNAVAILABLE: {details}")
                            break
                        resends += 1
                    self._observe(model, worker, "failover", start)
                    failures.append(f"worker {worker} answered {code.name}: {details}")
                    log.warning("worker %s: ModelInfer %s; failing over", worker, code.name)
                    if code == grpc.StatusCode.NOT_FOUND:
                        self._refresh_soon()
                    worker = self._router.fail_over(lease)
            why = f"model {model!r}: no replica could serve it: {'; '.join(failures)}"
            raise NotFoundError(why) if all_not_found else UnavailableError(why)
        finally:
            self._router.release(lease)
            if ticket is not None:
                self._release_ticket(ticket)

    def _admit(self, model: str, items: int) -> Ticket | None:
        """Admit the request (None without admission bounds); count refusals.

        Raises:
            UnavailableError: over a bound.
        """
        if self._admission is None:
            return None
        try:
            return self._admission.admit(model, items)
        except HloserveError:
            if self._metrics is not None:
                self._metrics.refused.labels(model).inc()
            raise

    def _release_ticket(self, ticket: Ticket) -> None:
        if self._admission is not None:
            self._admission.release(ticket)

    def _refresh_soon(self) -> None:
        """Start a refresh in the background (a worker no longer has a model)."""
        if self._refresh is None:
            return
        task = asyncio.ensure_future(self._refresh())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _observe(self, model: str, worker: str, outcome: str, start: float) -> None:
        if self._metrics is not None:
            self._metrics.observe(model, worker, outcome, time.perf_counter() - start)

    async def model_stream_infer(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """Pass a ``ModelStreamInfer`` stream through to one replica, bytes both ways.

        The replica is chosen with the stream's first request (its model and batch extent, one
        lease and one admission ticket, both charged the first request's items, held for the
        whole stream); every later message goes to the same worker. Every message's shapes
        are checked first (:func:`hloserve.gateway.wire.check_shapes` against its model's
        route): a message no model can run is not forwarded; the worker answers the messages
        before it, then the stream ends with INVALID_ARGUMENT. No failover once the stream is
        open: an upstream error ends the stream with its code.
        """
        iterator = aiter(requests)
        try:
            first = await anext(iterator)
        except StopAsyncIteration:
            return
        head = await self._checked_head(first)
        route = self._router.table.get(head.model_name)
        items = (head.batch or 1) if route is not None and route.max_batch else 1
        ticket = self._admit(head.model_name, items)
        try:
            lease = self._router.acquire(head.model_name, items)
        except HloserveError:
            if ticket is not None:
                self._release_ticket(ticket)
            raise
        refused: list[HloserveError] = []

        async def upstream_requests() -> AsyncIterator[bytes]:
            yield first
            async for request in iterator:
                try:
                    await self._checked_head(request)
                except HloserveError as exc:  # half-close: earlier messages still answer
                    refused.append(exc)
                    return
                yield request

        try:
            call = self._upstreams.raw_stream(lease.worker, "ModelStreamInfer")(upstream_requests())
            async for reply in call:
                yield reply
        except grpc.aio.AioRpcError as exc:
            raise relayed(exc) from None
        finally:
            self._router.release(lease)
            if ticket is not None:
                self._release_ticket(ticket)
        if refused:
            raise refused[0]

    async def _checked_head(self, request: bytes) -> InferHead:
        """The request's head with its batch extent, after its shapes were checked against
        its model's route (a discovery pass first when the model is unknown).

        Raises:
            InvalidArgumentError: malformed, or shapes no model can run.
        """
        head = peek_infer_request(request)
        if head.model_name in self._batch_inputs:
            batch_input = self._batch_inputs[head.model_name]
            head = dataclasses.replace(head, batch=head.batch_of(batch_input))
        route = self._router.table.get(head.model_name)
        if route is None and self._refresh is not None:
            await self._refresh()
            route = self._router.table.get(head.model_name)
        if route is not None:
            check_shapes(head, route.max_batch)
        return head

    def handler(self) -> grpc.GenericRpcHandler:
        """The generic handler to add to a ``grpc.aio`` server."""

        def forward(method: str) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
            async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                return await fleet.forward_to_model(method, request, context)

            return call

        fleet = self._fleet
        raw = grpc.unary_unary_rpc_method_handler
        handlers = {
            "ModelInfer": raw(self.model_infer),
            "ModelReady": raw(forward("ModelReady")),
            "ModelMetadata": raw(forward("ModelMetadata")),
            "ModelConfig": raw(forward("ModelConfig")),
            "ModelStatistics": raw(fleet.model_statistics),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(self.model_stream_infer),
            **{method: raw(handler) for method, handler in fleet.shm_handlers().items()},
            "RepositoryModelLoad": raw(fleet.repository_model_load),
            "RepositoryModelUnload": raw(fleet.repository_model_unload),
            "ServerMetadata": raw(fleet.server_metadata),
            "ServerLive": raw(
                fleet.server_live,
                request_deserializer=service_pb2.ServerLiveRequest.FromString,
                response_serializer=service_pb2.ServerLiveResponse.SerializeToString,
            ),
            "ServerReady": raw(
                fleet.server_ready,
                request_deserializer=service_pb2.ServerReadyRequest.FromString,
                response_serializer=service_pb2.ServerReadyResponse.SerializeToString,
            ),
            "RepositoryIndex": raw(
                fleet.repository_index,
                request_deserializer=service_pb2.RepositoryIndexRequest.FromString,
                response_serializer=service_pb2.RepositoryIndexResponse.SerializeToString,
            ),
        }
        return grpc.method_handlers_generic_handler(SERVICE, handlers)


def make_server(
    proxy: GatewayProxy, listen: str, limits: GrpcLimits
) -> tuple[grpc.aio.Server, int]:
    """A ``grpc.aio`` server serving ``proxy`` on ``listen`` (host:port; port 0 = any free).

    ``SO_REUSEPORT`` is off (gRPC turns it on by default on Linux): with it, a second gateway
    on a taken port would bind too and the kernel would split clients between the two.

    Returns:
        The server (not started) and the port it is bound to.

    Raises:
        UnavailableError: ``listen`` cannot be bound (in use, or not an address of this host).
    """
    server = grpc.aio.server(
        options=[*channel_options(limits), ("grpc.so_reuseport", 0)],
        interceptors=[ErrorInterceptor()],
    )
    server.add_generic_rpc_handlers((proxy.handler(),))
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError as exc:  # grpcio >= 1.5x raises where older versions returned 0
        raise UnavailableError(f"gateway: cannot listen on {listen}: {exc}") from None
    if port == 0:
        raise UnavailableError(f"gateway: cannot listen on {listen}")
    return server, port


__all__ = [
    "MAX_RESENDS_AFTER_UNAVAILABLE",
    "RECONNECT_OPTIONS",
    "SERVICE",
    "TIMEOUT_PARAMETER",
    "GatewayProxy",
    "SingleFlight",
    "Upstreams",
    "budget_spent",
    "channel_options",
    "discover_table",
    "make_server",
    "poll_counters",
    "probe_ready",
]
