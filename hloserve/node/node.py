"""``hloserve node up|down``: one tritonserver per GPU on this machine, the gateway in front,
run by the supervisor ``serve`` uses too (docs/deployment.md).
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from hloserve.errors import NodeError
from hloserve.model_control import launcher_key
from hloserve.node.node_config import NodeConfig
from hloserve.node.plan import (
    NodePlan,
    device_name,
    gateway_config,
    gateway_enabled,
    plan_workers,
    planned_ports,
)
from hloserve.node.procfs import proc_stat
from hloserve.node.serve_options import node_server_options
from hloserve.node.supervisor import Workers, run_node, stop_on_signals
from hloserve.ports import check_ports_free

log = logging.getLogger("hloserve.node")


def _pid_file(name: str) -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"hloserve-node-{name}.pid"


def run_node_up(
    config: NodeConfig,
    *,
    stop: threading.Event | None = None,
    available_gpus: Sequence[int] | None = None,
) -> int:
    """Run the node until Ctrl-C/SIGTERM, ``stop``, or ``hloserve node down`` (0), or until
    nothing is left to serve (1); ``available_gpus`` None: detected; raises NodeError: no Docker
    daemon, image missing, containers already there, a worker not ready; GpuNotFoundError;
    PortInUseError; NodeConfigError."""
    if not config.repository.is_dir():
        raise NodeError(f"node {config.name}: repository {config.repository} is not a directory")
    plan = plan_workers(config, available_gpus)
    hint = "; stop what holds it or change ports in the node file"
    for endpoint, (host, port) in planned_ports(config, plan).items():
        check_ports_free(host, {endpoint: port}, "node: ", hint)
    explicit = config.tritonserver.model_control_mode == "explicit"
    key = launcher_key() if explicit else None  # one key for the whole node
    node = NodePlan(
        servers=tuple(node_server_options(config, w, key) for w in plan),
        gateway=gateway_config(config, plan, key) if gateway_enabled(config, len(plan)) else None,
        devices=tuple(device_name(w.gpu) for w in plan),
        restart=config.restart,
        name=config.name,
        prefix=f"hloserve node {config.name}",
        host=config.host,
        admin_port=config.admin_port,
        startup_timeout_s=config.tritonserver.startup_timeout_s,
    )
    stop = stop or threading.Event()
    workers: Workers | None = None
    if config.runtime == "docker":
        from hloserve.node.docker_runtime import DockerWorkers

        workers = DockerWorkers(config, plan, key)
    else:
        _pid_file(config.name).write_text(str(os.getpid()))
    try:
        with stop_on_signals(stop, node.prefix):
            return run_node(node, stop, workers=workers)
    finally:
        if config.runtime == "process":
            _pid_file(config.name).unlink(missing_ok=True)


def run_node_down(config: NodeConfig, timeout_s: float = 60.0) -> list[str]:
    """Stop node ``config.name``: remove its containers, or SIGTERM its ``node up`` process; what
    was stopped (container names, or ``pid N``); raises NodeError: no Docker daemon (docker
    runtime), or the process did not exit in time."""
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
        stat = proc_stat(pid)  # a zombie, exited but not yet reaped, does not run
        if stat is None or stat[0] == "Z":
            return [f"pid {pid}"]
        time.sleep(0.2)
    raise NodeError(f"node {config.name}: process {pid} did not exit {timeout_s:g} s after SIGTERM")
