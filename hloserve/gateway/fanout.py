"""The gateway's RPCs other than inference, answered from the workers by :mod:`~.fleet_ops`'
rules (docs/gateway.md, "Proxy"); model loads and unloads go where :class:`ModelControl` decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TypeAlias

import grpc
from tritonclient.grpc import service_pb2

from hloserve.errors import HloserveError, UnavailableError
from hloserve.gateway import fleet_ops
from hloserve.gateway.aggregate import merge_model_statistics, merge_repository_index
from hloserve.gateway.interceptor import relayed
from hloserve.gateway.model_control import Action, ModelControl
from hloserve.gateway.routing import Router
from hloserve.gateway.upstreams import Upstreams
from hloserve.gateway.wire import peek_infer_request

#: Prefix of the gRPC metadata carrying a key of tritonserver's restricted protocols (Triton's
#: docs, "Limit Endpoint Access"); model control passes it on (the gateway's own if none).
RESTRICTED_METADATA_PREFIX = "triton-grpc-protocol-"

#: A worker call: (method, request bytes, gRPC metadata).
_Call: TypeAlias = tuple[str, bytes, tuple[tuple[str, str], ...]]
#: A worker's reply bytes, or its error.
_Reply: TypeAlias = bytes | grpc.aio.AioRpcError


class _GrpcJudge:
    def ok(self, reply: _Reply) -> bool:
        return isinstance(reply, bytes)

    def unavailable(self, reply: _Reply) -> bool:
        return isinstance(reply, grpc.aio.AioRpcError) and (
            reply.code() == grpc.StatusCode.UNAVAILABLE
        )

    def reason(self, text: str) -> _Reply:
        return grpc.aio.AioRpcError(
            grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), text
        )

    def failed(self, what: str, replies: fleet_ops.Replies[_Reply]) -> NoReturn:
        """Raise the first worker's error with its code (UNAVAILABLE: no worker)."""
        for _, reply in replies:
            if isinstance(reply, grpc.aio.AioRpcError):
                raise relayed(reply, f"{what}: ") from None
        raise UnavailableError(f"{what}: no worker")


_JUDGE = _GrpcJudge()


@dataclass(eq=False)
class FleetRpcs:
    """Handlers of the non-inference RPCs of ``inference.GRPCInferenceService``; timeouts in
    seconds (``probe_timeout_s``: ServerReady and RepositoryIndex).
    """

    router: Router
    upstreams: Upstreams
    request_timeout_s: float
    probe_timeout_s: float
    control: ModelControl

    async def forward_to_model(
        self, method: str, request: bytes, context: grpc.aio.ServicerContext
    ) -> bytes:
        """``ModelReady``, ``ModelMetadata`` or ``ModelConfig`` from the first replica answering."""
        name = peek_infer_request(request).model_name  # field 1 is the name in all three
        route = self.router.table.get(name)
        order = route.replicas if route is not None and route.replicas else self.upstreams.workers
        return await self._run(
            fleet_ops.first_answer(_JUDGE, f"{method} {name!r}", (method, request, ()), order)
        )

    async def server_live(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """The gateway process is live."""
        return bytes(service_pb2.ServerLiveResponse(live=True).SerializeToString())

    async def server_ready(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Ready when at least one worker answers ready."""
        replies = await self._fan_out(fleet_ops.Send(("ServerReady", request, ()), probe=True))
        ready = any(
            isinstance(r, bytes) and service_pb2.ServerReadyResponse.FromString(r).ready
            for _, r in replies
        )
        return bytes(service_pb2.ServerReadyResponse(ready=ready).SerializeToString())

    async def repository_index(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Every worker's index merged (READY wins); empty when no worker answers."""

        def merge(indexes: list[service_pb2.RepositoryIndexResponse]) -> bytes:
            rows = merge_repository_index(
                (i.models for i in indexes),
                key=lambda model: (model.name, model.version),
                state=lambda model: str(model.state),
            )
            return bytes(service_pb2.RepositoryIndexResponse(models=rows).SerializeToString())

        call = ("RepositoryIndex", request, self.upstreams.repository_metadata)
        parse = service_pb2.RepositoryIndexResponse.FromString
        with contextlib.suppress(HloserveError):
            return await self._run(
                fleet_ops.merged(_JUDGE, "RepositoryIndex", call, parse, merge, probe=True)
            )
        return b""  # an empty RepositoryIndexResponse

    async def _fan_out(self, step: fleet_ops.Send[_Call]) -> fleet_ops.Replies[_Reply]:
        method, request, metadata = step.request
        timeout = self.probe_timeout_s if step.probe else self.request_timeout_s

        async def one(worker: str) -> tuple[str, _Reply]:
            try:
                call = self.upstreams.raw(worker, method)
                return worker, await call(request, timeout=timeout, metadata=metadata or None)
            except grpc.aio.AioRpcError as exc:
                return worker, exc

        targets = self.upstreams.workers if step.workers is None else step.workers
        return list(await asyncio.gather(*(one(w) for w in targets)))

    async def _run(self, plan: fleet_ops.Plan[_Call, _Reply]) -> bytes:
        reply = await fleet_ops.drive_async(plan, self._fan_out)
        if isinstance(reply, grpc.aio.AioRpcError):
            raise relayed(reply) from None
        return reply

    async def _model_control(
        self,
        action: Action,
        model: str,
        request: bytes,
        context: grpc.aio.ServicerContext,
        parameters: Sequence[str] = (),
    ) -> bytes:
        # the caller passed AuthInterceptor: its own key, else the gateway's
        sent = context.invocation_metadata() or ()
        own = tuple(
            (str(k), str(v)) for k, v in sent if str(k).startswith(RESTRICTED_METADATA_PREFIX)
        )
        key = own or tuple(self.upstreams.repository_metadata or ())

        async def send(how: Action, name: str, workers: Sequence[str]) -> list[tuple[str, _Reply]]:
            rpc = "RepositoryModelLoad" if how == "load" else "RepositoryModelUnload"
            body = request  # the client's own; a callee or a moved meta's undo: a plain one
            if how != action or name != model:
                body = getattr(service_pb2, f"{rpc}Request")(model_name=name).SerializeToString()
            return await self._fan_out(fleet_ops.Send((rpc, body, key), workers))

        outcome = await self.control.run(action, model, send, _JUDGE.ok, parameters)
        method = "RepositoryModelLoad" if action == "load" else "RepositoryModelUnload"
        reply = fleet_ops.decided(_JUDGE, f"{method} {model!r}", outcome.answers)
        assert isinstance(reply, bytes)  # a refusal was raised
        return reply

    async def repository_model_load(
        self, request: bytes, context: grpc.aio.ServicerContext
    ) -> bytes:
        """Load a model where :class:`ModelControl` decides.

        Raises:
            UpstreamError: a worker refused (its code and message).
            HloserveError: a bad ``file:`` override (INTERNAL; sent to no worker).
        """
        load = service_pb2.RepositoryModelLoadRequest.FromString(request)
        parameters = list(load.parameters.keys())
        return await self._model_control("load", load.model_name, request, context, parameters)

    async def repository_model_unload(
        self, request: bytes, context: grpc.aio.ServicerContext
    ) -> bytes:
        """Unload a model from the workers holding it (every worker when none does).

        Raises:
            UpstreamError: a worker refused (its code and message).
        """
        name = service_pb2.RepositoryModelUnloadRequest.FromString(request).model_name
        return await self._model_control("unload", name, request, context)

    async def model_statistics(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Every worker's statistics summed per (name, version); the first error when all fail."""

        def merge(replies: list[service_pb2.ModelStatisticsResponse]) -> bytes:
            return bytes(merge_model_statistics(replies).SerializeToString())

        call = ("ModelStatistics", request, ())
        parse = service_pb2.ModelStatisticsResponse.FromString
        return await self._run(fleet_ops.merged(_JUDGE, "ModelStatistics", call, parse, merge))

    def shm_handlers(self) -> dict[str, Callable[[bytes, Any], Awaitable[bytes]]]:
        """Raw handlers of the system and CUDA shared-memory RPCs by method name."""

        def bind(kind: str, how: str) -> Callable[[bytes, Any], Awaitable[bytes]]:
            method = f"{kind}SharedMemory{how}"

            def plan(request: bytes) -> fleet_ops.Plan[_Call, _Reply]:
                call = (method, request, ())
                if how == "Register":
                    name = getattr(service_pb2, f"{method}Request").FromString(request).name
                    undo_method = f"{kind}SharedMemoryUnregister"
                    undo = getattr(service_pb2, f"{undo_method}Request")(name=name)
                    undo_call = (undo_method, undo.SerializeToString(), ())
                    return fleet_ops.register(_JUDGE, method, call, undo_call)
                if how == "Unregister":
                    return fleet_ops.unregister(_JUDGE, method, call)
                return fleet_ops.first_answer(_JUDGE, method, call, self.upstreams.workers)

            async def handler(request: bytes, context: Any) -> bytes:
                return await self._run(plan(request))

            return handler

        return {
            f"{kind}SharedMemory{how}": bind(kind, how)
            for kind in ("System", "Cuda")
            for how in ("Register", "Unregister", "Status")
        }

    async def server_metadata(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """The first answering worker's name, version and extensions."""
        call = ("ServerMetadata", request, ())
        workers = self.upstreams.workers
        return await self._run(fleet_ops.first_answer(_JUDGE, "ServerMetadata", call, workers))

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        """The gRPC method handlers of these RPCs, by method name."""
        raw = grpc.unary_unary_rpc_method_handler
        by_model = ("ModelReady", "ModelMetadata", "ModelConfig")
        return {
            **{m: raw(functools.partial(self.forward_to_model, m)) for m in by_model},
            "ModelStatistics": raw(self.model_statistics),
            **{method: raw(handler) for method, handler in self.shm_handlers().items()},
            "RepositoryModelLoad": raw(self.repository_model_load),
            "RepositoryModelUnload": raw(self.repository_model_unload),
            "ServerMetadata": raw(self.server_metadata),
            "ServerLive": raw(self.server_live),
            "ServerReady": raw(self.server_ready),
            "RepositoryIndex": raw(self.repository_index),
        }
