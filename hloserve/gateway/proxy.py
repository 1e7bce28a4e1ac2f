"""The gateway's Python servicer: ``inference.GRPCInferenceService`` behind HAProxy.

It does only what HAProxy cannot (docs/gateway.md, "Proxy"): ``ModelInfer`` HAProxy's map did
not route, ``ModelStreamInfer`` (:mod:`~.streams`) and the fleet RPCs (:mod:`~.fanout`).
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
    """Handlers of the gateway's ``inference.GRPCInferenceService``; ``refresh`` runs a discovery
    pass for a model not in the table, ``place`` is :class:`ModelControl`'s.
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
        """Send checked ModelInfer requests to ``data_plane`` after ``routable(model)`` returned."""
        self._data_plane = data_plane
        self._routable = routable

    async def model_infer(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Answer a ModelInfer HAProxy's map did not route, through its checked bind.

        Raises:
            NotFoundError: no worker lists the model or has a version loaded (Triton's texts).
            UnavailableError: no replica reachable, a name HAProxy cannot route, or no HAProxy.
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
        """Relay a ``ModelStreamInfer`` stream (:class:`~.streams.StreamRelay`)."""
        relay = StreamRelay(self._router, self._upstreams, self._check, self._turn)
        async for reply in relay.run(requests):
            yield reply

    async def _check(self, head: InferHead) -> None:
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
    """A ``grpc.aio`` server (not started, no ``SO_REUSEPORT``) serving ``proxy`` on ``listen``,
    and its port; with ``auth``, control calls need a credential.

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
