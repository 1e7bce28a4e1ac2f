"""The gateway's RPCs other than inference: answered from the workers, not by one replica.

``ServerLive`` is the gateway's own; ``ServerReady`` true when any worker is ready;
``RepositoryIndex`` merged; ``ModelStatistics`` summed (:mod:`hloserve.gateway.aggregate`);
system and CUDA shared-memory registration fanned out and rolled back on partial failure;
``ServerMetadata`` and ``...Status`` from the first answering worker; ``ModelReady``,
``ModelMetadata`` and ``ModelConfig`` forwarded to a replica of the model;
``RepositoryModelLoad`` and ``RepositoryModelUnload`` sent where
:class:`hloserve.gateway.model_control.ModelControl` decides (docs/gateway.md, "Model
control").
Errors are raised and answered by :class:`hloserve.gateway.interceptor.ErrorInterceptor`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from hloserve.errors import HloserveError, UnavailableError
from hloserve.gateway.aggregate import merge_model_statistics, merge_repository_index
from hloserve.gateway.interceptor import relayed
from hloserve.gateway.model_control import Action, ModelControl
from hloserve.gateway.routing import Router
from hloserve.gateway.upstreams import Upstreams
from hloserve.gateway.wire import peek_infer_request

#: Prefix of the gRPC metadata that carries a key of tritonserver's restricted protocols
#: (``--grpc-restricted-protocol=<protocols>:<header>=<key>``: the client sends
#: ``triton-grpc-protocol-<header>``; Triton's docs, "Limit Endpoint Access"). Model control
#: passes it from the client to the workers, so the workers' own check decides.
RESTRICTED_METADATA_PREFIX = "triton-grpc-protocol-"


#: Register and unregister request messages of each shared-memory kind (the RPCs are
#: ``<kind>SharedMemoryRegister``, ``...Unregister``, ``...Status``).
_SHM_MESSAGES: dict[str, tuple[Any, Any]] = {
    "System": (
        service_pb2.SystemSharedMemoryRegisterRequest,
        service_pb2.SystemSharedMemoryUnregisterRequest,
    ),
    "Cuda": (
        service_pb2.CudaSharedMemoryRegisterRequest,
        service_pb2.CudaSharedMemoryUnregisterRequest,
    ),
}


def restricted_metadata(context: grpc.aio.ServicerContext) -> tuple[tuple[str, str], ...]:
    """The client's restricted-protocol keys (``RESTRICTED_METADATA_PREFIX``), to pass on."""
    return tuple(
        (str(k), str(v))
        for k, v in (context.invocation_metadata() or ())
        if str(k).startswith(RESTRICTED_METADATA_PREFIX)
    )


class FleetRpcs:
    """Handlers of the non-inference RPCs of ``inference.GRPCInferenceService``.

    Args:
        router: the routing table (replicas of a model for the forwarded RPCs).
        upstreams: channels to the workers.
        request_timeout_s: deadline of one forwarded call, seconds.
        probe_timeout_s: deadline of one ServerReady / RepositoryIndex probe, seconds.
        control: where model loads and unloads go (shared with the KServe HTTP server).
    """

    def __init__(
        self,
        router: Router,
        upstreams: Upstreams,
        request_timeout_s: float,
        probe_timeout_s: float,
        control: ModelControl,
    ) -> None:
        self._control = control
        self._router = router
        self._upstreams = upstreams
        self._timeout = request_timeout_s
        self._probe_timeout = probe_timeout_s

    async def forward_to_model(
        self, method: str, request: bytes, context: grpc.aio.ServicerContext
    ) -> bytes:
        name = peek_infer_request(request).model_name  # field 1 is the name in all three
        route = self._router.table.get(name)
        order = route.replicas if route is not None and route.replicas else self._upstreams.workers
        last: grpc.aio.AioRpcError | None = None
        for worker in order:
            try:
                return await self._upstreams.raw(worker, method)(request, timeout=self._timeout)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise relayed(exc) from None
                last = exc
        details = last.details() if last is not None else ""
        raise UnavailableError(f"{method} {name!r}: {details}")

    async def server_live(
        self, request: service_pb2.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ServerLiveResponse:
        """The gateway process is live."""
        return service_pb2.ServerLiveResponse(live=True)

    async def server_ready(
        self, request: service_pb2.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ServerReadyResponse:
        """Ready when at least one worker answers ready."""
        raw = request.SerializeToString()

        async def probe(worker: str) -> bool:
            try:
                reply = await self._upstreams.raw(worker, "ServerReady")(
                    raw, timeout=self._probe_timeout
                )
            except grpc.aio.AioRpcError:
                return False
            return bool(service_pb2.ServerReadyResponse.FromString(reply).ready)

        answers = await asyncio.gather(*(probe(w) for w in self._upstreams.workers))
        return service_pb2.ServerReadyResponse(ready=any(answers))

    async def repository_index(
        self, request: service_pb2.RepositoryIndexRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.RepositoryIndexResponse:
        """Every worker's index merged by (name, version); READY wins over other states."""
        raw = request.SerializeToString()

        async def index(worker: str) -> bytes | None:
            try:
                return await self._upstreams.raw(worker, "RepositoryIndex")(
                    raw, timeout=self._probe_timeout, metadata=self._upstreams.repository_metadata
                )
            except grpc.aio.AioRpcError:
                return None

        replies = await asyncio.gather(*(index(w) for w in self._upstreams.workers))
        indexes = (
            service_pb2.RepositoryIndexResponse.FromString(r).models
            for r in replies
            if r is not None
        )
        merged = merge_repository_index(
            indexes,
            key=lambda model: (model.name, model.version),
            state=lambda model: str(model.state),
        )
        return service_pb2.RepositoryIndexResponse(models=merged)

    async def _fan_out(
        self,
        method: str,
        request: bytes,
        workers: Sequence[str] | None = None,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> list[tuple[str, bytes | grpc.aio.AioRpcError]]:
        """Send ``request`` to ``workers`` (default every worker); (worker, reply bytes or the
        error) per worker."""

        async def one(worker: str) -> tuple[str, bytes | grpc.aio.AioRpcError]:
            try:
                reply = await self._upstreams.raw(worker, method)(
                    request, timeout=self._timeout, metadata=tuple(metadata) or None
                )
                return worker, reply
            except grpc.aio.AioRpcError as exc:
                return worker, exc

        targets = self._upstreams.workers if workers is None else workers
        return list(await asyncio.gather(*(one(w) for w in targets)))

    async def _model_control(
        self, action: Action, model: str, request: bytes, context: grpc.aio.ServicerContext
    ) -> bytes:
        method = "RepositoryModelLoad" if action == "load" else "RepositoryModelUnload"
        key = restricted_metadata(context)

        async def send(
            how: Action, name: str, workers: Sequence[str]
        ) -> list[tuple[str, bytes | grpc.aio.AioRpcError]]:
            if how == action and name == model:  # the client's own request
                return await self._fan_out(method, request, workers, key)
            plain = (
                service_pb2.RepositoryModelLoadRequest(model_name=name)
                if how == "load"
                else service_pb2.RepositoryModelUnloadRequest(model_name=name)
            )
            rpc = "RepositoryModelLoad" if how == "load" else "RepositoryModelUnload"
            return await self._fan_out(rpc, plain.SerializeToString(), workers, key)

        outcome = await self._control.run(action, model, send, lambda r: isinstance(r, bytes))
        errors = [r for _, r in outcome.answers if not isinstance(r, bytes)]
        if errors:
            raise self._first_error(errors, f"{method} {model!r}")
        replies = [r for _, r in outcome.answers if isinstance(r, bytes)]
        if not replies:
            raise UnavailableError(f"{method} {model!r}: no worker")
        return replies[0]

    async def repository_model_load(
        self, request: bytes, context: grpc.aio.ServicerContext
    ) -> bytes:
        """Load (or reload) a model where :class:`~hloserve.gateway.model_control.ModelControl`
        decides: the workers that hold it; when none does, where the placement mode puts it
        (a meta with its callees, loaded first). The workers check the client's
        restricted-API key. The routing table is rediscovered before the answer, so the next
        inference request finds the model.

        Raises:
            UpstreamError: a worker refused (its code and message, e.g. no such model in its
                repository, or the key missing).
        """
        name = service_pb2.RepositoryModelLoadRequest.FromString(request).model_name
        return await self._model_control("load", name, request, context)

    async def repository_model_unload(
        self, request: bytes, context: grpc.aio.ServicerContext
    ) -> bytes:
        """Unload a model from every worker that holds it (every worker when none lists it);
        the routing table is rediscovered before the answer (NOT_FOUND afterwards).

        Raises:
            UpstreamError: a worker refused (its code and message).
        """
        name = service_pb2.RepositoryModelUnloadRequest.FromString(request).model_name
        return await self._model_control("unload", name, request, context)

    @staticmethod
    def _first_error(errors: list[grpc.aio.AioRpcError], what: str) -> HloserveError:
        """The first worker's error, relayed with its code (UNAVAILABLE when no worker)."""
        if not errors:
            return UnavailableError(f"{what}: no worker")
        return relayed(errors[0], f"{what}: ")

    async def model_statistics(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Every worker's statistics summed per (name, version) (aggregate.py).

        Workers answering with an error (e.g. NOT_FOUND: the model is not on that worker) are
        left out; when every worker fails, the first error is returned.
        """
        answers = await self._fan_out("ModelStatistics", request)
        replies = [r for _, r in answers if isinstance(r, bytes)]
        if not replies:
            errors = [r for _, r in answers if not isinstance(r, bytes)]
            raise self._first_error(errors, "ModelStatistics")
        merged = merge_model_statistics(
            service_pb2.ModelStatisticsResponse.FromString(r) for r in replies
        )
        return bytes(merged.SerializeToString())

    async def _shm_register(self, kind: str, request: bytes) -> bytes:
        """Register a shared-memory region (``kind``: ``System`` or ``Cuda``) on every worker,
        or on none: when a worker refuses, the region is unregistered from the workers that
        accepted it and the refusal is returned."""
        register, unregister = _SHM_MESSAGES[kind]
        answers = await self._fan_out(f"{kind}SharedMemoryRegister", request)
        errors = [r for _, r in answers if not isinstance(r, bytes)]
        if errors:
            undo = unregister(name=register.FromString(request).name).SerializeToString()
            for worker, reply in answers:
                if isinstance(reply, bytes):
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await self._upstreams.raw(worker, f"{kind}SharedMemoryUnregister")(
                            undo, timeout=self._probe_timeout
                        )
            raise self._first_error(errors, f"{kind}SharedMemoryRegister")
        return next(r for _, r in answers if isinstance(r, bytes))

    async def _shm_unregister(self, kind: str, request: bytes) -> bytes:
        """Unregister on every worker; succeeds when any worker succeeds."""
        answers = await self._fan_out(f"{kind}SharedMemoryUnregister", request)
        replies = [r for _, r in answers if isinstance(r, bytes)]
        if not replies:
            errors = [r for _, r in answers if not isinstance(r, bytes)]
            raise self._first_error(errors, f"{kind}SharedMemoryUnregister")
        return replies[0]

    def shm_handlers(self) -> dict[str, Callable[[bytes, Any], Awaitable[bytes]]]:
        """Raw handlers of the system and CUDA shared-memory RPCs, by method name: register
        on every worker or none (rolled back), unregister succeeding when any worker does,
        status from the first worker (registrations are the same on every worker). A CUDA
        region is registered on every worker too: each one must open the client's IPC
        handle on ``device_id``, or the registration fails whole."""

        def bind(
            how: Callable[[str, bytes], Awaitable[bytes]], kind: str
        ) -> Callable[[bytes, Any], Awaitable[bytes]]:
            async def handler(request: bytes, context: Any) -> bytes:
                return await how(kind, request)

            return handler

        async def status(kind: str, request: bytes) -> bytes:
            return await self._first_worker(f"{kind}SharedMemoryStatus", request)

        handlers = {}
        for kind in _SHM_MESSAGES:
            handlers[f"{kind}SharedMemoryRegister"] = bind(self._shm_register, kind)
            handlers[f"{kind}SharedMemoryUnregister"] = bind(self._shm_unregister, kind)
            handlers[f"{kind}SharedMemoryStatus"] = bind(status, kind)
        return handlers

    async def _first_worker(self, method: str, request: bytes) -> bytes:
        """The first worker's answer; UNAVAILABLE moves on to the next worker."""
        errors = []
        for worker in self._upstreams.workers:
            try:
                reply: bytes = await self._upstreams.raw(worker, method)(
                    request, timeout=self._timeout
                )
                return reply
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise relayed(exc) from None
                errors.append(exc)
        raise self._first_error(errors, method)

    async def server_metadata(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """The first answering worker's name, version and extensions (every worker runs the
        same tritonserver; perf_analyzer asks for it before it starts)."""
        return await self._first_worker("ServerMetadata", request)
