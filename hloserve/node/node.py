"""``hloserve node up|down``: one tritonserver per GPU on this machine, the gateway in front.

:func:`run_node_up` plans the node (:mod:`hloserve.node.plan`), starts the workers with the
configured runtime (``process``: :class:`~hloserve.node.process_runtime.ProcessWorkers`,
local tritonservers from the nvidia-pytriton wheel, stub watchdog and restart backoff
included; ``docker``: :class:`hloserve.node.docker_runtime.DockerWorkers`, one container per
GPU), waits until each answers ``/v2/health/ready``, starts the gateway in this process when
there are two or more workers (:class:`~hloserve.node.gateway_thread.GatewayThread`), watches
the workers and stops everything on Ctrl-C/SIGTERM. Like ``hloserve serve`` it writes the
node's Prometheus scrape targets and serves the supervisor's own metrics on ``admin_port``
(:mod:`hloserve.observability.supervisor`, docs/observability.md). :func:`run_node_down`
stops a node from another shell.

docs/deployment.md describes the node file and the deployment shapes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from hloserve.errors import HloserveError
from hloserve.node.gateway_thread import GatewayThread
from hloserve.node.node_config import NodeConfig
from hloserve.node.plan import (
    NodeError,
    WorkerPlan,
    connect_host,
    gateway_config,
    gateway_enabled,
    plan_workers,
    planned_ports,
    worker_env,
)
from hloserve.node.ports import check_ports_free
from hloserve.node.process_runtime import ProcessWorkers
from hloserve.node.triton_options import TritonServerOptions

if TYPE_CHECKING:
    from hloserve.observability.supervisor import NodeObservability

log = logging.getLogger("hloserve.node")


class Workers(Protocol):
    """What :func:`run_node_up` needs of a runtime."""

    def start(self) -> None: ...

    def wait_ready(self, stop: threading.Event) -> float | None: ...

    def poll(self) -> str | None: ...

    def running(self) -> int: ...

    def stop(self) -> None: ...


def process_options(
    config: NodeConfig, plan: Sequence[WorkerPlan], model_control_key: str | None = None
) -> list[TritonServerOptions]:
    """Each worker's tritonserver options for the process runtime, as ``hloserve serve`` sets
    them (:func:`hloserve.node.serve_options.server_options`) on the worker's ports and
    environment."""
    from hloserve.node.serve_options import ServeOptions, server_options

    t = config.tritonserver
    options = []
    for worker in plan:
        serve = ServeOptions(
            path=config.repository,
            http_port=worker.http_port,
            grpc_port=worker.grpc_port,
            metrics_port=worker.metrics_port,
            host=config.host,
            model_control_mode=t.model_control_mode,
            load_models=t.load_models,
            model_control_key=model_control_key,
            tritonserver_args=t.args,
            log_verbose=t.log_verbose,
            startup_timeout_s=t.startup_timeout_s,
        )
        options.append(
            dataclasses.replace(
                server_options(serve, config.repository),
                env=worker_env(worker, docker=False),
                die_with_parent=True,
            )
        )
    return options


def _pid_file(name: str) -> Path:
    """Where a process-runtime ``node up`` records its pid for ``node down``."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"hloserve-node-{name}.pid"


def run_node_up(
    config: NodeConfig,
    *,
    stop: threading.Event | None = None,
    available_gpus: Sequence[int] | None = None,
) -> int:
    """Run the node until Ctrl-C/SIGTERM, ``stop``, or ``hloserve node down``; 0 on a clean stop.

    Args:
        config: the node settings.
        stop: set it to stop the node (signals set it too when called on the main thread).
        available_gpus: the machine's GPUs; None detects them (:func:`detect_gpus`).

    Returns:
        0 after a requested stop or ``node down``.

    Raises:
        NodeError: no Docker daemon, image missing, containers already there, a worker not
            ready; GpuNotFoundError; PortInUseError; NodeConfigError.
    """
    if not config.repository.is_dir():
        raise NodeError(f"node {config.name}: repository {config.repository} is not a directory")
    plan = plan_workers(config, available_gpus)
    ports = planned_ports(config, plan)
    for endpoint, (host, port) in ports.items():
        check_ports_free(
            host,
            {endpoint: port},
            "node: ",
            "; stop what holds it or change ports in the node file",
        )
    use_gateway = gateway_enabled(config, len(plan))
    key = None
    if config.tritonserver.model_control_mode == "explicit":  # one key for the whole node
        from hloserve.node.model_control import launcher_key

        key = launcher_key()
    gw_config = gateway_config(config, plan, key) if use_gateway else None
    stop = stop or threading.Event()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            print(f"hloserve node: {signal.Signals(signum).name}: stopping", flush=True)
            stop.set()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    workers: Workers
    if config.runtime == "docker":
        from hloserve.node.docker_runtime import DockerWorkers

        workers = DockerWorkers(config, plan, key)
    else:
        workers = ProcessWorkers(
            process_options(config, plan, key),
            restart=config.restart,
            startup_timeout_s=config.tritonserver.startup_timeout_s,
            devices=["CPU" if w.gpu is None else f"GPU {w.gpu}" for w in plan],
            name=config.name,
        )
        _pid_file(config.name).write_text(str(os.getpid()))
    gateway: GatewayThread | None = None
    observe: NodeObservability | None = None
    try:
        workers.start()
        if workers.wait_ready(stop) is None:
            return 0
        if gw_config is not None:
            gateway = GatewayThread(gw_config)
        host = connect_host(config.host)
        observe = _observability(config, plan, workers, gateway)
        lines = [f"hloserve node {config.name}: {len(plan)} worker(s) ready ({config.runtime})"]
        for w in plan:
            lines.append(
                f"  worker {w.index} {'CPU' if w.gpu is None else 'GPU ' + str(w.gpu)}: "
                f"http {host}:{w.http_port} grpc {host}:{w.grpc_port} "
                f"metrics {host}:{w.metrics_port}"
            )
        if gateway is not None:
            gw_host = config.gateway.listen.rpartition(":")[0]
            grpc_port, admin_port = gateway.port, gateway.admin_port
            http = f"http {gateway.http_address} " if gateway.http_address else ""
            lines.append(
                f"  gateway grpc {gw_host}:{grpc_port} {http}"
                f"admin http://{gw_host}:{admin_port} (/healthz /readyz /metrics) (Ctrl-C to stop)"
            )
        if observe.admin:
            lines.append(f"  admin http://{observe.admin}/metrics (supervisor)")
        print("\n".join(lines), flush=True)
        while not stop.wait(1.0):
            reason = workers.poll()
            if reason is not None:
                print(f"hloserve node: {reason}: stopping", flush=True)
                break
            observe.workers_up(workers.running())
        return 0
    finally:
        if observe is not None:
            observe.close()
        if gateway is not None:
            gateway.close()
        with contextlib.suppress(HloserveError):  # reported by the workers' own stop
            workers.stop()
        if config.runtime == "process":
            _pid_file(config.name).unlink(missing_ok=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        print(f"hloserve node {config.name}: stopped", flush=True)


def _observability(
    config: NodeConfig, plan: Sequence[WorkerPlan], workers: Any, gateway: GatewayThread | None
) -> NodeObservability:
    """The supervisor's admin port and the node's scrape targets, started, with the workers'
    restart (and, for processes, stub reload) hooks wired to its counters
    (docs/observability.md, "Scrape configuration")."""
    from hloserve.observability.supervisor import NodeObservability

    host = connect_host(config.host)
    gateway_admin = None
    if gateway is not None and gateway.admin_port:
        gw_host = connect_host(config.gateway.listen.rpartition(":")[0].strip("[]"))
        gateway_admin = f"{gw_host}:{gateway.admin_port}"
    observe = NodeObservability(
        config.name,
        config.host,
        config.admin_port,
        [f"{host}:{w.metrics_port}" for w in plan],
        gateway_admin,
        target_host=host,
    )
    workers.on_restart = observe.worker_restarted
    if isinstance(workers, ProcessWorkers):
        workers.on_stub_reload = observe.stub_reloaded
    observe.workers_up(len(plan))
    observe.start()
    return observe


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped by its parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


def run_node_down(config: NodeConfig, timeout_s: float = 60.0) -> list[str]:
    """Stop node ``config.name``: remove its containers, or SIGTERM its ``node up`` process.

    Returns:
        What was stopped (container names, or ``pid N``); empty when nothing ran.

    Raises:
        NodeError: no Docker daemon (docker runtime), or the process did not exit in time.
    """
    if config.runtime == "docker":
        from hloserve.node.docker_runtime import remove_node_containers

        return remove_node_containers(config.name, timeout_s=config.docker.stop_timeout_s)
    pid_file = _pid_file(config.name)
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return []
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pid_file.unlink(missing_ok=True)
        return []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return [f"pid {pid}"]
        time.sleep(0.2)
    raise NodeError(f"node {config.name}: process {pid} did not exit {timeout_s:g} s after SIGTERM")
