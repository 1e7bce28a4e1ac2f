"""The one supervisor of ``hloserve serve`` and ``node up``: :func:`run_node` runs a
:class:`~hloserve.node.plan.NodePlan`, its workers and gateway, until stopped (docs/deployment.md).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from hloserve.errors import HloserveError
from hloserve.model_control import RepositoryClient
from hloserve.node.gateway_thread import GatewayThread
from hloserve.node.plan import NodePlan, connect_host
from hloserve.node.process_runtime import ProcessWorkers
from hloserve.node.tritonserver import TritonServer

if TYPE_CHECKING:
    from hloserve.observability.supervisor import NodeObservability

#: What :func:`run_node` enters once the node is ready (``serve --watch``'s watcher).
Serving = Callable[["Node", "NodeObservability"], contextlib.AbstractContextManager[Any]]


class Workers(Protocol):
    """What :class:`Node` needs of a runtime (process workers or docker containers)."""

    on_restart: Callable[[int], None]
    on_stub_reload: Callable[[int, str], None]

    def start(self) -> None:
        """Start every worker (returns once each was launched, not once it is ready)."""

    def wait_ready(self, stop: threading.Event) -> float | None:
        """Seconds until every worker was ready, or None when ``stop`` was set first."""

    def poll(self) -> str | None:
        """Restart what died under the restart policy; a reason to stop the node, else None."""

    def running(self) -> int:
        """How many workers are running now."""

    def stop(self) -> None:
        """Stop every worker and wait for it to exit."""


class Node:
    """A node's workers (None: :class:`ProcessWorkers` of ``plan``) and, when planned, the
    gateway in front. Use as a context manager or call :meth:`start` and :meth:`close`."""

    def __init__(self, plan: NodePlan, workers: Workers | None = None) -> None:
        self.plan = plan
        self.workers: Workers = workers or ProcessWorkers(plan)
        self.gateway: GatewayThread | None = None

    @property
    def servers(self) -> list[TritonServer]:
        """The process workers' servers, by index (a restarted worker has a new one)."""
        assert isinstance(self.workers, ProcessWorkers), "only process workers have servers"
        return self.workers.servers

    def start(self, stop: threading.Event | None = None) -> float | None:
        """Start every worker, wait until all are ready, then start the gateway; seconds waited,
        or None when ``stop`` was set during start-up; raises TritonServerError: a worker exited
        or was not ready in time; NodeError: a container or the gateway did not start."""
        stop = stop or threading.Event()
        started = time.monotonic()
        self.workers.start()
        if self.workers.wait_ready(stop) is None:
            return None
        self._wait_loaded(stop, started)
        if self.plan.gateway is not None:
            self.gateway = GatewayThread(self.plan.gateway)
        return time.monotonic() - started

    def _wait_loaded(self, stop: threading.Event, started: float) -> None:
        """Wait (within the start-up timeout) until every model of a worker loading ``*`` is
        READY or UNAVAILABLE: a docker worker's own ``serve`` loads them after readiness."""
        timeout_s = self.plan.ready_timeout_s
        host = connect_host(self.plan.host)
        for o in self.plan.servers:
            if "*" not in o.load_models:
                continue
            control = RepositoryClient(f"{host}:{o.http_port}", o.model_control_key, 30.0)
            while not stop.is_set() and time.monotonic() - started < timeout_s:
                if all(m.get("state") in ("READY", "UNAVAILABLE") for m in control.index()):
                    break
                stop.wait(0.2)

    def kill_worker(self, index: int, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send ``sig`` to process worker ``index`` and clean up after it (tests)."""
        assert isinstance(self.workers, ProcessWorkers)
        self.workers.kill_worker(index, sig)

    def restart_worker(self, index: int, timeout_s: float | None = None) -> float:
        """Start process worker ``index`` again on its ports; seconds waited until ready."""
        assert isinstance(self.workers, ProcessWorkers)
        return self.workers.restart_worker(index, timeout_s)

    def supervise(self, stop: threading.Event, observe: NodeObservability) -> int:
        """Poll the workers until ``stop`` is set or the runtime says the node was stopped
        (0), or until nothing is left to serve (1)."""
        workers, prefix = self.workers, self.plan.prefix
        while not stop.wait(0.5):
            reason = workers.poll()
            if reason is not None:
                print(f"{prefix}: {reason}; stopping", flush=True)
                return 0
            observe.workers_up(workers.running())
            if isinstance(workers, ProcessWorkers) and len(workers.down()) == len(self.servers):
                print(f"{prefix}: every worker has exited; stopping", flush=True)
                return 1
            if self.gateway is not None and not self.gateway.is_running():
                print(f"{prefix}: the gateway stopped; stopping", flush=True)
                return 1
        return 0

    def close(self) -> None:
        """Stop the gateway, then every worker (idempotent); the first worker error is raised
        after all were stopped."""
        if self.gateway is not None:
            self.gateway.close()
        self.workers.stop()

    def __enter__(self) -> Node:
        try:
            self.start()
            return self
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event, prefix: str) -> Iterator[threading.Event]:
    """Set ``stop`` on SIGINT or SIGTERM while the block runs (on the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        print(f"{prefix}: received {signal.Signals(signum).name}: stopping", flush=True)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_node(
    plan: NodePlan,
    stop: threading.Event,
    *,
    workers: Workers | None = None,
    serving: Serving | None = None,
) -> int:
    """Run ``plan`` until ``stop`` is set (0) or nothing is left to serve (1) on ``workers``
    (None: process workers); ``serving`` is entered once the node is ready (``--watch``); raises
    HloserveError: a worker or the gateway did not start."""
    from hloserve.node.watcher import serve_model_list, server_model_control
    from hloserve.observability.supervisor import NodeObservability

    node = Node(plan, workers)
    stack = contextlib.ExitStack()
    try:
        waited = node.start(stop)
        if waited is None:  # Ctrl-C during start-up
            return 0
        host = connect_host(plan.host)
        gateway_admin = None
        if node.gateway is not None and node.gateway.admin_port:
            listen_host = node.gateway.config.listen.rpartition(":")[0].strip("[]")
            gateway_admin = f"{connect_host(listen_host)}:{node.gateway.admin_port}"
        observe = stack.enter_context(
            NodeObservability(
                plan.name,
                plan.host,
                plan.admin_port,
                [f"{host}:{s.metrics_port}" for s in plan.servers if s.metrics_port],
                gateway_admin,
                target_host=host,
            )
        )
        node.workers.on_restart = observe.worker_restarted
        node.workers.on_stub_reload = observe.stub_reloaded
        observe.workers_up(len(plan.servers))
        lines = []
        if (gateway := node.gateway) is not None:
            mode = gateway.config.mode
            lines.append(f"  gateway gRPC    {gateway.address} (KServe V2, mode {mode})")
            if gateway.http_address:
                lines.append(f"  gateway HTTP    http://{gateway.http_address} (KServe V2)")
            if gateway_admin:
                lines.append(f"  gateway admin   http://{gateway_admin}/metrics, /healthz, /readyz")
        if observe.admin:
            lines.append(f"  admin http://{observe.admin}/metrics (supervisor)")
        failed = 0
        for i, options in enumerate(plan.servers):
            url = f"{host}:{options.http_port}"
            for model in RepositoryClient(url, options.model_control_key, 30.0).index():
                state, reason = model.get("state", "UNKNOWN"), model.get("reason", "")
                failed += state != "READY"
                why = f" - {reason}" if reason else ""
                lines.append(f"  worker {i} model {model['name']}: {state}{why}")
        lines.append(
            f"{plan.prefix}: ready after {waited:.1f} s, {len(plan.servers)} worker(s) ready"
            + (f", {failed} model(s) NOT ready" if failed else "")
            + " (Ctrl-C to stop)"
        )
        print("\n".join(lines), flush=True)
        if serving is not None:
            stack.enter_context(serving(node, observe))
        elif isinstance(node.workers, ProcessWorkers):
            serve_model_list(observe, server_model_control(node.servers, 30.0))
        return node.supervise(stop, observe)
    finally:
        stack.close()
        with contextlib.suppress(HloserveError):  # reported by the workers' own stop
            node.close()
        print(f"{plan.prefix}: stopped", flush=True)
