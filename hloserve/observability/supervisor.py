"""What a supervising process (``hloserve serve``, ``hloserve node up``) publishes while it
runs a node: the ``hloserve_node_*`` metrics, ``/healthz`` and ``/models`` on its admin port,
and the node's scrape targets (docs/observability.md lists the metrics).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from hloserve.errors import HTTP_STATUS, AdminPortError, Status
from hloserve.observability.admin_http import AdminHttpServer, Answer
from hloserve.observability.targets import NodeTargets, write_targets

#: The supervisor's admin port: the one after Triton's 8000-8002.
DEFAULT_ADMIN_PORT = 8003


class NodeMetrics:
    """The supervisor's metrics in a registry of their own; ``workers``: ``worker0``, ...."""

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
    """``/metrics``, ``/healthz`` and ``/models`` (JSON rows from :attr:`models`; 404 while
    None, 503 when it raises) on ``host:port``; OSError when the port is taken."""

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


log = logging.getLogger("hloserve.observability")


class NodeObservability:
    """The supervisor's admin port and scrape-target file for one node.

    Args:
        node: the node's name (``node`` label, file name), e.g. ``serve-8001``.
        admin_port: None = :data:`DEFAULT_ADMIN_PORT`, off with a warning when taken; 0 = a
            free port.
        worker_metrics: each worker's metrics ``host:port``.
        target_host: the address the target file names for the admin port (default ``host``).

    Raises:
        AdminPortError: (UNAVAILABLE) an explicit ``admin_port`` is taken.
    """

    def __init__(
        self,
        node: str,
        host: str,
        admin_port: int | None,
        worker_metrics: Sequence[str],
        gateway_admin: str | None = None,
        targets_dir: Path | None = None,
        target_host: str | None = None,
    ) -> None:
        self.metrics = NodeMetrics([f"worker{i}" for i in range(len(worker_metrics))])
        self._server: NodeAdminServer | None = None
        try:
            port = DEFAULT_ADMIN_PORT if admin_port is None else admin_port
            self._server = NodeAdminServer(self.metrics, host, port)
        except OSError as exc:
            if admin_port is not None:
                raise AdminPortError(
                    f"the admin port {host}:{admin_port} cannot be bound ({exc.strerror}); "
                    "choose another with --admin-port"
                ) from None
            log.warning(
                "admin port %s:%d is taken (%s): the supervisor's metrics are off "
                "(--admin-port to choose another)",
                host,
                DEFAULT_ADMIN_PORT,
                exc.strerror,
            )
        self.admin = f"{target_host or host}:{self._server.port}" if self._server else None
        self._targets = NodeTargets(node, list(worker_metrics), gateway_admin, self.admin)
        self._targets_dir = targets_dir
        self._file: Path | None = None

    def start(self) -> None:
        """Serve the admin port and write the target file."""
        if self._server is not None:
            self._server.start()
        try:
            self._file = write_targets(self._targets, self._targets_dir)
        except OSError as exc:  # a read-only home must not stop the node
            log.warning("cannot write the Prometheus target file: %s", exc)

    def serve_models(self, rows: Callable[[], list[dict[str, Any]]]) -> None:
        """Answer ``/models`` on the admin port with ``rows()`` (no-op when the port is off)."""
        if self._server is not None:
            self._server.models = rows

    def workers_up(self, count: int) -> None:
        """Record how many workers are running now."""
        self.metrics.workers_up.set(count)

    def stub_reloaded(self, worker: int, model: str) -> None:
        """Count a model reloaded after its stub died on worker ``worker``."""
        self.metrics.stub_reloads.labels(worker=f"worker{worker}", model=model).inc()

    def worker_restarted(self, worker: int) -> None:
        """Count a restart of worker ``worker``."""
        self.metrics.restarts.labels(worker=f"worker{worker}").inc()

    def close(self) -> None:
        """Remove the target file and close the admin port."""
        if self._file is not None:
            self._file.unlink(missing_ok=True)
            self._file = None
        if self._server is not None:
            self._server.close()
            self._server = None

    def __enter__(self) -> NodeObservability:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
