"""Several local tritonservers behind one gateway: what ``hloserve serve --workers N`` runs.

One model repository (built once) is served by N tritonserver processes ("workers"), each on
three consecutive ports (HTTP, gRPC, metrics) from a base port, or on free ports when the base
is 0 (:func:`hloserve.node.plan.worker_ports`). The workers are the node's process runtime
(:class:`~hloserve.node.process_runtime.ProcessWorkers`; ``serve`` restarts a worker that
dies, restart policy ``on-failure``, as ``node up`` does); the gateway
(:class:`~hloserve.node.gateway_thread.GatewayThread`) runs on its own event loop in a thread of
this process, listening on the conventional gRPC port, and routes over the workers' gRPC
endpoints. A worker that dies is left to the gateway's health probes (it leaves the routing
table until it is back); the other workers and the gateway keep serving.
:meth:`LocalFleet.close` stops the gateway, then every worker.

The same class drives the end-to-end tests and ``benchmarks/gateway_overhead.py``, which also
use :meth:`LocalFleet.kill_worker` and :meth:`LocalFleet.restart_worker`.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from hloserve.gateway.config import GatewayConfig
from hloserve.node.gateway_thread import GatewayThread
from hloserve.node.node_config import RestartConfig
from hloserve.node.process_runtime import ProcessWorkers
from hloserve.node.triton_options import TritonServerOptions
from hloserve.node.tritonserver import TritonServer

if TYPE_CHECKING:
    from hloserve.observability.supervisor import NodeObservability


class LocalFleet:
    """N local tritonservers and the gateway in front of them.

    Args:
        workers: the options of each worker (distinct ports).
        gateway: the gateway's settings (its ``workers`` are the workers' gRPC endpoints).
        die_with_parent: a SIGKILLed parent takes the workers down too (``serve``); this
            forks through a pre-exec hook, which a process that has imported JAX (tests)
            should avoid.
        restart: what happens to a worker that exits (:class:`RestartConfig`; None = ``no``,
            it stays down); applied by :func:`supervise`'s polls.

    Use as a context manager or call :meth:`start` and :meth:`close`.
    """

    def __init__(
        self,
        workers: Sequence[TritonServerOptions],
        gateway: GatewayConfig,
        *,
        die_with_parent: bool = True,
        restart: RestartConfig | None = None,
    ) -> None:
        self.worker_options = [
            dataclasses.replace(w, die_with_parent=die_with_parent) for w in workers
        ]
        self.gateway_config = gateway
        self.workers = ProcessWorkers(
            self.worker_options, restart=restart, follow_logs=False, prefix="hloserve"
        )
        self.gateway: GatewayThread | None = None

    @property
    def servers(self) -> list[TritonServer]:
        """The workers' servers, by index (a restarted worker has a new one)."""
        return self.workers.servers

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
        if timeout_s is not None:
            self.workers.startup_timeout_s = timeout_s
        self.workers.start()
        waited = self.workers.wait_ready(stop)
        if waited is None:
            return None
        self.gateway = GatewayThread(self.gateway_config)
        return waited

    def kill_worker(self, index: int, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send ``sig`` to worker ``index`` (default SIGKILL: it dies without warning), wait
        for it and clean up after it."""
        self.workers.kill_worker(index, sig)

    def restart_worker(self, index: int, timeout_s: float | None = None) -> float:
        """Start worker ``index`` again on its ports and wait until it is ready.

        Returns:
            Seconds waited.
        """
        return self.workers.restart_worker(index, timeout_s)

    def exit_codes(self) -> list[int | None]:
        """Each worker's exit status, None while it runs (or was never started)."""
        return self.workers.exit_codes()

    def close(self) -> None:
        """Stop the gateway, then every worker (idempotent); the first worker error is raised
        after all were stopped."""
        if self.gateway is not None:
            self.gateway.close()
        self.workers.stop()

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

    A worker that exits is reported once, restarted under the fleet's restart policy, and left
    to the gateway's health probes meanwhile; the others and the gateway keep running. A model
    whose Python backend stub dies on a worker is reloaded there
    (:class:`~hloserve.node.watchdog.StubWatchdog`). Both are the fleet's
    :meth:`~hloserve.node.process_runtime.ProcessWorkers.poll`. Returns 1 when the gateway
    stops by itself or every worker is down for good.
    """
    fleet.workers.report = report
    if observe is not None:
        fleet.workers.on_restart = observe.worker_restarted
        fleet.workers.on_stub_reload = observe.stub_reloaded
    while not stop.wait(poll_s):
        fleet.workers.poll()
        if observe is not None:
            observe.workers_up(fleet.workers.running())
        if len(fleet.workers.down()) == len(fleet.servers):
            report("hloserve: every worker has exited; stopping")
            return 1
        if fleet.gateway is not None and not fleet.gateway.is_running():
            report("hloserve: the gateway stopped; stopping")
            return 1
    return 0
