"""The gateway's admin HTTP port: ``/healthz``, ``/readyz``, ``/metrics`` (Prometheus text).

Metrics (own registry, prefix ``hloserve_gateway_``; docs/gateway.md, "Admin port"):

- ``outstanding_items{model, worker}``: requests in flight now (HAProxy's, read from the
  router on scrape; requests, not items, since HAProxy counts requests).
- ``replicas{model}``: replicas of each model in the current routing table.
- ``placement{model, worker}``: 1 for each worker the current routing table routes a model to.
- ``table_swaps_total``: routing tables installed (discovery passes).
- ``repacks_total``: ``lpt_packing`` placements computed (startup, fleet changes, budget).
- ``haproxy_restarts_total``: HAProxy started again after its process exited (killed,
  crashed), :meth:`hloserve.gateway.haproxy.HAProxy.respawn`.
- ``worker_healthy{worker}``: 1 while a worker is in the routing table, 0 while its health
  probes keep it out.

The HTTP server is :class:`hloserve.observability.admin_http.AdminHttpServer`, on a daemon
thread: scrapes never touch the gateway's event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from hloserve.errors import HTTP_STATUS, Status
from hloserve.gateway.routing import Router
from hloserve.observability.admin_http import AdminHttpServer, Answer

PREFIX = "hloserve_gateway_"


class _RouterCollector(Collector):
    def __init__(self, router: Router) -> None:
        self._router = router

    def collect(self) -> Iterator[GaugeMetricFamily]:
        outstanding = GaugeMetricFamily(
            PREFIX + "outstanding_items",
            "Requests in flight per model and worker (HAProxy's counts).",
            labels=["model", "worker"],
        )
        for (model, worker), items in sorted(self._router.outstanding_all().items()):
            outstanding.add_metric([model, worker], items)
        yield outstanding
        replicas = GaugeMetricFamily(
            PREFIX + "replicas", "Replicas of each model in the routing table.", labels=["model"]
        )
        for model, route in sorted(self._router.table.routes.items()):
            replicas.add_metric([model], len(route.replicas))
        yield replicas
        placement = GaugeMetricFamily(
            PREFIX + "placement",
            "1 for each worker the routing table places a model on.",
            labels=["model", "worker"],
        )
        for model, route in sorted(self._router.table.routes.items()):
            for worker in route.replicas:
                placement.add_metric([model, worker], 1)
        yield placement


class GatewayMetrics:
    """The gateway's Prometheus metrics, in a registry of their own.

    Args:
        router: read at scrape time for in-flight items and the table.
    """

    #: More Prometheus text appended to :meth:`exposition` (None: nothing).
    extra: Callable[[], bytes] | None = None

    def __init__(self, router: Router) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.table_swaps = Counter(
            PREFIX + "table_swaps", "Routing tables installed.", registry=self.registry
        )
        self.repacks = Counter(
            PREFIX + "repacks", "lpt_packing placements computed.", registry=self.registry
        )
        self.haproxy_restarts = Counter(
            PREFIX + "haproxy_restarts",
            "HAProxy started again after its process exited.",
            registry=self.registry,
        )
        self.worker_healthy = Gauge(
            PREFIX + "worker_healthy",
            "1 while the worker passes its health probes (in the routing table), else 0.",
            ["worker"],
            registry=self.registry,
        )
        self.registry.register(_RouterCollector(router))

    def exposition(self) -> bytes:
        """The registry in Prometheus text format, then :attr:`extra`'s text (HAProxy's
        exporter under the HAProxy data plane)."""
        text = bytes(generate_latest(self.registry))
        return text + self.extra() if self.extra is not None else text


class AdminServer(AdminHttpServer):
    """``/healthz`` (always 200 while running), ``/readyz`` (200 when ``ready()``, else 503),
    ``/metrics`` on a daemon thread.

    Args:
        host: address to bind (the gateway's listen host).
        port: port; 0 picks a free one (see :attr:`port`).
        metrics: what ``/metrics`` serves.
        ready: readiness test, called per ``/readyz`` request; must be cheap and thread-safe.

    Raises:
        OSError: the port is taken.
    """

    def __init__(
        self, host: str, port: int, metrics: GatewayMetrics, ready: Callable[[], bool]
    ) -> None:
        def readyz() -> Answer:
            if ready():
                return 200, b"ready\n", "text/plain"
            return HTTP_STATUS[Status.UNAVAILABLE], b"not ready\n", "text/plain"

        routes = {
            "/healthz": lambda: (200, b"ok\n", "text/plain"),
            "/readyz": readyz,
            "/metrics": lambda: (200, metrics.exposition(), CONTENT_TYPE_LATEST),
        }
        super().__init__(host, port, routes, "hloserve-gateway-admin")
