"""Worker health from consecutive probe failures (docs/gateway.md, "Health probes")."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from hloserve.gateway.routing import RoutingTable


class HealthTracker:
    """Which workers are healthy, from probe outcomes; every worker starts healthy.

    Raises:
        ValueError: ``failure_threshold`` < 1.
    """

    def __init__(self, workers: Iterable[str], failure_threshold: int) -> None:
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {failure_threshold}")
        self._threshold = failure_threshold
        self._failures = {w: 0 for w in workers}
        self._unhealthy: set[str] = set()

    def record(self, worker: str, ok: bool) -> bool:
        """Record one probe of ``worker``; True when its health changed."""
        if ok:
            self._failures[worker] = 0
            if worker in self._unhealthy:
                self._unhealthy.discard(worker)
                return True
            return False
        self._failures[worker] = self._failures.get(worker, 0) + 1
        if worker not in self._unhealthy and self._failures[worker] >= self._threshold:
            self._unhealthy.add(worker)
            return True
        return False

    def retain(self, workers: Iterable[str]) -> None:
        """Track exactly ``workers``: new ones start healthy, gone ones are forgotten."""
        kept = set(workers)
        self._failures = {w: self._failures.get(w, 0) for w in kept}
        self._unhealthy &= kept

    @property
    def unhealthy(self) -> frozenset[str]:
        """Workers currently out of the table."""
        return frozenset(self._unhealthy)

    def is_healthy(self, worker: str) -> bool:
        """Whether ``worker`` may be routed to."""
        return worker not in self._unhealthy


def restrict_to_healthy(table: RoutingTable, unhealthy: frozenset[str]) -> RoutingTable:
    """``table`` without the ``unhealthy`` workers (noted); a model keeps its entry, maybe empty."""
    if not unhealthy:
        return table
    why = "unreachable (failed its health probes)"
    return table.with_routes(
        {
            name: dataclasses.replace(
                route, replicas=tuple(w for w in route.replicas if w not in unhealthy)
            )
            for name, route in table.routes.items()
        },
        unready={
            name: {w: why for w in route.replicas if w in unhealthy}
            for name, route in table.routes.items()
            if any(w in unhealthy for w in route.replicas)
        },
    )
