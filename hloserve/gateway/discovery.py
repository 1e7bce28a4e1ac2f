"""Discovery: the routing table from the workers' own answers, and its single-flight refresh.

:func:`discover_table` builds a :class:`~hloserve.gateway.routing.RoutingTable` from every
worker's ``RepositoryIndex`` and ``ModelConfig`` (docs/gateway.md, "Proxy");
:class:`SingleFlight` runs such a pass for many waiting callers at once, at most once per
interval.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from hloserve.gateway.routing import REPORTS, ModelRoute, RoutingTable
from hloserve.gateway.upstreams import Upstreams
from hloserve.model_parameters import MetaParameters, string_values
from hloserve.names import META_BACKEND, PARAM_META_CALLS
from hloserve.triton_messages import api_restricted

log = logging.getLogger("hloserve.gateway")


def meta_calls(model: str, config: Any) -> tuple[str, ...]:
    """The models a meta model calls (``hloserve.meta_calls`` of its ``inference.ModelConfig``,
    docs/meta_models.md); () for a model that is not a meta.

    Raises:
        InvalidArgumentError: the parameter does not parse.
    """
    if config.backend != META_BACKEND or PARAM_META_CALLS not in config.parameters:
        return ()
    params = string_values(config.parameters)
    return tuple(MetaParameters.read(model, params, PARAM_META_CALLS))


async def discover_table(
    upstreams: Upstreams, timeout_s: float, previous: RoutingTable | None = None
) -> RoutingTable:
    """Build a routing table from every worker's ready models (docs/gateway.md, "Proxy").

    Polls ``RepositoryIndex`` on each worker (every model with its state: READY ones are
    routed, the others noted with the worker's state and reason for the UNAVAILABLE a client
    gets, :meth:`~hloserve.gateway.routing.RoutingTable.no_route_error`), then
    ``ModelConfig`` of each model on its first replica for ``max_batch_size`` (0 -> None) and,
    for a meta model, its
    ``hloserve.meta_calls``: a meta keeps only the replicas whose worker serves every model it
    calls (all of them when no worker does; a worker then answers NOT_FOUND naming the missing
    one). A worker whose index call fails keeps
    the models ``previous`` routed to it: whether it may be routed to is the health probes'
    decision (:mod:`hloserve.gateway.health`), and a model whose only worker is down stays
    known (UNAVAILABLE, not NOT_FOUND). Without ``previous`` such a worker is left out.
    A stateful model (its config has ``sequence_batching``: the runtime of one worker keeps
    each sequence's state, docs/bundles.md "Stateful bundles") gets one replica, since HAProxy
    cannot hash on the correlation ID (it sits in the request's ``parameters`` map): the one
    ``previous`` routed it to while that worker still holds it, else the first in worker order.
    Measured costs are not polled yet (``cost_per_item_seconds`` stays None).
    """

    async def index(worker: str) -> tuple[str, Any]:
        try:
            return worker, await upstreams.repository_index(worker, timeout_s)
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
        if isinstance(reply, grpc.aio.AioRpcError):
            unreachable[worker] = f"RepositoryIndex failed: {reply.code().name}"
            if previous is not None:
                for name, route in previous.routes.items():
                    if worker in route.replicas:
                        replicas.setdefault(name, []).append(worker)
                for name, workers in previous.unready.items():
                    if worker in workers:
                        unready.setdefault(name, {})[worker] = workers[worker]
            continue
        for model in reply:
            if model.state == "READY":
                if worker not in replicas.setdefault(model.name, []):
                    replicas[model.name].append(worker)
            else:
                state = model.state or "not loaded"
                why = f"{REPORTS}{state}: {model.reason}" if model.reason else f"{REPORTS}{state}"
                unready.setdefault(model.name, {})[worker] = why

    async def model_config(name: str, worker: str) -> tuple[int | None, tuple[str, ...], bool]:
        """(max batch or None, the meta's calls, stateful) from ModelConfig."""
        try:
            config = await upstreams.model_config(worker, name, timeout_s)
        except grpc.aio.AioRpcError:
            old = previous.get(name) if previous is not None else None
            return None, (), old is not None and old.stateful
        stateful = config.HasField("sequence_batching")
        return config.max_batch_size or None, meta_calls(name, config), stateful

    names = sorted(replicas)
    configs = await asyncio.gather(*(model_config(n, replicas[n][0]) for n in names))
    sizes = [size for size, _, _ in configs]
    if previous is not None:  # a replica that did not answer: the size known before
        for i, name in enumerate(names):
            old = previous.get(name)
            if sizes[i] is None and old is not None:
                sizes[i] = old.max_batch
    for name, (_, calls, stateful) in zip(names, configs, strict=True):
        if stateful:  # one replica: every request of a sequence reaches the same runtime
            old = previous.get(name) if previous is not None else None
            kept = [w for w in (old.replicas if old else ()) if w in replicas[name]]
            replicas[name] = (kept or replicas[name])[:1]
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
            n: ModelRoute(tuple(replicas[n]), max_batch=s, calls=c, stateful=st)
            for n, s, (_, c, st) in zip(names, sizes, configs, strict=True)
        },
        unready=unready,
        unreachable=unreachable,
    )


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
