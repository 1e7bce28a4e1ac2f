"""The gateway's Python servicer: ``inference.GRPCInferenceService`` behind HAProxy.

It does only what HAProxy cannot (docs/gateway.md, "Proxy"): ``ModelInfer`` of a name
HAProxy's map lacks or with a BYTES first input (Triton's NOT_FOUND or UNAVAILABLE, or the
shapes checked and the bytes sent back to HAProxy's checked bind), every ``ModelStreamInfer``
(:class:`hloserve.gateway.streams.StreamRelay`), and the fleet RPCs of
:class:`hloserve.gateway.fanout.FleetRpcs`. Errors are raised as
:class:`hloserve.errors.HloserveError` and answered by
:class:`hloserve.gateway.interceptor.ErrorInterceptor`.
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

    ``refresh`` runs when a request names a model not in the table (a discovery pass);
    ``place``: where a model no worker holds is loaded (:attr:`model_control`, shared with the
    KServe HTTP server).
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
        """Send checked ModelInfer requests to ``data_plane`` (one channel to HAProxy's checked
        bind), after ``routable(model)`` returned.
        """
        self._data_plane = data_plane
        self._routable = routable

    async def model_infer(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Answer a ModelInfer HAProxy's map did not route (module docstring).

        Raises:
            NotFoundError: no worker lists the model, or none has a version loaded (Triton's texts).
            UnavailableError: a replica unreachable (each worker's reason), a name HAProxy cannot
                route, or HAProxy unreachable.
            InvalidArgumentError: malformed, or shapes no model can run.
        """
        head = peek_infer_request(request)
        await self._check(head)
        model = head.model_name
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
        """Relay a ``ModelStreamInfer`` stream (:class:`hloserve.gateway.streams.StreamRelay`)."""
        relay = StreamRelay(self._router, self._upstreams, self._check, self._turn)
        async for reply in relay.run(requests):
            yield reply

    async def _check(self, head: InferHead) -> None:
        """Check a request's shapes against its model's route (after a discovery pass when unknown).

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
    """A ``grpc.aio`` server (not started) serving ``proxy`` on ``listen``, and its port.

    ``SO_REUSEPORT`` is off, so a second gateway on a taken port fails to bind. With ``auth``,
    control calls need a credential (:class:`hloserve.gateway.auth.AuthInterceptor`).

    Raises:
        UnavailableError: ``listen`` cannot be bound.
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
