"""Discovery: the workers from DNS (docs/kubernetes.md, "DNS discovery"), the routing table
from the workers' own answers (docs/gateway.md, "Proxy").
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
    """The models a meta's or an ensemble's ``config`` calls, each once, in order; () otherwise."""
    if config.backend == META_BACKEND and PARAM_META_CALLS in config.parameters:
        params = string_values(config.parameters)
        return tuple(MetaParameters.read(config.name, params, PARAM_META_CALLS))
    steps = (step.model_name for step in config.ensemble_scheduling.step)
    return tuple(dict.fromkeys(steps))


async def resolve_workers(discovery: DiscoveryConfig, timeout_s: float) -> tuple[str, ...]:
    """The IPv4 addresses of ``discovery.dns_name``'s A records, sorted; () when it has none.

    Raises:
        UnavailableError: no nameserver answered within ``timeout_s`` (keep the fleet).
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
    """``config`` with the workers at ``addresses`` on ``discovery``'s ports."""
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
    """Build a routing table from every worker's ``RepositoryIndex`` and ``ModelConfig``
    (docs/gateway.md, "Proxy"); a worker that fails keeps ``previous``'s routes.
    """
    previous = previous or RoutingTable()

    async def index(worker: str) -> tuple[str, Any]:
        try:
            return worker, await upstreams.repository_index(worker, timeout_s)
        except grpc.aio.AioRpcError as exc:
            level = logging.DEBUG if worker in previous.unreachable else logging.WARNING
            hint = ""
            if api_restricted(exc.details() or ""):
                key = "set upstream.model_control_key to the worker's HLOSERVE_MODEL_CONTROL_KEY"
                hint = f" ({exc.details()}: {key})"
            log.log(level, "worker %s: RepositoryIndex failed: %s%s", worker, exc.code().name, hint)
            return worker, exc

    replicas: dict[str, list[str]] = {}
    unready: dict[str, dict[str, str]] = {}
    unreachable: dict[str, str] = {}
    for worker, reply in await asyncio.gather(*(index(w) for w in upstreams.workers)):
        if isinstance(reply, grpc.aio.AioRpcError):
            unreachable[worker] = f"RepositoryIndex failed: {reply.code().name}"
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
        try:
            config = await upstreams.model_config(worker, name, timeout_s)
        except grpc.aio.AioRpcError:
            old = previous.get(name)
            return None, (), old is not None and old.stateful
        stateful = config.HasField("sequence_batching")
        return config.max_batch_size or None, group_calls(config), stateful

    names = sorted(replicas)
    configs = await asyncio.gather(*(model_config(n, replicas[n][0]) for n in names))
    routes: dict[str, ModelRoute] = {}
    for name, (size, calls, stateful) in zip(names, configs, strict=True):
        old = previous.get(name)
        if size is None and old is not None:  # a replica that did not answer: the size known
            size = old.max_batch
        if stateful:  # one replica: every request of a sequence reaches the same runtime
            kept = [w for w in (old.replicas if old else ()) if w in replicas[name]]
            replicas[name] = (kept or replicas[name])[:1]
        if calls:  # a meta or an ensemble: only the workers that serve its whole group
            whole = [w for w in replicas[name] if all(w in replicas.get(c, ()) for c in calls)]
            if whole:
                replicas[name] = whole
            else:
                log.warning("model %s: no worker serves all of %s; routing it anyway", name, calls)
        routes[name] = ModelRoute(tuple(replicas[name]), size, calls=calls, stateful=stateful)
    return RoutingTable(routes, unready=unready, unreachable=unreachable)


class SingleFlight:
    """Runs an async refresh for many waiting callers at once, at most once per ``min_interval_s``
    (a call within the interval returns at once, as ReactantServer's gateway).
    """

    def __init__(self, refresh: Callable[[], Awaitable[None]], min_interval_s: float = 1.0) -> None:
        self._refresh = refresh
        self._min_interval = min_interval_s
        self._lock = asyncio.Lock()
        self._last = -math.inf
        self.count = 0

    async def __call__(self, force: bool = False) -> None:
        """Refresh unless one ran within the interval; ``force``: refresh anyway."""
        async with self._lock:
            if not force and time.monotonic() - self._last < self._min_interval:
                return
            try:
                await self._refresh()
                self.count += 1
            finally:
                self._last = time.monotonic()
