"""The gateway's Python servicer: ``inference.GRPCInferenceService`` over several workers.

With ``data_plane: haproxy`` (the default) HAProxy carries ModelInfer straight to the workers
(:mod:`hloserve.gateway.dataplane`, :mod:`hloserve.gateway.haproxy`) and this ``grpc.aio``
servicer, on a loopback port behind it, answers every other RPC and the ModelInfer calls
HAProxy's map does not route (unknown models, models with no ready replica, BYTES first
inputs); with ``data_plane: python`` it carries every RPC (docs/gateway.md, "Data plane" and
"Proxy"). Replica choice, in-flight accounting and failover order come from
:class:`hloserve.gateway.routing.Router`; this module only moves bytes.

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
- ``ServerLive``: the gateway's own liveness. ``ServerReady``: true when at least one worker
  answers ready.
- ``ModelReady``, ``ModelMetadata``, ``ModelConfig``: forwarded (raw bytes) to a replica of the
  model, with the same failover; to every worker in turn when the model is not in the table.
- ``RepositoryIndex``: every worker's index merged, one row per (name, version); READY wins.
- ``ModelStatistics``: every worker's statistics summed (:mod:`hloserve.gateway.aggregate`).
- ``SystemSharedMemoryRegister`` fans out to every worker and is rolled back on partial
  failure; ``...Unregister`` succeeds if any worker succeeds; ``...Status`` comes from the
  first worker (register and unregister as ReactantServer's gateway).
- ``ServerMetadata``: the first answering worker's (perf_analyzer needs it).
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
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from hloserve.errors import HloserveError, NotFoundError, UnavailableError
from hloserve.gateway.admin import GatewayMetrics
from hloserve.gateway.admission import Admission, Ticket
from hloserve.gateway.aggregate import merge_model_statistics
from hloserve.gateway.config import GrpcLimits
from hloserve.gateway.interceptor import ErrorInterceptor, relayed
from hloserve.gateway.packing import Counters
from hloserve.gateway.routing import ModelRoute, Router, RoutingTable
from hloserve.gateway.wire import InferHead, check_shapes, peek_infer_request
from hloserve.model_repository_tools.names import (
    BUNDLES_SEPARATOR,
    META_BACKEND,
    PARAM_META_CALLS,
)
from hloserve.triton_messages import api_restricted

log = logging.getLogger("hloserve.gateway")

SERVICE = "inference.GRPCInferenceService"

#: Upstream codes after which ModelInfer may try the next replica (as ReactantServer's gateway),
#: under the conditions of :meth:`GatewayProxy.model_infer`.
_FAILOVER_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND)

#: Re-sends of one ModelInfer request after a live worker answered UNAVAILABLE (re-sends
#: after a connect failure or a NOT_FOUND answer are not counted: the model did not run).
MAX_RESENDS_AFTER_UNAVAILABLE = 1


#: Reconnect backoff of the upstream channels, milliseconds. gRPC's default grows to 120 s, so
#: a worker restarted after a long outage would stay unreachable long after it is ready; with
#: these a down worker gets one connection attempt every 2 s at most.
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def _method(name: str) -> str:
    return f"/{SERVICE}/{name}"


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


def channel_options(limits: GrpcLimits) -> list[tuple[str, int]]:
    """gRPC options raising the message-size limits, for servers and channels alike."""
    return [
        ("grpc.max_receive_message_length", limits.max_recv_msg_bytes),
        ("grpc.max_send_message_length", limits.max_send_msg_bytes),
    ]


class Upstreams:
    """One ``grpc.aio`` channel per worker; calls carry raw bytes both ways.

    Args:
        workers: worker endpoints (host:port).
        limits: message-size limits of every channel.
        repository_metadata: gRPC metadata of every ``RepositoryIndex`` call: the workers'
            model-control key when their repository API is restricted
            (:func:`hloserve.node.model_control.grpc_metadata`).
    """

    def __init__(
        self,
        workers: Sequence[str],
        limits: GrpcLimits,
        repository_metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.workers = tuple(workers)
        self.repository_metadata = tuple(repository_metadata)
        options = channel_options(limits) + RECONNECT_OPTIONS
        self._channels = {w: grpc.aio.insecure_channel(w, options=options) for w in self.workers}
        self._unary: dict[tuple[str, str], grpc.aio.UnaryUnaryMultiCallable] = {}

    def raw(self, worker: str, method: str) -> grpc.aio.UnaryUnaryMultiCallable:
        """A callable sending bytes to ``method`` of ``worker`` and returning the reply bytes
        (made once per worker and method, then reused)."""
        key = (worker, method)
        call = self._unary.get(key)
        if call is None:
            call = self._unary[key] = self._channels[worker].unary_unary(_method(method))
        return call

    def raw_stream(self, worker: str, method: str) -> grpc.aio.StreamStreamMultiCallable:
        """A bidirectional-streaming callable carrying bytes both ways."""
        return self._channels[worker].stream_stream(_method(method))

    async def connect(self, worker: str, timeout_s: float) -> str | None:
        """Bring the channel to ``worker`` to READY before a request is sent on it.

        A call started on a channel that is not connected yet cannot tell a connect failure
        (nothing was sent) from a connection lost mid-request; connecting first separates
        the two (:meth:`GatewayProxy.model_infer`).

        Args:
            worker: the worker endpoint.
            timeout_s: longest wait for the connection, seconds.

        Returns:
            None when the channel is READY, else why not (the request was not sent).
        """
        channel = self._channels[worker]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        state = channel.get_state(try_to_connect=True)
        while state != grpc.ChannelConnectivity.READY:
            if state in (
                grpc.ChannelConnectivity.TRANSIENT_FAILURE,
                grpc.ChannelConnectivity.SHUTDOWN,
            ):
                return "connection failed"
            remaining = deadline - loop.time()
            if remaining <= 0:
                return f"no connection within {timeout_s:g} s"
            try:
                await asyncio.wait_for(channel.wait_for_state_change(state), remaining)
            except TimeoutError:
                return f"no connection within {timeout_s:g} s"
            state = channel.get_state(try_to_connect=True)
        return None

    async def alive(self, worker: str, timeout_s: float) -> bool:
        """Whether ``worker`` is still connected and answers ``ServerLive`` with live: true."""
        if self._channels[worker].get_state() != grpc.ChannelConnectivity.READY:
            return False
        request = service_pb2.ServerLiveRequest().SerializeToString()
        try:
            reply = await self.raw(worker, "ServerLive")(request, timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return False
        return bool(service_pb2.ServerLiveResponse.FromString(reply).live)

    async def close(self) -> None:
        """Close every channel."""
        await asyncio.gather(*(c.close() for c in self._channels.values()))


async def discover_table(
    upstreams: Upstreams, timeout_s: float, previous: RoutingTable | None = None
) -> RoutingTable:
    """Build a routing table from every worker's ready models (docs/gateway.md, "Proxy").

    Polls ``RepositoryIndex`` on each worker (every model with its state: READY ones are
    routed, the others noted with the worker's state and reason for the UNAVAILABLE a client
    gets, :meth:`RoutingTable.no_route_error`), then ``ModelConfig`` of each model on
    its first replica for ``max_batch_size`` (0 -> None) and, for a meta model, its
    ``hloserve.meta_calls``: a meta keeps only the replicas whose worker serves every model it
    calls (all of them when no worker does; a worker then answers NOT_FOUND naming the missing
    one). A worker whose index call fails keeps
    the models ``previous`` routed to it: whether it may be routed to is the health probes'
    decision (:mod:`hloserve.gateway.health`), and a model whose only worker is down stays
    known (UNAVAILABLE, not NOT_FOUND). Without ``previous`` such a worker is left out.
    Measured costs are not polled yet (``cost_per_item_seconds`` stays None).
    """
    request = service_pb2.RepositoryIndexRequest(ready=False).SerializeToString()

    async def index(worker: str) -> tuple[str, bytes | grpc.aio.AioRpcError]:
        try:
            reply = await upstreams.raw(worker, "RepositoryIndex")(
                request, timeout=timeout_s, metadata=upstreams.repository_metadata
            )
            return worker, reply
        except grpc.aio.AioRpcError as exc:
            # Logged when a worker stops answering; while it stays down, only at debug level.
            known_down = previous is not None and worker in previous.unreachable
            level = logging.DEBUG if known_down else logging.WARNING
            hint = ""
            if api_restricted(exc.details() or ""):
                hint = (
                    f" ({exc.details()}: set upstream.model_control_key to the worker's "
                    "HLOSERVE_MODEL_CONTROL_KEY)"
                )
            log.log(level, "worker %s: RepositoryIndex failed: %s%s", worker, exc.code().name, hint)
            return worker, exc

    replicas: dict[str, list[str]] = {}
    unready: dict[str, dict[str, str]] = {}
    unreachable: dict[str, str] = {}
    for worker, reply in await asyncio.gather(*(index(w) for w in upstreams.workers)):
        if not isinstance(reply, bytes):
            unreachable[worker] = f"RepositoryIndex failed: {reply.code().name}"
            if previous is not None:
                for name, route in previous.routes.items():
                    if worker in route.replicas:
                        replicas.setdefault(name, []).append(worker)
                for name, workers in previous.unready.items():
                    if worker in workers:
                        unready.setdefault(name, {})[worker] = workers[worker]
            continue
        for model in service_pb2.RepositoryIndexResponse.FromString(reply).models:
            if model.state == "READY":
                if worker not in replicas.setdefault(model.name, []):
                    replicas[model.name].append(worker)
            else:
                state = model.state or "not loaded"
                why = f"reports {state}: {model.reason}" if model.reason else f"reports {state}"
                unready.setdefault(model.name, {})[worker] = why

    async def model_config(name: str, worker: str) -> tuple[int | None, list[str] | None]:
        """(max batch or None, the meta's calls or None when not a meta) from ModelConfig."""
        request = service_pb2.ModelConfigRequest(name=name).SerializeToString()
        try:
            reply = await upstreams.raw(worker, "ModelConfig")(request, timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return None, None
        config = service_pb2.ModelConfigResponse.FromString(reply).config
        calls = None
        if config.backend == META_BACKEND and PARAM_META_CALLS in config.parameters:
            text = config.parameters[PARAM_META_CALLS].string_value
            calls = [c.strip() for c in text.split(BUNDLES_SEPARATOR) if c.strip()]
        return config.max_batch_size or None, calls

    names = sorted(replicas)
    configs = await asyncio.gather(*(model_config(n, replicas[n][0]) for n in names))
    sizes = [size for size, _ in configs]
    if previous is not None:  # a replica that did not answer: the size known before
        for i, name in enumerate(names):
            old = previous.get(name)
            if sizes[i] is None and old is not None:
                sizes[i] = old.max_batch
    for name, (_, calls) in zip(names, configs, strict=True):
        if calls:  # a meta: only the workers that serve its whole group (docs/meta_models.md)
            whole = [w for w in replicas[name] if all(w in replicas.get(c, ()) for c in calls)]
            if whole:
                replicas[name] = whole
            else:
                log.warning(
                    "meta model %s: no worker serves all of %s; routing it anyway", name, calls
                )
    return RoutingTable(
        {
            n: ModelRoute(tuple(replicas[n]), max_batch=s, calls=tuple(c or ()))
            for n, s, (_, c) in zip(names, sizes, configs, strict=True)
        },
        unready=unready,
        unreachable=unreachable,
    )


async def probe_ready(upstreams: Upstreams, worker: str, timeout_s: float) -> bool:
    """One health probe: ``ServerReady`` of ``worker`` answered ``ready: true`` in time."""
    request = service_pb2.ServerReadyRequest().SerializeToString()
    try:
        reply = await upstreams.raw(worker, "ServerReady")(request, timeout=timeout_s)
    except grpc.aio.AioRpcError:
        return False
    return bool(service_pb2.ServerReadyResponse.FromString(reply).ready)


async def poll_counters(upstreams: Upstreams, timeout_s: float) -> dict[tuple[str, str], Counters]:
    """Cumulative items and execution seconds per (model, worker) from ``ModelStatistics``.

    Items are ``inference_count``; seconds are the sum of ``batch_stats[*].compute_infer.ns``
    (counted once per execution). Workers that fail are left out.
    """
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


class SingleFlight:
    """Runs an async refresh for many waiting callers at once, at most once per interval.

    Callers arriving while a refresh runs wait for it and do not start another; a call within
    ``min_interval_s`` of the last completed refresh returns at once (as
    ReactantServer's gateway: a synchronous single-flight refresh, refreshes at least 1 s apart).

    Args:
        refresh: the coroutine function to run.
        min_interval_s: seconds between two refreshes (1.0).
    """

    def __init__(self, refresh: Callable[[], Awaitable[None]], min_interval_s: float = 1.0) -> None:
        self._refresh = refresh
        self._min_interval = min_interval_s
        self._lock = asyncio.Lock()
        self._last = -math.inf
        self.count = 0

    async def __call__(self, force: bool = False) -> None:
        """Refresh unless one ran within the interval (or another caller is running one).

        Args:
            force: refresh even within the interval (after waiting for a running one), e.g.
                when a worker came back and its models must be routed now.
        """
        async with self._lock:
            if not force and time.monotonic() - self._last < self._min_interval:
                return
            try:
                await self._refresh()
                self.count += 1
            finally:
                self._last = time.monotonic()


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

    async def _forward_to_model(
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

        merged: dict[tuple[str, str], Any] = {}
        for reply in await asyncio.gather(*(index(w) for w in self._upstreams.workers)):
            if reply is None:
                continue
            for model in service_pb2.RepositoryIndexResponse.FromString(reply).models:
                key = (model.name, model.version)
                if key not in merged or model.state == "READY":
                    merged[key] = model
        response = service_pb2.RepositoryIndexResponse()
        for key in sorted(merged):
            response.models.append(merged[key])
        return response

    async def _fan_out(
        self, method: str, request: bytes
    ) -> list[tuple[str, bytes | grpc.aio.AioRpcError]]:
        """Send ``request`` to every worker; (worker, reply bytes or the error) per worker."""

        async def one(worker: str) -> tuple[str, bytes | grpc.aio.AioRpcError]:
            try:
                reply = await self._upstreams.raw(worker, method)(request, timeout=self._timeout)
                return worker, reply
            except grpc.aio.AioRpcError as exc:
                return worker, exc

        return list(await asyncio.gather(*(one(w) for w in self._upstreams.workers)))

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

    async def shm_register(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Register a system shared-memory region on every worker, or on none.

        When a worker refuses, the region is unregistered from the workers that accepted it
        and the refusal is returned.
        """
        answers = await self._fan_out("SystemSharedMemoryRegister", request)
        errors = [r for _, r in answers if not isinstance(r, bytes)]
        if errors:
            name = service_pb2.SystemSharedMemoryRegisterRequest.FromString(request).name
            undo = service_pb2.SystemSharedMemoryUnregisterRequest(name=name).SerializeToString()
            for worker, reply in answers:
                if isinstance(reply, bytes):
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await self._upstreams.raw(worker, "SystemSharedMemoryUnregister")(
                            undo, timeout=self._probe_timeout
                        )
            raise self._first_error(errors, "SystemSharedMemoryRegister")
        return bytes(service_pb2.SystemSharedMemoryRegisterResponse().SerializeToString())

    async def shm_unregister(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Unregister on every worker; succeeds when any worker succeeds."""
        answers = await self._fan_out("SystemSharedMemoryUnregister", request)
        if not any(isinstance(r, bytes) for _, r in answers):
            errors = [r for _, r in answers if not isinstance(r, bytes)]
            raise self._first_error(errors, "SystemSharedMemoryUnregister")
        return bytes(service_pb2.SystemSharedMemoryUnregisterResponse().SerializeToString())

    async def _first_worker(
        self, method: str, request: bytes, context: grpc.aio.ServicerContext
    ) -> bytes:
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

    async def shm_status(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """The first worker's answer (registrations are the same on every worker)."""
        return await self._first_worker("SystemSharedMemoryStatus", request, context)

    async def server_metadata(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """The first answering worker's name, version and extensions (every worker runs the
        same tritonserver; perf_analyzer asks for it before it starts)."""
        return await self._first_worker("ServerMetadata", request, context)

    def handler(self) -> grpc.GenericRpcHandler:
        """The generic handler to add to a ``grpc.aio`` server."""

        def forward(method: str) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
            async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                return await self._forward_to_model(method, request, context)

            return call

        raw = grpc.unary_unary_rpc_method_handler
        handlers = {
            "ModelInfer": raw(self.model_infer),
            "ModelReady": raw(forward("ModelReady")),
            "ModelMetadata": raw(forward("ModelMetadata")),
            "ModelConfig": raw(forward("ModelConfig")),
            "ModelStatistics": raw(self.model_statistics),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(self.model_stream_infer),
            "SystemSharedMemoryRegister": raw(self.shm_register),
            "SystemSharedMemoryUnregister": raw(self.shm_unregister),
            "SystemSharedMemoryStatus": raw(self.shm_status),
            "ServerMetadata": raw(self.server_metadata),
            "ServerLive": raw(
                self.server_live,
                request_deserializer=service_pb2.ServerLiveRequest.FromString,
                response_serializer=service_pb2.ServerLiveResponse.SerializeToString,
            ),
            "ServerReady": raw(
                self.server_ready,
                request_deserializer=service_pb2.ServerReadyRequest.FromString,
                response_serializer=service_pb2.ServerReadyResponse.SerializeToString,
            ),
            "RepositoryIndex": raw(
                self.repository_index,
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
