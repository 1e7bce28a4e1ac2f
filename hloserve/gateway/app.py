"""Run a gateway: HAProxy, the Python servicer and a discovery loop, until stopped.

:func:`run_gateway` wires :mod:`hloserve.gateway.config`, :mod:`~hloserve.gateway.routing` and
:mod:`~hloserve.gateway.proxy`: one discovery pass before serving, then one every
``discovery.poll_interval_seconds``, each swapping the router's table whole (docs/gateway.md,
"Proxy"); a request naming a model missing from the table triggers a single-flight discovery
pass (at most one per second) before it is answered NOT_FOUND (no worker lists it) or
UNAVAILABLE (some worker lists it but not READY, or a worker did not answer). Health probes
(``ServerReady`` every ``health.interval_seconds``, :mod:`hloserve.gateway.health`) take a
worker out of the table after ``health.failure_threshold`` failures in a row and bring it back
(after a forced discovery pass) when it answers ready again. In ``lpt_packing`` mode each
pass also polls ``ModelStatistics`` and lets :class:`hloserve.gateway.packing.LptController`
restrict the table to the placement (repacked at startup, on fleet changes and per the
rebalance budget). The control plane (:mod:`hloserve.gateway.control`) is served on the same
gRPC port. With ``discovery.dns_name`` the workers themselves come from DNS
(:func:`~hloserve.gateway.discovery.resolve_workers`), resolved at start and every
``discovery.dns_interval_seconds``: a changed answer becomes the fleet (channels, health,
fleet HTTP, HAProxy's servers by a hitless reload; docs/kubernetes.md, "DNS discovery").

HAProxy (:mod:`hloserve.gateway.haproxy`) listens on ``listen`` and carries ModelInfer
straight to the workers, with the admission and failover rules of
:mod:`hloserve.gateway.dataplane`; the servicer above listens on a loopback port behind it and
answers every other RPC and the ModelInfer requests HAProxy's map does not route (sent back
to HAProxy's checked bind once routable); with ``http_listen`` a loopback HTTP server
(:mod:`hloserve.gateway.fleet_http`) answers the KServe HTTP repository index, model
load/unload (the servicer's :class:`~hloserve.gateway.model_control.ModelControl`) and system
and CUDA shared memory from every worker. After
every table change (discovery, health, repacks, control-plane changes: checked
every :data:`SYNC_INTERVAL_S`) the layout (:func:`hloserve.gateway.dataplane.plan_layout`) is
applied to HAProxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from hloserve.errors import HloserveError, UnavailableError
from hloserve.gateway.admin import AdminServer, GatewayMetrics
from hloserve.gateway.config import GatewayConfig
from hloserve.gateway.control import add_control_service
from hloserve.gateway.dataplane import plan_layout
from hloserve.gateway.discovery import (
    SingleFlight,
    discover_table,
    resolve_workers,
    with_workers,
)
from hloserve.gateway.fleet_http import FleetHttp, FleetHttpServer
from hloserve.gateway.haproxy import HAProxy
from hloserve.gateway.health import HealthTracker, restrict_to_healthy
from hloserve.gateway.model_control import ModelControl
from hloserve.gateway.packing import LptController, WeightInfo, weights_from_metrics
from hloserve.gateway.proxy import GatewayProxy, make_server
from hloserve.gateway.routing import Router, RoutingTable
from hloserve.gateway.scheduling_control import SchedulingControl
from hloserve.gateway.upstreams import Upstreams, poll_counters, probe_ready
from hloserve.model_control import grpc_metadata, http_headers, local_key
from hloserve.prometheus_text import fetch_metrics

log = logging.getLogger("hloserve.gateway")

#: Seconds between checks that HAProxy serves the router's current table and knobs.
SYNC_INTERVAL_S = 0.5


def _public_address(address: str) -> str:
    """``address`` with port 0 replaced by a free port (HAProxy binds a concrete port)."""
    from hloserve.ports import free_ports

    host, _, port = address.rpartition(":")
    if port == "0":
        port = str(free_ports(1, host.strip("[]"))[0])
    return f"{host}:{port}"


def _start_haproxy(
    config: GatewayConfig, public: str, control_port: int, fleet_http: FleetHttpServer | None
) -> HAProxy:
    control = f"127.0.0.1:{control_port}"
    if fleet_http is None:
        return HAProxy(config, public, control)
    return HAProxy(config, public, control, fleet_http.address, fleet_http.fleet.checked)


def _fleet_http(
    config: GatewayConfig, key: str | None, control: ModelControl
) -> FleetHttpServer | None:
    """The loopback HTTP server answering the KServe HTTP calls that need every worker
    (repository index, model load/unload by ``control``, system and CUDA shared memory),
    when the gateway serves KServe HTTP (called on the gateway's event loop)."""
    if config.http_listen is None:
        return None
    fleet = FleetHttp(
        config.worker_http,
        request_timeout_s=config.upstream.request_timeout_seconds,
        probe_timeout_s=config.upstream.probe_timeout_seconds,
        repository_headers=http_headers(key),
        control=control,
        loop=asyncio.get_running_loop(),
        grpc_workers=config.workers,
        checked=_public_address("127.0.0.1:0"),  # HAProxy's http_checked frontend
    )
    try:
        return FleetHttpServer(fleet)
    except OSError as exc:
        fleet.close()
        raise UnavailableError(f"gateway: cannot serve its loopback HTTP port: {exc}") from None


def _poll_weights(config: GatewayConfig, timeout_s: float) -> WeightInfo:
    """Footprints and budgets from every configured worker metrics endpoint (blocking)."""
    texts = {}
    for worker, endpoint in zip(config.workers, config.worker_metrics, strict=False):
        try:
            texts[worker] = fetch_metrics(endpoint, timeout_s)
        except HloserveError as exc:
            log.debug("worker %s: no weight metrics: %s", worker, exc)
    return weights_from_metrics(texts)


async def run_gateway(
    config: GatewayConfig,
    stop: asyncio.Event,
    *,
    listen: str | None = None,
    admin_port: int | None = None,
    on_ready: Callable[[int, int], None] | None = None,
) -> None:
    """Serve the gateway until ``stop`` is set, then shut down within a few seconds.

    Args:
        config: the settings.
        stop: set it to stop the gateway.
        listen: overrides ``config.listen`` (tests pass "127.0.0.1:0" for a free port).
        admin_port: overrides ``config.admin_port`` (0 = a free port).
        on_ready: called with the bound gRPC port and admin port once both accept calls.

    Raises:
        UnavailableError: the listen address or the admin port cannot be bound.
    """
    secret = config.upstream.model_control_key
    key = local_key() if secret is None else secret.get_secret_value()
    timeout = config.upstream.probe_timeout_seconds
    if config.discovery.dns_name is not None:  # the workers the name has now, maybe none
        try:
            config = with_workers(config, await resolve_workers(config.discovery, timeout))
        except UnavailableError as exc:
            log.warning("%s; starting without workers, retrying", exc)
    upstreams = Upstreams(config.workers, config.grpc, grpc_metadata(key))
    router = Router()
    metrics = GatewayMetrics(router)

    controller = LptController(config.scheduling) if config.mode == "lpt_packing" else None
    last_tick = time.monotonic()
    health = HealthTracker(config.workers, config.health.failure_threshold)
    for worker in config.workers:
        metrics.worker_healthy.labels(worker).set(1.0)
    discovered = RoutingTable()

    async def discover() -> None:
        nonlocal last_tick, discovered
        discovered = await discover_table(upstreams, timeout, discovered)
        table = restrict_to_healthy(discovered, health.unhealthy)
        if controller is not None:
            counters = await poll_counters(upstreams, timeout)
            weights = await asyncio.to_thread(_poll_weights, config, timeout)
            now = time.monotonic()
            before = controller.placement
            table = controller.tick(table, counters, now - last_tick, weights)
            if controller.placement is not before:
                metrics.repacks.inc()
            last_tick = now
        router.swap_table(table)
        metrics.table_swaps.inc()

    refresh = SingleFlight(discover, min_interval_s=1.0)
    proxy = GatewayProxy(
        router,
        upstreams,
        request_timeout_s=config.upstream.request_timeout_seconds,
        probe_timeout_s=timeout,
        refresh=refresh,
        place=(
            None
            if controller is None
            else lambda model, calls, candidates: controller.place_new(
                model, [w for w in candidates if w not in health.unhealthy], calls
            )
        ),
    )
    # Both ports are bound before the first discovery pass, so a taken port fails at once.
    address = listen or config.listen
    fleet_http: FleetHttpServer | None = None
    try:
        address = _public_address(address)
        if config.http_listen is not None:
            http = _public_address(config.http_listen)
            config = config.model_copy(update={"http_listen": http})
        server, control_port = make_server(proxy, "127.0.0.1:0", config.grpc)
        fleet_http = _fleet_http(config, key, proxy.model_control)
        # On this (the gateway's) thread: HAProxy stops when it dies (HAProxy docstring).
        dataplane = _start_haproxy(config, address, control_port, fleet_http)
        metrics.extra = dataplane.prometheus_text
        port = int(address.rpartition(":")[2])
    except HloserveError:
        if fleet_http is not None:
            fleet_http.close()
        await upstreams.close()
        raise
    checked = Upstreams((str(dataplane.listen.grpc_checked),), config.grpc)
    control = SchedulingControl(
        config.mode, config.scheduling, config.workers, router, controller, metrics.repacks.inc
    )
    add_control_service(server, control)  # hloserve.gateway.v1.GatewayControl, same port
    host = address.rpartition(":")[0].strip("[]")
    admin_at = config.admin_port if admin_port is None else admin_port
    try:
        admin = AdminServer(
            host,
            admin_at,
            metrics,
            ready=lambda: any(r.replicas for r in router.table.routes.values()),
        )
    except OSError as exc:
        await upstreams.close()
        await checked.close()
        dataplane.close()
        if fleet_http is not None:
            fleet_http.close()
        raise UnavailableError(
            f"gateway: cannot serve the admin port {host}:{admin_at}: {exc}"
        ) from None
    admin.start()  # /readyz answers 503 until discovery has found a model
    if fleet_http is not None:
        fleet_http.start()

    async def sync() -> None:
        """Apply the router's current table and knobs to HAProxy (no-op when unchanged)."""
        layout = plan_layout(router.table, config, router.scheduling)
        await asyncio.to_thread(dataplane.apply, layout, config)
        router.record_counts(*await asyncio.to_thread(dataplane.counts))

    async def routable(model: str) -> None:
        """Bring HAProxy's map up to the table when it lacks ``model`` (a model discovery
        just found: the periodic sync has not run yet)."""
        if model not in dataplane.layout.models:
            await sync()

    proxy.send_checked_to(checked, routable)

    try:
        if controller is not None:  # workers must schedule fifo or edf (docs/scheduling.md)
            from hloserve.gateway.preconditions import check_lpt_workers

            await check_lpt_workers(upstreams, timeout)
        await refresh()
        await server.start()
        await sync()
    except BaseException:
        admin.close()
        if fleet_http is not None:
            fleet_http.close()
        await upstreams.close()
        await checked.close()
        dataplane.close()
        raise
    log.info("gateway: %d models over %d workers", len(router.table.routes), len(config.workers))
    log.info(
        "gateway: listening on %s (mode %s)", address.rpartition(":")[0] + f":{port}", config.mode
    )
    if on_ready is not None:
        on_ready(port, admin.port)

    async def probe_workers() -> None:
        """Health probes every ``health.interval_seconds``; a change re-runs discovery."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), config.health.interval_seconds)
            if stop.is_set():
                return
            try:
                workers = config.workers
                answers = await asyncio.gather(
                    *(probe_ready(upstreams, w, timeout) for w in workers)
                )
                changed = False
                for worker, ok in zip(workers, answers, strict=True):
                    if worker not in config.workers:  # left the fleet (DNS) meanwhile
                        continue
                    flipped = health.record(worker, ok)
                    metrics.worker_healthy.labels(worker).set(float(health.is_healthy(worker)))
                    if flipped:
                        changed = True
                        if ok:
                            log.info("gateway: worker %s is healthy again", worker)
                        else:
                            log.warning("gateway: worker %s failed its health probes", worker)
                if changed:
                    await refresh(force=True)
            except Exception:  # a bad pass must not stop the probes
                log.exception("gateway: health probe pass failed")

    async def keep_in_sync() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SYNC_INTERVAL_S)
            try:
                await sync()
            except Exception:  # the old layout keeps serving; the next check retries
                log.exception("gateway: HAProxy did not take the new layout")

    async def follow_dns() -> None:
        """Resolve ``discovery.dns_name`` every ``dns_interval_seconds``; a new answer
        becomes the fleet: channels to the new workers, a discovery pass over the new fleet,
        HAProxy reloaded with its servers (hitless: requests in flight finish where they
        went), then the channels of the workers gone are closed once their calls end."""
        nonlocal config
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), config.discovery.dns_interval_seconds)
            if stop.is_set():
                return
            try:
                found = with_workers(config, await resolve_workers(config.discovery, timeout))
                if found.workers == config.workers:
                    continue
                joined = [w for w in found.workers if w not in config.workers]
                left = [w for w in config.workers if w not in found.workers]
                log.info("gateway: DNS: workers joined %s, left %s", joined, left)
                config = found
                gone = upstreams.set_workers(config.workers)
                health.retain(config.workers)
                for worker in joined:
                    metrics.worker_healthy.labels(worker).set(1.0)
                for worker in left:
                    with contextlib.suppress(KeyError):
                        metrics.worker_healthy.remove(worker)
                control.workers = config.workers
                if fleet_http is not None:
                    fleet_http.fleet.set_workers(config.worker_http, config.workers)
                await refresh(force=True)
                await sync()
                upstreams.drop(gone, config.upstream.request_timeout_seconds)
            except UnavailableError as exc:  # keep the fleet; the next resolution may work
                log.warning("%s; keeping %d workers", exc, len(config.workers))
            except Exception:
                log.exception("gateway: DNS discovery pass failed; keeping the current fleet")

    prober = asyncio.ensure_future(probe_workers())
    syncer = asyncio.ensure_future(keep_in_sync())
    follower = asyncio.ensure_future(follow_dns()) if config.discovery.dns_name else None
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), config.discovery.poll_interval_seconds)
            if not stop.is_set():
                try:
                    await refresh()
                except Exception:  # a bad pass must not stop the gateway; the next may work
                    log.exception("gateway: discovery pass failed; keeping the current table")
    finally:
        for task in (prober, syncer, *([follower] if follower else [])):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # drain: HAProxy answers what it holds while the servicer behind it still runs
        await asyncio.to_thread(dataplane.close, config.exit_timeout_seconds)
        await server.stop(grace=2.0)
        admin.close()
        if fleet_http is not None:
            fleet_http.close()
        await upstreams.close()
        await checked.close()
