"""The docker runtime of ``hloserve node``: one tritonserver container per GPU, via the docker
SDK (:class:`DockerWorkers`; restarts are Docker's own, docs/deployment.md);
:func:`remove_node_containers` is ``hloserve node down``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hloserve.errors import NodeError, Status
from hloserve.node import docker_spec
from hloserve.node.docker_spec import loads_when_ready
from hloserve.node.model_control_client import load_all
from hloserve.node.node_config import NodeConfig, TritonConfig
from hloserve.node.plan import WorkerPlan, connect_host, device_name, restart_allowed
from hloserve.node.process_runtime import restart_delay, restarts_after
from hloserve.node.tritonserver import StubProcess, health_ready, session_stubs
from hloserve.node.watchdog import StubWatchdog, stub_watchdog

#: Docker Engine API version spoken to the daemon (Docker >= 20.10).
DOCKER_API_VERSION = "1.41"


def connect() -> Any:
    """A docker SDK client connected to the daemon (``DOCKER_HOST`` or the default socket);
    raises NodeError: the docker SDK is missing (FAILED_PRECONDITION) or no daemon answers
    (UNAVAILABLE), with what to do."""
    try:
        import docker
    except ImportError:
        raise NodeError(
            "the docker runtime needs the docker SDK: pip install 'hloserve[node]'",
            status=Status.FAILED_PRECONDITION,
        ) from None
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    hint = (
        "start it (systemctl start docker, or dockerd as root) and make sure this user may "
        "use its socket"
    )
    if host.startswith("unix://"):
        # Probe the socket first: the SDK leaks its socket when the connect fails.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5.0)
            try:
                sock.connect(host.removeprefix("unix://"))
            except OSError as exc:
                raise NodeError(
                    f"no Docker daemon answers at {host} ({exc.strerror or exc}); {hint}",
                    status=Status.UNAVAILABLE,
                ) from None
    # A fixed API version (Docker 20.10's; device requests need >= 1.40) makes no request in
    # the constructor, so a daemon that does not answer surfaces in ping().
    client = docker.from_env(version=DOCKER_API_VERSION)
    try:
        client.ping()
    except docker.errors.DockerException as exc:
        client.close()
        raise NodeError(
            f"no Docker daemon answers at {host} ({exc}); {hint}", status=Status.UNAVAILABLE
        ) from None
    return client


def node_containers(client: Any, name: str) -> list[Any]:
    """Every container (running or not) labelled ``hloserve.node=<name>``, by worker index;
    one removed while listed is left out."""
    found = client.containers.list(
        all=True, filters={"label": f"{docker_spec.LABEL_NODE}={name}"}, ignore_removed=True
    )
    return sorted(found, key=lambda c: int(c.labels.get(docker_spec.LABEL_WORKER, "0")))


def remove_node_containers(name: str, timeout_s: int = 30) -> list[str]:
    """Stop and remove every container of node ``name`` (``hloserve node down``); their names;
    raises NodeError: no Docker daemon answers, or containers remain."""
    client = connect()
    removed = node_containers(client, name)
    for container in removed:
        _stop_and_remove(container, timeout_s)
    # the node's own `node up` may be removing some at the same time: wait until all are gone
    deadline = time.monotonic() + timeout_s + 30
    while node_containers(client, name) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = node_containers(client, name)
    if left:
        raise NodeError(f"node {name}: containers {', '.join(c.name for c in left)} remain")
    return [c.name for c in removed]


def _stop_and_remove(container: Any, timeout_s: int) -> None:
    """Stop then remove one container; tolerate it being gone or removed by someone else."""
    import docker

    for step in (lambda: container.stop(timeout=timeout_s), lambda: container.remove(force=True)):
        try:
            step()
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress elsewhere
                raise


def _log_tail(container: Any) -> str:
    with contextlib.suppress(Exception):
        return str(container.logs(tail=40).decode(errors="replace")).rstrip()
    return "(no log)"


def _stream_logs(container_id: str, prefix: str, stop: threading.Event) -> None:
    """Copy one container's output to stdout, each line prefixed, across restarts."""
    import docker

    def emit(line: bytes) -> None:
        sys.stdout.write(f"{prefix} {line.decode(errors='replace')}\n")
        sys.stdout.flush()

    client = docker.from_env(version=DOCKER_API_VERSION)
    since: float | None = None
    try:
        while not stop.is_set():
            try:
                pending = b""
                logs = client.containers.get(container_id).logs(
                    stream=True, follow=True, since=since
                )
                for chunk in logs:
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        emit(line)
                    if stop.is_set():
                        return
                if pending:
                    emit(pending)
                since = time.time()
            except docker.errors.NotFound:
                return
            except docker.errors.DockerException:
                pass
            stop.wait(0.5)  # stopped (or restarting): attach again shortly
    finally:
        client.close()


class ContainerStubs:
    """The Python backend stubs of one worker container for
    :class:`~hloserve.node.watchdog.StubWatchdog`: the session of the container's init
    (``State.Pid`` as of the container's last ``reload()``) in this host's ``/proc``."""

    def __init__(self, container: Any, options: TritonConfig) -> None:
        self.container = container
        self.options = options
        self._argv: dict[int, list[str]] = {}

    def stub_processes(self) -> list[StubProcess]:
        """The container's stubs, dead (unreaped) ones included; none while it is not running."""
        state = self.container.attrs["State"]
        pid = int(state.get("Pid") or 0)
        if state.get("Status") != "running" or pid <= 0:
            return []
        return session_stubs(pid, self._argv)


class DockerWorkers:
    """The node's worker containers: start, wait ready, watch, stop. Not thread-safe."""

    def __init__(
        self, config: NodeConfig, plan: Sequence[WorkerPlan], model_control_key: str | None = None
    ) -> None:
        self.config = config
        self.plan = tuple(plan)
        self._model_control_key = model_control_key
        self._client: Any = None
        self._containers: list[Any] = []
        self._restarts: list[int] = []
        self._down: set[int] = set()
        self._running = 0
        #: Called with the worker index after each restart Docker made (metrics).
        self.on_restart: Callable[[int], None] = lambda i: None
        #: Called with the worker index and the model after each stub reload (metrics).
        self.on_stub_reload: Callable[[int, str], None] = lambda i, model: None
        self._watchdogs: dict[int, StubWatchdog] = {}
        self._recover_at: dict[int, float] = {}  # worker -> when to restart it (dead stub)
        self._recovering: set[int] = set()
        self._recoveries: dict[int, int] = {}
        self._recovered_at: dict[int, float] = {}
        self._logs_stop = threading.Event()
        self._logs: list[threading.Thread] = []

    def start(self) -> None:
        """Check the daemon, the image and leftovers, then run one container per worker; raises
        NodeError: no daemon (UNAVAILABLE), image missing (NOT_FOUND), containers of this node
        already exist (FAILED_PRECONDITION), or Docker refused a container (e.g. no NVIDIA
        runtime for the GPU device request)."""
        import docker

        self._client = client = connect()
        image = docker_spec.worker_image(self.config)
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            raise NodeError(
                f"docker image {image!r} is not present on this Docker host: build it "
                f"({docker_spec.image_build_hint(self.config)}) or pull it, or set docker.image",
                status=Status.NOT_FOUND,
            ) from None
        existing = node_containers(client, self.config.name)
        if existing:
            raise NodeError(
                f"node {self.config.name!r} already has containers "
                f"({', '.join(c.name for c in existing)}): run `hloserve node down` first",
                status=Status.FAILED_PRECONDITION,
            )
        for worker in self.plan:
            spec = docker_spec.container_spec(self.config, worker, self._model_control_key)
            try:
                container = client.containers.run(**docker_spec.to_sdk(spec))
            except docker.errors.APIError as exc:
                hint = ""
                if worker.gpu is not None and "device driver" in str(exc):
                    hint = " (GPU containers need the NVIDIA Container Toolkit on the host)"
                elif "rlimit" in str(exc):
                    hint = " (this host's hard limit is lower than docker.ulimits: lower it)"
                raise NodeError(
                    f"docker refused worker {worker.index} ({spec['name']}): "
                    f"{exc.explanation or exc}{hint}"
                ) from None
            self._containers.append(container)
            self._restarts.append(0)
            prefix = f"[worker {worker.index}]"
            stream = threading.Thread(
                target=_stream_logs, args=(container.id, prefix, self._logs_stop), daemon=True
            )
            stream.start()
            self._logs.append(stream)
            print(
                f"hloserve node: worker {worker.index} container {spec['name']} "
                f"({container.short_id}, {device_name(worker.gpu)})",
                flush=True,
            )

    def wait_ready(self, stop: threading.Event) -> float | None:
        """Poll every worker's ``/v2/health/ready`` until all answer 200, then load what each
        loads once ready (:func:`~.docker_spec.loads_when_ready`); seconds waited, or None when
        ``stop`` was set first; raises NodeError: a container exited for good, or the startup
        timeout passed (with the container's log tail)."""
        import docker

        host = connect_host(self.config.host)
        timeout = self.config.tritonserver.startup_timeout_s
        start = time.monotonic()
        waiting = set(range(len(self.plan)))
        while waiting and not stop.is_set():
            for i in sorted(waiting):
                if health_ready(f"{host}:{self.plan[i].http_port}"):
                    waiting.discard(i)
                    continue
                container = self._containers[i]
                try:
                    container.reload()
                except docker.errors.NotFound:
                    raise NodeError(
                        f"worker {i}: its container was removed while starting"
                    ) from None
                state = container.attrs["State"]
                exited = state["Status"] in ("exited", "dead") and not state.get("Restarting")
                if exited and not self._will_restart(container):
                    raise NodeError(
                        f"worker {i} ({container.name}) exited with code "
                        f"{state.get('ExitCode')} before it was ready:\n{_log_tail(container)}"
                    )
            if time.monotonic() - start > timeout:
                names = ", ".join(self._containers[i].name for i in sorted(waiting))
                raise NodeError(
                    f"workers not ready after {timeout:g} s: {names}\n"
                    f"{_log_tail(self._containers[min(waiting)])}",
                    status=Status.DEADLINE_EXCEEDED,
                )
            if waiting:
                stop.wait(0.5)
        if waiting:
            return None
        with ThreadPoolExecutor(len(self.plan)) as pool:  # every worker at once
            list(pool.map(self._load_rest, range(len(self.plan))))
        if self.config.docker.launcher == "tritonserver":
            self._watchdogs = {i: self._watchdog(i) for i in range(len(self.plan))}
        return time.monotonic() - start

    def _watchdog(self, i: int) -> StubWatchdog:
        return stub_watchdog(
            ContainerStubs(self._containers[i], self.config.tritonserver),
            f"{connect_host(self.config.host)}:{self.plan[i].http_port}",
            self._model_control_key,
            lambda model: self.on_stub_reload(i, model),
            lambda model: self._schedule_recovery(i),
            lambda line: print(f"[worker {i}] {line}", flush=True),
        )

    def _schedule_recovery(self, i: int) -> None:
        """Have :meth:`poll` restart worker ``i`` after the backoff (a dead stub)."""
        if i in self._recover_at or i in self._recovering:
            return
        now = time.monotonic()
        restarts = restarts_after(self._recoveries.get(i, 0), self._recovered_at.get(i, 0.0), now)
        delay = restart_delay(restarts)
        self._recoveries[i] = restarts + 1
        self._recover_at[i] = now + delay
        print(
            f"hloserve node: worker {i} ({self._containers[i].name}): restart "
            f"{self._recoveries[i]} in {delay:g} s to recover a dead Python backend stub",
            flush=True,
        )

    def _recover(self, i: int) -> None:
        """Restart worker ``i``'s container gracefully, then load what it loads once ready."""
        import docker

        try:
            self._containers[i].restart(timeout=self.config.docker.stop_timeout_s)
            self._recovered_at[i] = time.monotonic()
            self.on_restart(i)
            if loads_when_ready(self.config, self.plan[i], self._model_control_key):
                self._load_when_ready(i)
        except docker.errors.DockerException as exc:
            print(f"hloserve node: worker {i}: restart failed: {exc}", flush=True)
        finally:
            self._recovering.discard(i)

    def _load_rest(self, i: int) -> None:
        later = loads_when_ready(self.config, self.plan[i], self._model_control_key)
        if later:
            url = f"{connect_host(self.config.host)}:{self.plan[i].http_port}"
            timeout = self.config.tritonserver.startup_timeout_s
            load_all(url, self._model_control_key, later, timeout)

    def _load_when_ready(self, i: int) -> None:
        """After a restart of worker ``i``: wait until it is ready, then load the rest."""
        address = f"{connect_host(self.config.host)}:{self.plan[i].http_port}"
        deadline = time.monotonic() + self.config.tritonserver.startup_timeout_s
        while time.monotonic() < deadline and not self._logs_stop.is_set():
            if health_ready(address):
                with contextlib.suppress(Exception):  # Triton keeps each reason
                    self._load_rest(i)
                return
            self._logs_stop.wait(0.5)

    def _will_restart(self, container: Any) -> bool:
        exit_code = container.attrs["State"].get("ExitCode", 0)
        return restart_allowed(
            self.config.restart, exit_code, container.attrs.get("RestartCount", 0)
        )

    def poll(self) -> str | None:
        """Report restarts and workers down for good; a reason to stop (the containers were
        removed: ``hloserve node down``), else None."""
        import docker

        running = 0
        for i, container in enumerate(self._containers):
            try:
                container.reload()
            except docker.errors.NotFound:
                return f"worker {i}'s container was removed (hloserve node down?)"
            count = int(container.attrs.get("RestartCount", 0))
            if count != self._restarts[i]:
                self._restarts[i] = count
                self._down.discard(i)
                print(
                    f"hloserve node: worker {i} ({container.name}) restarted by Docker "
                    f"(restart {count}, policy {self.config.restart.policy})",
                    flush=True,
                )
                self.on_restart(i)
                if loads_when_ready(self.config, self.plan[i], self._model_control_key):
                    threading.Thread(target=self._load_when_ready, args=(i,), daemon=True).start()
            state = container.attrs["State"]
            running += state["Status"] == "running"
            if i in self._recover_at and time.monotonic() >= self._recover_at[i]:
                del self._recover_at[i]
                self._recovering.add(i)
                threading.Thread(target=self._recover, args=(i,), daemon=True).start()
            watchdog = self._watchdogs.get(i)
            idle = i not in self._recover_at and i not in self._recovering
            if watchdog is not None and idle and state["Status"] == "running":
                watchdog.check()
            if (
                state["Status"] in ("exited", "dead")
                and i not in self._down
                and not self._will_restart(container)
            ):
                self._down.add(i)
                print(
                    f"hloserve node: worker {i} ({container.name}) is down (exit code "
                    f"{state.get('ExitCode')}); the restart policy allows no more restarts",
                    flush=True,
                )
        self._running = running
        return None

    def running(self) -> int:
        """How many worker containers were running at the last :meth:`poll`."""
        return self._running

    def stop(self) -> None:
        """Stop and remove every container this object started; idempotent."""
        import docker

        timeout = self.config.docker.stop_timeout_s
        for container in self._containers:
            with contextlib.suppress(docker.errors.DockerException):
                _stop_and_remove(container, timeout)
        self._logs_stop.set()
        for stream in self._logs:
            stream.join(timeout=5.0)
        self._containers = []
        if self._client is not None:
            self._client.close()
            self._client = None
