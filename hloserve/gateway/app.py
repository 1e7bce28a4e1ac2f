"""Run a gateway: HAProxy, the Python servicer and its loops (discovery, health probes,
placement, HAProxy sync, DNS), until stopped (docs/gateway.md, "Data plane" and "Proxy").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable

import grpc

from hloserve.errors import HloserveError, UnavailableError
from hloserve.gateway.admin import AdminServer, GatewayMetrics
from hloserve.gateway.auth import ENV_TOKEN, ENV_TOKEN_FILE, ControlAuth, read_token
from hloserve.gateway.config import GatewayConfig
from hloserve.gateway.control import SchedulingControl, add_control_service
from hloserve.gateway.dataplane import plan_layout
from hloserve.gateway.discovery import SingleFlight, discover_table, resolve_workers, with_workers
from hloserve.gateway.fleet_http import FleetHttp, FleetHttpServer
from hloserve.gateway.haproxy import HAProxy
from hloserve.gateway.model_control import ModelControl
from hloserve.gateway.packing import LptController, WeightInfo, weights_from_metrics
from hloserve.gateway.proxy import GatewayProxy, make_server
from hloserve.gateway.routing import HealthTracker, Router, RoutingTable, restrict_to_healthy
from hloserve.gateway.upstreams import Upstreams, check_lpt_workers, poll_counters, probe_ready
from hloserve.model_control import grpc_metadata, http_headers, local_key
from hloserve.ports import free_ports
from hloserve.prometheus_text import fetch_metrics

log = logging.getLogger("hloserve.gateway")

#: Seconds between checks that HAProxy serves the router's current table and knobs.
SYNC_INTERVAL_S = 0.5


def _public_address(address: str) -> str:
    """``address`` with port 0 replaced by a free port (HAProxy binds a concrete port)."""
    host, _, port = address.rpartition(":")
    if port == "0":
        port = str(free_ports(1, host.strip("[]"))[0])
    return f"{host}:{port}"


def _fleet_http(
    config: GatewayConfig, auth: ControlAuth, control: ModelControl
) -> FleetHttpServer | None:
    """The loopback KServe HTTP fleet server with ``http_listen``, else None (on the event loop)."""
    if config.http_listen is None:
        return None
    fleet = FleetHttp(
        config.worker_http,
        request_timeout_s=config.upstream.request_timeout_seconds,
        probe_timeout_s=config.upstream.probe_timeout_seconds,
        repository_headers=http_headers(auth.model_control_key),
        control=control,
        auth=auth,
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
    """Footprints and budgets from every worker metrics endpoint (blocking)."""
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
    """Serve the gateway until ``stop`` is set, then shut down, draining up to
    ``exit_timeout_seconds``; ``listen`` and ``admin_port`` override the config's (port 0: a
    free one); ``on_ready`` gets the bound gRPC and admin ports once both accept calls.

    Raises:
        UnavailableError: the listen address or the admin port cannot be bound.
    """
    secret = config.upstream.model_control_key
    key = local_key() if secret is None else secret.get_secret_value()
    client_ca = config.tls is not None and config.tls.client_ca is not None
    auth = ControlAuth(
        read_token(config.auth.token_file),
        secrets.token_hex(16) if client_ca else None,
        key,
        config.auth.open_repository_api,
    )
    if auth.open_repository_api:
        log.warning(
            "gateway: auth.open_repository_api: model load and unload need no credential;"
            " a load may carry model files and a Python model is code: whoever reaches"
            " the gateway's ports can run code on the workers"
        )
    if auth.token is None and not client_ca:
        log.warning(
            "gateway: no control token (%s, %s or auth.token_file) and no tls.client_ca:"
            " GatewayControl is refused%s",
            ENV_TOKEN,
            ENV_TOKEN_FILE,
            "" if auth.open_repository_api else ", model control needs the workers' key",
        )
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
    server: grpc.aio.Server | None = None
    fleet_http: FleetHttpServer | None = None
    dataplane: HAProxy | None = None
    checked: Upstreams | None = None
    admin: AdminServer | None = None

    async def close(drain_s: float = 0.0) -> None:
        """Stop what was started; with ``drain_s``, HAProxy drains first."""
        if dataplane is not None:
            await asyncio.to_thread(dataplane.close, drain_s)
        if server is not None:
            await server.stop(grace=2.0)
        for part in (admin, fleet_http):
            if part is not None:
                part.close()
        await upstreams.close()
        if checked is not None:
            await checked.close()

    async def revive() -> None:
        """Start HAProxy again after the backoff when its master exited."""
        assert dataplane is not None
        status = dataplane.exited()
        if status is None:
            return
        delay = dataplane.restart_delay()
        log.warning(
            "gateway: HAProxy exited (status %s); starting it again in %.1f s", status, delay
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        if stop.is_set() or not dataplane.respawn():  # on this thread (HAProxy docstring)
            return
        started = time.monotonic()
        try:
            await asyncio.to_thread(dataplane.wait_started)
        except UnavailableError as exc:
            log.warning("%s; trying again", exc)
            return
        metrics.haproxy_restarts.inc()
        log.warning(
            "gateway: HAProxy started again (restart %d) on %s in %.2f s",
            dataplane.restarts,
            dataplane.listen.grpc,
            time.monotonic() - started,
        )

    async def sync() -> None:
        """Apply the router's table and knobs to HAProxy (reviving it first)."""
        assert dataplane is not None
        await revive()
        if dataplane.exited() is not None:
            return
        layout = plan_layout(router.table, config, router.scheduling)
        await asyncio.to_thread(dataplane.apply, layout, config)
        router.record_counts(*await asyncio.to_thread(dataplane.counts))

    async def routable(model: str) -> None:
        """Sync HAProxy now when its map lacks ``model`` (just discovered)."""
        if dataplane is not None and model not in dataplane.layout.models:
            await sync()

    # Every port is bound before the first discovery pass, so a taken port fails at once.
    admin_at = config.admin_port if admin_port is None else admin_port
    try:
        address = _public_address(listen or config.listen)
        host, _, port_text = address.rpartition(":")
        port, host = int(port_text), host.strip("[]")
        if config.http_listen is not None:
            config = config.model_copy(update={"http_listen": _public_address(config.http_listen)})
        server, control_port = make_server(proxy, "127.0.0.1:0", config.grpc, auth)
        fleet_http = _fleet_http(config, auth, proxy.model_control)
        # on this (the gateway's) thread: HAProxy stops when it dies
        dataplane = HAProxy(
            config,
            address,
            f"127.0.0.1:{control_port}",
            fleet_http.address if fleet_http is not None else None,
            fleet_http.fleet.checked if fleet_http is not None else None,
            auth.cert_secret,
        )
        metrics.extra = dataplane.prometheus_text
        checked = Upstreams((str(dataplane.listen.grpc_checked),), config.grpc)
        control = SchedulingControl(
            config.mode, config.scheduling, config.workers, router, controller, metrics.repacks.inc
        )
        add_control_service(server, control)  # hloserve.gateway.v1.GatewayControl, same port
        try:
            admin = AdminServer(
                host,
                admin_at,
                metrics,
                ready=lambda: any(r.replicas for r in router.table.routes.values()),
            )
        except OSError as exc:
            raise UnavailableError(
                f"gateway: cannot serve the admin port {host}:{admin_at}: {exc}"
            ) from None
        admin.start()  # /readyz answers 503 until discovery has found a model
        if fleet_http is not None:
            fleet_http.start()
        proxy.send_checked_to(checked, routable)
        if controller is not None:  # workers must schedule fifo or edf (docs/scheduling.md)
            await check_lpt_workers(upstreams, timeout)
        await refresh()
        await server.start()
        await sync()
    except BaseException:
        await close()
        raise
    log.info("gateway: %d models over %d workers", len(router.table.routes), len(config.workers))
    log.info("gateway: listening on %s (mode %s)", address, config.mode)
    if on_ready is not None:
        on_ready(port, admin.port)

    async def every(interval_s: float, action: Callable[[], Awaitable[None]], failed: str) -> None:
        """``action`` every ``interval_s`` until ``stop``; a failed pass is logged."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)
            if stop.is_set():
                return
            try:
                await action()
            except Exception:
                log.exception(failed)

    async def probe_workers() -> None:
        """One health probe of every worker; a change re-runs discovery."""
        workers = config.workers
        answers = await asyncio.gather(*(probe_ready(upstreams, w, timeout) for w in workers))
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

    async def follow_dns() -> None:
        """A new DNS answer becomes the fleet; a DNS outage keeps it."""
        nonlocal config
        try:
            found = with_workers(config, await resolve_workers(config.discovery, timeout))
        except UnavailableError as exc:  # keep the fleet; the next resolution may work
            log.warning("%s; keeping %d workers", exc, len(config.workers))
            return
        if found.workers == config.workers:
            return
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

    health_s = config.health.interval_seconds
    tasks = [
        asyncio.ensure_future(every(health_s, probe_workers, "gateway: health probe pass failed")),
        # the old layout keeps serving when HAProxy refuses a new one; the next check retries
        asyncio.ensure_future(
            every(SYNC_INTERVAL_S, sync, "gateway: HAProxy did not take the new layout")
        ),
    ]
    if config.discovery.dns_name is not None:
        dns_s = config.discovery.dns_interval_seconds
        failed = "gateway: DNS discovery pass failed; keeping the current fleet"
        tasks.append(asyncio.ensure_future(every(dns_s, follow_dns, failed)))
    try:  # a failed discovery pass keeps the current table; the next may work
        await every(
            config.discovery.poll_interval_seconds,
            refresh,
            "gateway: discovery pass failed; keeping the current table",
        )
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await close(config.exit_timeout_seconds)
