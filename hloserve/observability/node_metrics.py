"""The supervising process's own metrics: workers up and restarts, on an admin port.

``hloserve serve`` (one worker or ``--workers N``) and ``hloserve node up`` supervise
tritonservers; what they see (a worker died and was restarted, a model's stub died and was
reloaded) exists nowhere else, so they publish it on their own admin port (``--admin-port``,
default :data:`DEFAULT_ADMIN_PORT`) as Prometheus text, with ``/healthz``:

=======================================================  =======  ==================================
``hloserve_node_workers``                                 gauge    workers the node runs
``hloserve_node_workers_up``                              gauge    workers whose process is running
``hloserve_node_worker_restarts_total{worker}``           counter  worker processes restarted
``hloserve_node_stub_reloads_total{worker,model}``        counter  dead model stubs reloaded
=======================================================  =======  ==================================

``/models`` answers JSON, ``{"models": [{"name", "version", "state", "reason", "last_reload",
"error"}, ...]}``: each model's Triton version and state with what ``serve --watch`` last did
to it (:mod:`hloserve.node.watch`); ``hloserve status --models`` prints it. It answers 404
where the supervisor has no model list (``--workers``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from hloserve.errors import HTTP_STATUS, Status
from hloserve.observability.admin_http import AdminHttpServer, Answer

#: The supervisor's admin port: the one after Triton's 8000 (HTTP), 8001 (gRPC), 8002
#: (metrics, or the gateway's admin port with several workers).
DEFAULT_ADMIN_PORT = 8003


class NodeMetrics:
    """The supervisor's metrics in a registry of their own.

    Args:
        workers: the workers' names (``worker0``, ...), as in the scrape targets' labels.
    """

    def __init__(self, workers: Sequence[str]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.workers = Gauge(
            "hloserve_node_workers", "Workers the node runs.", registry=self.registry
        )
        self.workers_up = Gauge(
            "hloserve_node_workers_up",
            "Workers whose tritonserver process is running.",
            registry=self.registry,
        )
        self.restarts = Counter(
            "hloserve_node_worker_restarts",
            "Worker processes (or containers) restarted by the supervisor.",
            ["worker"],
            registry=self.registry,
        )
        self.stub_reloads = Counter(
            "hloserve_node_stub_reloads",
            "Models reloaded because their Python backend stub died.",
            ["worker", "model"],
            registry=self.registry,
        )
        self.workers.set(len(workers))
        self.workers_up.set(0)
        for worker in workers:
            self.restarts.labels(worker=worker)  # every series exists from the start at 0

    def exposition(self) -> bytes:
        """The Prometheus text of every metric here."""
        return generate_latest(self.registry)


class NodeAdminServer(AdminHttpServer):
    """``/metrics`` and ``/healthz`` of :class:`NodeMetrics` on ``host:port`` (a thread), and
    ``/models`` once :attr:`models` is set (503 when it raises: the server is not answering).

    Attributes:
        models: returns the JSON-ready rows of ``/models``; None = 404.

    Raises:
        OSError: the port is taken.
    """

    def __init__(self, metrics: NodeMetrics, host: str, port: int) -> None:
        self.models: Callable[[], list[dict[str, Any]]] | None = None

        def models() -> Answer:
            if self.models is None:
                return HTTP_STATUS[Status.NOT_FOUND], b"not found\n", "text/plain"
            try:
                rows = self.models()
            except Exception as exc:  # the server is not answering
                return HTTP_STATUS[Status.UNAVAILABLE], f"{exc}\n".encode(), "text/plain"
            return 200, json.dumps({"models": rows}).encode(), "application/json"

        routes = {
            "/metrics": lambda: (200, metrics.exposition(), CONTENT_TYPE_LATEST),
            "/healthz": lambda: (200, b"ok\n", "text/plain"),
            "/models": models,
        }
        super().__init__(host, port, routes, "hloserve-node-admin")
