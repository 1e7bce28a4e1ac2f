"""The gateway's Python servicer: ``inference.GRPCInferenceService`` behind HAProxy.

HAProxy is the only data plane for unary inference (:mod:`hloserve.gateway.dataplane`,
docs/gateway.md, "Data plane"): it carries every ModelInfer to the workers, with the
gateway's admission and failover rules. This ``grpc.aio`` servicer, on a loopback port behind
it, does only what HAProxy cannot:

- ``ModelInfer`` of a name HAProxy's map lacks (unknown, not ready anywhere, no healthy
  replica) or with a BYTES first input: a discovery pass when the model is unknown, then the
  answer NOT_FOUND or UNAVAILABLE with every worker's reason
  (:meth:`hloserve.gateway.routing.RoutingTable.no_route_error`), or, once the model is
  routable, the request's shapes checked (:func:`hloserve.gateway.wire.check_shapes`: 0 rows
  or more than ``max_batch_size`` is INVALID_ARGUMENT, never forwarded: a 0-row BYTES request
  crashed tritonserver's Python backend) and the bytes sent back to HAProxy's checked bind
  (``routable`` first makes sure HAProxy's map has the model), which routes them like any.
- ``ModelStreamInfer``: every stream (HAProxy routes none), each message to a worker serving
  its own model (:class:`hloserve.gateway.streams.StreamRelay`).

The other RPCs are answered from the workers by :class:`hloserve.gateway.fanout.FleetRpcs`;
this module registers them beside its own two (metadata, config and ready forwarded; the
repository index merged; statistics summed; shared memory fanned out; model load/unload by
:class:`hloserve.gateway.model_control.ModelControl`; ServerLive is the gateway's own,
ServerReady true when a worker is). Handlers raise :class:`hloserve.errors.HloserveError` (a
worker's error answer relayed as :class:`~hloserve.errors.UpstreamError` with its code); the
server's :class:`hloserve.gateway.interceptor.ErrorInterceptor` answers it with its status.

Message-size limits (:class:`hloserve.gateway.config.GrpcLimits`) are set on the server and
on every upstream channel: gRPC's default receive limit is 4 MiB
(``grpc.max_receive_message_length``) and Triton's limit is 2 GiB - 1 byte (``INT32_MAX``;
tritonclient's ``tritonclient.grpc.MAX_GRPC_MESSAGE_SIZE``), which the defaults match.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from hloserve.errors import UnavailableError
from hloserve.gateway.auth import AuthInterceptor, ControlAuth
from hloserve.gateway.config import GrpcLimits
from hloserve.gateway.dataplane import BACKEND_NAME, UNROUTABLE_NAME
from hloserve.gateway.fanout import FleetRpcs
from hloserve.gateway.interceptor import ErrorInterceptor, relayed
from hloserve.gateway.model_control import ModelControl, Place
from hloserve.gateway.routing import Router
from hloserve.gateway.streams import StreamRelay
from hloserve.gateway.upstreams import SERVICE, Upstreams, channel_options
from hloserve.gateway.wire import InferHead, check_shapes, peek_infer_request


class GatewayProxy:
    """Handlers of the gateway's ``inference.GRPCInferenceService``.

    Args:
        router: the routing table.
        upstreams: channels to the workers.
        request_timeout_s: deadline of one forwarded call, seconds.
        probe_timeout_s: deadline of one ServerReady / RepositoryIndex probe, seconds.
        refresh: called when a request names a model that is not in the table, e.g. a
            :class:`SingleFlight` over a discovery pass.
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
        refresh: Callable[[], Awaitable[None]] | None = None,
        place: Place | None = None,
    ) -> None:
        self._refresh = refresh
        self._router = router
        self._upstreams = upstreams
        self._timeout = request_timeout_s
        self._turn = itertools.count()
        self._data_plane: Upstreams | None = None
        self._routable: Callable[[str], Awaitable[None]] = _nothing
        self.model_control = ModelControl(router, upstreams, probe_timeout_s, refresh, place)
        self._fleet = FleetRpcs(
            router, upstreams, request_timeout_s, probe_timeout_s, self.model_control
        )

    def send_checked_to(
        self, data_plane: Upstreams, routable: Callable[[str], Awaitable[None]]
    ) -> None:
        """Send the ModelInfer requests this servicer checked to ``data_plane`` (one channel,
        to HAProxy's checked bind), after ``routable(model)`` returned (HAProxy's map then
        has the model)."""
        self._data_plane = data_plane
        self._routable = routable

    async def model_infer(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Answer a ModelInfer HAProxy's map did not route: Triton's error when the model
        has no replica, else its shapes checked and the bytes sent back to HAProxy's checked
        bind (module docstring).

        Raises:
            NotFoundError: no worker lists the model, or none has a version of it loaded
                (Triton's texts, :meth:`~hloserve.gateway.routing.RoutingTable.no_route_error`).
            UnavailableError: a replica unreachable (each worker's reason), a name HAProxy
                cannot route, or HAProxy unreachable.
            InvalidArgumentError: shapes no model can run.
        """
        model = (await self._checked_head(request)).model_name
        route = self._router.table.get(model)
        if route is None or not route.replicas:
            raise self._router.table.no_route_error(model)
        if not BACKEND_NAME.fullmatch(model):
            raise UnavailableError(UNROUTABLE_NAME.format(model=model))
        if self._data_plane is None:
            raise UnavailableError(f"model {model!r}: the gateway's data plane is not running")
        await self._routable(model)
        checked = self._data_plane.workers[0]
        left = context.time_remaining()  # the client's gRPC deadline goes on to the worker
        try:
            reply: bytes = await self._data_plane.raw(checked, "ModelInfer")(
                request, timeout=self._timeout if left is None else min(self._timeout, left)
            )
        except grpc.aio.AioRpcError as exc:
            raise relayed(exc) from None
        return reply

    async def model_stream_infer(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """Relay a ``ModelStreamInfer`` stream, each message to a worker serving its model
        and Triton's in-stream error for one that cannot be forwarded
        (:class:`hloserve.gateway.streams.StreamRelay`)."""
        relay = StreamRelay(self._router, self._upstreams, self._check, self._turn)
        async for reply in relay.run(requests):
            yield reply

    async def _checked_head(self, request: bytes) -> InferHead:
        """The request's head, after its shapes were checked (:meth:`_check`).

        Raises:
            InvalidArgumentError: malformed, or shapes no model can run.
        """
        head = peek_infer_request(request)
        await self._check(head)
        return head

    async def _check(self, head: InferHead) -> None:
        """Check a request's shapes against its model's route (a discovery pass first when
        the model is unknown; an unknown model's shapes are not checked).

        Raises:
            InvalidArgumentError: shapes no model can run.
        """
        route = self._router.table.get(head.model_name)
        if route is None and self._refresh is not None:
            await self._refresh()
            route = self._router.table.get(head.model_name)
        if route is not None:
            check_shapes(head, route.max_batch)

    def handler(self) -> grpc.GenericRpcHandler:
        """The generic handler to add to a ``grpc.aio`` server."""

        raw = grpc.unary_unary_rpc_method_handler
        handlers = {
            "ModelInfer": raw(self.model_infer),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(self.model_stream_infer),
            **self._fleet.handlers(),
        }
        return grpc.method_handlers_generic_handler(SERVICE, handlers)


def make_server(
    proxy: GatewayProxy, listen: str, limits: GrpcLimits, auth: ControlAuth | None = None
) -> tuple[grpc.aio.Server, int]:
    """A ``grpc.aio`` server serving ``proxy`` on ``listen`` (host:port; port 0 = any free).

    ``SO_REUSEPORT`` is off (gRPC turns it on by default on Linux): with it, a second gateway
    on a taken port would bind too and the kernel would split clients between the two.

    With ``auth``, control calls need a credential (:class:`hloserve.gateway.auth.AuthInterceptor`).

    Returns:
        The server (not started) and the port it is bound to.

    Raises:
        UnavailableError: ``listen`` cannot be bound (in use, or not an address of this host).
    """
    server = grpc.aio.server(
        options=[*channel_options(limits), ("grpc.so_reuseport", 0)],
        interceptors=[*([AuthInterceptor(auth)] if auth is not None else []), ErrorInterceptor()],
    )
    server.add_generic_rpc_handlers((proxy.handler(),))
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError as exc:  # grpcio >= 1.5x raises where older versions returned 0
        raise UnavailableError(f"gateway: cannot listen on {listen}: {exc}") from None
    if port == 0:
        raise UnavailableError(f"gateway: cannot listen on {listen}")
    return server, port


async def _nothing(model: str) -> None:
    """The default ``routable``: nothing to wait for."""


__all__ = ["GatewayProxy", "make_server"]
