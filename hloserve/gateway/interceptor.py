"""The gateway's one error-to-status path: a ``grpc.aio`` server interceptor.

Servicers raise :class:`~hloserve.errors.HloserveError` (a relayed ``UpstreamError`` keeps the
worker's code); any other exception is INTERNAL naming its type, traceback logged.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from hloserve.errors import GRPC_CODE, HloserveError, Status, UpstreamError

log = logging.getLogger("hloserve.gateway")

_BY_VALUE: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


def grpc_code(status: Status) -> grpc.StatusCode:
    """The ``grpc.StatusCode`` of ``status`` (:data:`hloserve.errors.GRPC_CODE`)."""
    return _BY_VALUE[GRPC_CODE[status]]


def relayed(exc: grpc.aio.AioRpcError, prefix: str = "") -> UpstreamError:
    """A worker's error as an :class:`UpstreamError` with its code and ``prefix`` + its text."""
    return UpstreamError(f"{prefix}{exc.details() or ''}", exc.code().name)


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status and message answering ``exc`` (module docstring); logs a bug's traceback."""
    if isinstance(exc, HloserveError):
        return grpc_code(exc.status), exc.message
    log.error("internal error in a gateway RPC", exc_info=exc)
    return grpc_code(Status.INTERNAL), f"internal error: {type(exc).__name__}: {exc}"


def _unary_response(behavior: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behavior(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await context.abort(*status_of(exc))

    return call


def _stream_response(behavior: Callable[..., Any]) -> Callable[..., AsyncIterator[Any]]:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            async for reply in behavior(request, context):
                yield reply
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await context.abort(*status_of(exc))

    return call


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Answers every exception a gateway RPC raises with its status (handlers wrapped once)."""

    def __init__(self) -> None:
        self._wrapped: dict[int, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """The method's handler, wrapped."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        known = self._wrapped.get(id(handler))
        if known is not None and known[0] is handler:
            return known[1]
        wrapped = _wrap(handler)
        self._wrapped[id(handler)] = (handler, wrapped)
        return wrapped


def _wrap(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    serdes = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_unary_response(handler.unary_unary), **serdes)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(_unary_response(handler.stream_unary), **serdes)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            _stream_response(handler.unary_stream), **serdes
        )
    return grpc.stream_stream_rpc_method_handler(_stream_response(handler.stream_stream), **serdes)
