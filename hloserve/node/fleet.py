"""Several local tritonservers behind one gateway: what ``hloserve serve --workers N`` runs.

One model repository (built once) is served by N tritonserver processes ("workers"), each on
three consecutive ports (HTTP, gRPC, metrics) from a base port, or on free ports when the base
is 0. The gateway (:func:`hloserve.gateway.app.run_gateway`) runs on its own event loop in a
thread of this process, listening on the conventional gRPC port, and routes over the workers'
gRPC endpoints. A worker that dies is left to the gateway's health probes (it leaves the
routing table); the other workers and the gateway keep serving. :meth:`LocalFleet.close` stops
the gateway, then every worker.

The same class drives the end-to-end tests and ``benchmarks/gateway_overhead.py``, which also
use :meth:`LocalFleet.kill_worker` and :meth:`LocalFleet.restart_worker`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from hloserve.gateway.config import GatewayConfig
from hloserve.node.gateway_thread import GatewayThread
from hloserve.node.plan import describe_exit
from hloserve.node.process_runtime import wait_all_ready
from hloserve.node.tritonserver import (
    TritonServer,
    TritonServerError,
    TritonServerOptions,
)
from hloserve.node.watchdog import stub_watchdog

if TYPE_CHECKING:
    from hloserve.node.watchdog import StubWatchdog
    from hloserve.observability.supervisor import NodeObservability

log = logging.getLogger("hloserve.serve")


class LocalFleet:
    """N local tritonservers and the gateway in front of them.

    Args:
        workers: the options of each worker (distinct ports).
        gateway: the gateway's settings (its ``workers`` are the workers' gRPC endpoints).
        die_with_parent: a SIGKILLed parent takes the workers down too (``serve``); this
            forks through a pre-exec hook, which a process that has imported JAX (tests)
            should avoid.

    Use as a context manager or call :meth:`start` and :meth:`close`.
    """

    def __init__(
        self,
        workers: Sequence[TritonServerOptions],
        gateway: GatewayConfig,
        *,
        die_with_parent: bool = True,
    ) -> None:
        self.worker_options = [
            dataclasses.replace(w, die_with_parent=die_with_parent) for w in workers
        ]
        self.gateway_config = gateway
        self.servers = [TritonServer(o) for o in self.worker_options]
        self.gateway: GatewayThread | None = None

    def start(
        self, timeout_s: float | None = None, stop: threading.Event | None = None
    ) -> float | None:
        """Start every worker, wait until all are ready, then start the gateway.

        Args:
            timeout_s: seconds the workers may take to become ready (default: their
                ``startup_timeout_s``).
            stop: when set during start-up, return None at once (Ctrl-C).

        Returns:
            Seconds waited for the workers, or None when ``stop`` was set.

        Raises:
            TritonServerError: a worker exited or was not ready in time.
            NodeError: the gateway did not start.
        """
        for server in self.servers:
            server.start()
        limit = timeout_s
        if limit is None:
            limit = max(s.options.startup_timeout_s for s in self.servers)
        waited = wait_all_ready(self.servers, limit, stop)
        if waited is None:
            return None
        self.gateway = GatewayThread(self.gateway_config)
        return waited

    def kill_worker(self, index: int, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send ``sig`` to worker ``index`` (default SIGKILL: it dies without warning), wait
        for it and clean up after it."""
        server = self.servers[index]
        if server.pid is not None and server.is_running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(server.pid, sig)
        server.stop(timeout_s=10.0)

    def restart_worker(self, index: int, timeout_s: float | None = None) -> float:
        """Start worker ``index`` again on its ports and wait until it is ready.

        Returns:
            Seconds waited.
        """
        self.servers[index].stop()
        self.servers[index] = TritonServer(self.worker_options[index])
        self.servers[index].start()
        return self.servers[index].wait_ready(timeout_s)

    def exit_codes(self) -> list[int | None]:
        """Each worker's exit status, None while it runs (or was never started)."""
        return [s.exit_code() for s in self.servers]

    def close(self) -> None:
        """Stop the gateway, then every worker (idempotent); the first worker error is raised
        after all were stopped."""
        if self.gateway is not None:
            self.gateway.close()
        errors: list[TritonServerError] = []
        for server in self.servers:
            try:
                server.stop()
            except TritonServerError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> LocalFleet:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def supervise(
    fleet: LocalFleet,
    stop: threading.Event,
    report: Callable[[str], None],
    poll_s: float = 0.5,
    observe: NodeObservability | None = None,
) -> int:
    """Watch a started fleet until ``stop`` is set (0) or nothing is left to serve (1).

    A worker that exits is reported once and left to the gateway's health probes; the others
    and the gateway keep running. A model whose Python backend stub dies on a worker is
    reloaded there (:class:`~hloserve.node.watchdog.StubWatchdog`). Returns 1 when the gateway
    stops by itself or every worker has exited.
    """

    def watchdog(i: int, server: TritonServer) -> StubWatchdog:
        counted = None if observe is None else (lambda m: observe.stub_reloaded(i, m))
        return stub_watchdog(server, counted)

    reported: set[int] = set()
    watchdogs = {id(server): watchdog(i, server) for i, server in enumerate(fleet.servers)}
    while not stop.wait(poll_s):
        for i, server in enumerate(fleet.servers):
            if id(server) not in watchdogs:  # restarted by restart_worker
                watchdogs[id(server)] = watchdog(i, server)
                if observe is not None:
                    observe.worker_restarted(i)
            if server.is_running():
                watchdogs[id(server)].check()
        if observe is not None:
            observe.workers_up(sum(s.is_running() for s in fleet.servers))
        for i, code in enumerate(fleet.exit_codes()):
            if code is not None and i not in reported:
                reported.add(i)
                left = len(fleet.servers) - len(reported)
                grpc = fleet.servers[i].urls.grpc
                report(
                    f"hloserve: worker {i} (gRPC {grpc}) {describe_exit(code)};"
                    f" the gateway drops it, {left} worker(s) keep serving"
                )
        if len(reported) == len(fleet.servers):
            report("hloserve: every worker has exited; stopping")
            return 1
        if fleet.gateway is not None and not fleet.gateway.is_running():
            report("hloserve: the gateway stopped; stopping")
            return 1
    return 0
