"""Discovery: the workers from DNS, the routing table from the workers' own answers, and its
single-flight refresh.

:func:`resolve_workers` finds the workers as the A records of ``discovery.dns_name`` (a
Kubernetes headless Service: docs/kubernetes.md, "DNS discovery") and :func:`with_workers`
makes them the gateway's fleet; :func:`discover_table` builds a
:class:`~hloserve.gateway.routing.RoutingTable` from every worker's ``RepositoryIndex`` and
``ModelConfig`` (docs/gateway.md, "Proxy"); :class:`SingleFlight` runs such a pass for many
waiting callers at once, at most once per interval.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from hloserve.errors import UnavailableError
from hloserve.gateway.config import DiscoveryConfig, GatewayConfig
from hloserve.gateway.routing import REPORTS, ModelRoute, RoutingTable
from hloserve.gateway.upstreams import Upstreams
from hloserve.model_parameters import MetaParameters, string_values
from hloserve.names import META_BACKEND, PARAM_META_CALLS
from hloserve.triton_messages import api_restricted

log = logging.getLogger("hloserve.gateway")


def group_calls(config: Any) -> tuple[str, ...]:
    """The models ``config``'s model calls, which the gateway places and routes it with: a
    meta's ``hloserve.meta_calls`` (docs/meta_models.md), or an ensemble's step models
    (``ensemble_scheduling.step[].model_name``, Triton's ensemble config), in order, each
    once; () for any other model. A nested ensemble's own steps are its own group.
    """
    if config.backend == META_BACKEND and PARAM_META_CALLS in config.parameters:
        params = string_values(config.parameters)
        return tuple(MetaParameters.read(config.name, params, PARAM_META_CALLS))
    steps = (step.model_name for step in config.ensemble_scheduling.step)
    return tuple(dict.fromkeys(steps))


async def resolve_workers(discovery: DiscoveryConfig, timeout_s: float) -> tuple[str, ...]:
    """The addresses of ``discovery.dns_name``'s A records, sorted (so every gateway replica
    lists the same fleet in the same order).

    Asks ``discovery.dns_nameserver`` when set, else the system's nameservers with its search
    domains and ``ndots`` (``/etc/resolv.conf``, as a pod's resolver), through dnspython.

    Returns:
        The IPv4 addresses; ``()`` when the name does not exist or has no A record (a headless
        Service with no pod).

    Raises:
        UnavailableError: no nameserver answered within ``timeout_s`` (the caller keeps the
            fleet it has: a DNS outage must not empty it).
    """
    import dns.asyncresolver
    import dns.exception
    import dns.resolver

    name = discovery.dns_name
    if name is None:
        return ()
    if discovery.dns_nameserver is None:
        resolver = dns.asyncresolver.Resolver()
    else:
        host, _, port = discovery.dns_nameserver.rpartition(":")
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = [host.strip("[]")]
        resolver.port = int(port)
    try:
        answer = await resolver.resolve(name, "A", search=True, lifetime=timeout_s)
    except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
        return ()
    except dns.exception.DNSException as exc:
        where = discovery.dns_nameserver or "the system's nameservers"
        raise UnavailableError(f"gateway: DNS discovery of {name} at {where}: {exc}") from None
    return tuple(sorted({r.address for r in answer}, key=ipaddress.ip_address))


def with_workers(config: GatewayConfig, addresses: Sequence[str]) -> GatewayConfig:
    """``config`` with the workers at ``addresses`` (:func:`resolve_workers`): ``workers``,
    ``worker_http`` and ``worker_metrics`` on ``discovery``'s ports (no metrics with
    ``worker_metrics_port`` 0)."""
    d = config.discovery
    hosts = [f"[{a}]" if ":" in a else a for a in addresses]
    return config.model_copy(
        update={
            "workers": tuple(f"{h}:{d.worker_grpc_port}" for h in hosts),
            "worker_http": tuple(f"{h}:{d.worker_http_port}" for h in hosts),
            "worker_metrics": (
                tuple(f"{h}:{d.worker_metrics_port}" for h in hosts)
                if d.worker_metrics_port
                else ()
            ),
        }
    )


async def discover_table(
    upstreams: Upstreams, timeout_s: float, previous: RoutingTable | None = None
) -> RoutingTable:
    """Build a routing table from every worker's ready models (docs/gateway.md, "Proxy").

    Polls ``RepositoryIndex`` on each worker (every model with its state: READY ones are
    routed, the others noted with the worker's state and reason for the UNAVAILABLE a client
    gets, :meth:`~hloserve.gateway.routing.RoutingTable.no_route_error`), then
    ``ModelConfig`` of each model on its first replica for ``max_batch_size`` (0 -> None) and,
    for a meta model or an ensemble, the models it calls (:func:`group_calls`): it keeps only
    the replicas whose worker serves every model it calls (all of them when no worker does;
    a worker then answers NOT_FOUND naming the missing one). A worker whose index call fails
    keeps the models ``previous`` routed to it: whether it may be routed to is the health probes'
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
        """(max batch or None, the models it calls (:func:`group_calls`), stateful) from
        ModelConfig."""
        try:
            config = await upstreams.model_config(worker, name, timeout_s)
        except grpc.aio.AioRpcError:
            old = previous.get(name) if previous is not None else None
            return None, (), old is not None and old.stateful
        stateful = config.HasField("sequence_batching")
        return config.max_batch_size or None, group_calls(config), stateful

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
        if calls:  # a meta or an ensemble: only the workers that serve its whole group
            whole = [w for w in replicas[name] if all(w in replicas.get(c, ()) for c in calls)]
            if whole:
                replicas[name] = whole
            else:
                log.warning("model %s: no worker serves all of %s; routing it anyway", name, calls)
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
