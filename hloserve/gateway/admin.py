"""The gateway's admin HTTP port: ``/healthz``, ``/readyz``, ``/metrics`` (docs/gateway.md,
"Admin port"), on a daemon thread.
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
    """The gateway's Prometheus metrics in their own registry (the router read on scrape)."""

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
        """The registry in Prometheus text, then :attr:`extra`'s (HAProxy's exporter)."""
        text = bytes(generate_latest(self.registry))
        return text + self.extra() if self.extra is not None else text


class AdminServer(AdminHttpServer):
    """``/healthz``, ``/readyz`` (200 when ``ready()``, else 503), ``/metrics``; port 0: a free one.

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
