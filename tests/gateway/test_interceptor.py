"""The gateway's one error-to-status path (hloserve/gateway/interceptor.py) on a real
``grpc.aio`` server on loopback: every exception a servicer raises is answered with the status
of hloserve.errors.GRPC_CODE, for unary and streaming RPCs alike."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from hloserve.errors import (
    GRPC_CODE,
    HTTP_STATUS,
    HloserveError,
    InvalidArgumentError,
    NotFoundError,
    Status,
    UpstreamError,
)
from hloserve.gateway.interceptor import ErrorInterceptor, grpc_code, relayed, status_of

SERVICE = "test.Errors"


def test_every_status_has_its_grpc_code_and_an_http_status() -> None:
    assert set(GRPC_CODE) == set(Status) == set(HTTP_STATUS)
    for status in Status:
        assert grpc_code(status).name == status.name
        assert grpc_code(status).value[0] == GRPC_CODE[status]


def test_an_upstream_error_keeps_the_workers_code() -> None:
    assert UpstreamError("gone", "ALREADY_EXISTS").status is Status.ALREADY_EXISTS
    assert UpstreamError("odd", "NO_SUCH_CODE").status is Status.INTERNAL
    assert status_of(UpstreamError("denied", "PERMISSION_DENIED")) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "denied",
    )


async def _raising(request: bytes, context: Any) -> bytes:
    kind = request.decode()
    if kind == "ok":
        return b"fine"
    if kind == "invalid":
        raise InvalidArgumentError("model 'm': input 'x': expected FP32, got INT8")
    if kind == "not_found":
        raise NotFoundError("model 'nope' is not found")
    if kind == "deadline":
        raise HloserveError("budget spent", status=Status.DEADLINE_EXCEEDED)
    if kind == "abort":  # a servicer that still aborts itself keeps its own status
        await context.abort(grpc.StatusCode.ALREADY_EXISTS, "aborted by hand")
    raise KeyError("a bug")


async def _streaming(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    async for request in requests:
        if request == b"bad":
            raise InvalidArgumentError("message 2: shape [-1] is negative")
        yield request


async def _upstream(request: bytes, context: Any) -> bytes:
    """Calls a worker that answers UNAUTHENTICATED and relays its error."""
    server = grpc.aio.server()

    async def refuse(request: bytes, context: Any) -> bytes:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "no key")
        return b""

    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "worker.W", {"Call": grpc.unary_unary_rpc_method_handler(refuse)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                return await channel.unary_unary("/worker.W/Call")(request, timeout=10)
            except grpc.aio.AioRpcError as exc:
                raise relayed(exc, "worker w0: ") from None
    finally:
        await server.stop(None)


async def _calls(body: Any) -> Any:
    server = grpc.aio.server(interceptors=[ErrorInterceptor()])
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(_raising),
        "Stream": grpc.stream_stream_rpc_method_handler(_streaming),
        "Upstream": grpc.unary_unary_rpc_method_handler(_upstream),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            return await body(channel)
    finally:
        await server.stop(None)


async def _unary(channel: grpc.aio.Channel, kind: str, method: str = "Unary") -> Any:
    try:
        return await channel.unary_unary(f"/{SERVICE}/{method}")(kind.encode(), timeout=10)
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details()


def test_unary_errors_get_the_status_of_the_table(caplog: pytest.LogCaptureFixture) -> None:
    async def body(channel: grpc.aio.Channel) -> list[Any]:
        kinds = ("ok", "invalid", "not_found", "deadline", "abort", "bug")
        return [await _unary(channel, k) for k in kinds] + [await _unary(channel, "x", "Upstream")]

    with caplog.at_level(logging.ERROR, logger="hloserve.gateway"):
        ok, invalid, not_found, deadline, abort, bug, upstream = asyncio.run(_calls(body))
    assert ok == b"fine"
    assert invalid == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "model 'm': input 'x': expected FP32, got INT8",
    )
    assert not_found == (grpc.StatusCode.NOT_FOUND, "model 'nope' is not found")
    assert deadline == (grpc.StatusCode.DEADLINE_EXCEEDED, "budget spent")
    assert abort == (grpc.StatusCode.ALREADY_EXISTS, "aborted by hand")
    assert bug == (grpc.StatusCode.INTERNAL, "internal error: KeyError: 'a bug'")
    assert upstream == (grpc.StatusCode.UNAUTHENTICATED, "worker w0: no key")
    logged = [r for r in caplog.records if r.exc_info is not None]
    assert len(logged) == 1 and logged[0].exc_info[0] is KeyError  # type: ignore[index]


def test_a_stream_ends_with_the_status_after_the_messages_before_it() -> None:
    async def body(channel: grpc.aio.Channel) -> tuple[list[bytes], Any]:
        async def requests() -> AsyncIterator[bytes]:
            for message in (b"one", b"two", b"bad", b"never"):
                yield message

        call = channel.stream_stream(f"/{SERVICE}/Stream")(requests(), timeout=10)
        replies: list[bytes] = []
        try:
            async for reply in call:
                replies.append(reply)
        except grpc.aio.AioRpcError as exc:
            return replies, (exc.code(), exc.details())
        return replies, None

    replies, error = asyncio.run(_calls(body))
    assert replies == [b"one", b"two"]
    assert error == (grpc.StatusCode.INVALID_ARGUMENT, "message 2: shape [-1] is negative")
