"""``ModelStreamInfer`` through the gateway: every message routed by its own model name, as
tritonserver serves one stream (docs/gateway.md, "Data plane").
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from tritonclient.grpc import service_pb2

from hloserve.errors import HloserveError, UnavailableError
from hloserve.gateway.interceptor import relayed
from hloserve.gateway.routing import Router
from hloserve.gateway.upstreams import Upstreams
from hloserve.gateway.wire import InferHead, peek_infer_request

#: Messages held at once per upstream stream, and answers held for the client.
QUEUE_MESSAGES = 64

#: The end of a queue (the client half-closed, or every upstream stream ended).
_END = None


def error_answer(message: str, request_id: str) -> bytes:
    """A ``ModelStreamInferResponse`` with ``error_message`` and ``infer_response.id`` only."""
    response = service_pb2.ModelStreamInferResponse(error_message=message)
    response.infer_response.id = request_id
    return response.SerializeToString()


class StreamRelay:
    """Relays one client ``ModelStreamInfer`` stream to the workers, message by message;
    ``check`` raises for a head no model can run, ``turn`` rotates replicas across streams.
    """

    def __init__(
        self,
        router: Router,
        upstreams: Upstreams,
        check: Callable[[InferHead], Awaitable[None]],
        turn: itertools.count[int],
    ) -> None:
        self._router = router
        self._upstreams = upstreams
        self._check = check
        self._turn = turn
        self._worker_of: dict[str, str] = {}  # model -> worker, for this stream
        self._sends: dict[str, asyncio.Queue[bytes | None]] = {}  # worker -> its messages
        self._relays: list[asyncio.Task[None]] = []
        self._answers: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(QUEUE_MESSAGES)

    async def run(self, requests: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The serialized answers of the stream ``requests``, in completion order.

        Raises:
            UpstreamError: an upstream stream ended with an error (its code and message).
        """
        reader = asyncio.create_task(self._read(requests))
        try:
            while (answer := await self._answers.get()) is not _END:
                if isinstance(answer, BaseException):
                    raise answer
                yield answer
            await reader  # the client's read error, if any
        finally:
            for task in (reader, *self._relays):
                task.cancel()
            await asyncio.gather(reader, *self._relays, return_exceptions=True)

    async def _read(self, requests: AsyncIterator[bytes]) -> None:
        try:
            async for request in requests:
                await self._route(request)
        except Exception as exc:  # handed to run(), which raises it
            await self._answers.put(exc)
            return
        finally:
            for queue in self._sends.values():
                await queue.put(_END)
        await asyncio.gather(*self._relays, return_exceptions=True)
        await self._answers.put(_END)

    async def _route(self, request: bytes) -> None:
        head = None
        try:
            head = peek_infer_request(request)
            await self._check(head)
        except HloserveError as exc:  # malformed, or shapes no model can run
            await self._answers.put(error_answer(exc.message, head.request_id if head else ""))
            return
        worker = self._worker_of.get(head.model_name)
        if worker is None:
            route = self._router.table.get(head.model_name)
            if route is None or not route.replicas:
                error = self._router.table.no_route_error(head.model_name)
                await self._answers.put(error_answer(error.message, head.request_id))
                return
            worker = route.replicas[next(self._turn) % len(route.replicas)]
            self._worker_of[head.model_name] = worker
        queue = self._sends.get(worker)
        if queue is None:
            queue = self._sends[worker] = asyncio.Queue(QUEUE_MESSAGES)
            self._relays.append(asyncio.create_task(self._relay(worker, queue)))
        await queue.put(request)

    async def _relay(self, worker: str, queue: asyncio.Queue[bytes | None]) -> None:
        ended = asyncio.Event()  # the client half-closed

        async def messages() -> AsyncIterator[bytes]:
            while (message := await queue.get()) is not _END:
                yield message
            ended.set()

        call = self._upstreams.raw_stream(worker, "ModelStreamInfer")(messages())
        try:
            async for answer in call:
                await self._answers.put(answer)
        except grpc.aio.AioRpcError as exc:
            await self._answers.put(relayed(exc))
            return
        if not ended.is_set():  # its later messages would wait forever
            await self._answers.put(
                UnavailableError(f"worker {worker} ended the stream while the client still sent")
            )
