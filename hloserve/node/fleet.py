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

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hloserve.errors import InvalidArgumentError
from hloserve.gateway.config import ENV_PREFIX, GatewayConfig, load_config
from hloserve.node.tritonserver import (
    TritonServer,
    TritonServerError,
    TritonServerOptions,
    free_ports,
)

log = logging.getLogger("hloserve.serve")

#: Ports each worker takes from the base: HTTP, gRPC, metrics.
PORTS_PER_WORKER = 3


@dataclass(frozen=True)
class WorkerPorts:
    """The three ports of one worker."""

    http: int
    grpc: int
    metrics: int


def worker_ports(count: int, base: int, host: str = "127.0.0.1") -> list[WorkerPorts]:
    """Ports of ``count`` workers: worker i takes ``base + 3i`` .. ``base + 3i + 2``.

    Args:
        count: number of workers, >= 1.
        base: first port; 0 picks free ports instead (tests).
        host: the address the ports are probed on when ``base`` is 0.

    Raises:
        InvalidArgumentError: ``count`` < 1, or the range leaves 1..65535.
    """
    if count < 1:
        raise InvalidArgumentError(f"--workers must be at least 1, got {count}")
    if base == 0:
        free = free_ports(PORTS_PER_WORKER * count, host)
        chunks = [free[i : i + PORTS_PER_WORKER] for i in range(0, len(free), PORTS_PER_WORKER)]
        return [WorkerPorts(*chunk) for chunk in chunks]
    last = base + PORTS_PER_WORKER * count - 1
    if base < 1 or last > 65535:
        raise InvalidArgumentError(
            f"worker ports {base}..{last} ({count} workers x {PORTS_PER_WORKER}) "
            "are not all in 1..65535"
        )
    return [
        WorkerPorts(*(base + PORTS_PER_WORKER * i + k for k in range(PORTS_PER_WORKER)))
        for i in range(count)
    ]


def fleet_gateway_config(
    workers: Sequence[TritonServerOptions],
    listen: str,
    admin_port: int,
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> GatewayConfig:
    """The gateway's settings for a local fleet: the file and ``HLOSERVE_GATEWAY_*``, with
    ``workers``, ``worker_metrics``, ``listen``, ``admin_port`` and (when the workers restrict
    their repository API) ``upstream.model_control_key`` set from the fleet.

    Raises:
        GatewayConfigError: the file or an environment override is invalid.
    """
    env = dict(os.environ if environ is None else environ)
    env[ENV_PREFIX + "WORKERS"] = ",".join(f"{w.host}:{w.grpc_port}" for w in workers)
    env[ENV_PREFIX + "WORKER_METRICS"] = ",".join(
        f"{w.host}:{w.metrics_port}" for w in workers if w.metrics_port is not None
    )
    env[ENV_PREFIX + "LISTEN"] = listen
    env[ENV_PREFIX + "ADMIN_PORT"] = str(admin_port)
    keys = sorted({w.model_control_key for w in workers if w.model_control_key})
    if keys:  # restricted repository API: discovery needs the key (serve gives one to all)
        env[ENV_PREFIX + "UPSTREAM__MODEL_CONTROL_KEY"] = keys[0]
    return load_config(path, env)


class GatewayThread:
    """:func:`~hloserve.gateway.app.run_gateway` on its own event loop in a daemon thread.

    Args:
        config: the gateway's settings (``config.listen`` port 0 = a free port).
        start_timeout_s: how long to wait for the gateway to accept calls.

    Raises:
        TritonServerError: the gateway did not start (its exception is chained).
    """

    def __init__(self, config: GatewayConfig, start_timeout_s: float = 60.0) -> None:
        self.config = config
        self.port = 0
        self.admin_port = 0
        self.error: BaseException | None = None
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hloserve-gateway", daemon=True)
        self._thread.start()
        if not self._ready.wait(start_timeout_s) or self.error is not None:
            self.close()
            raise TritonServerError(f"gateway did not start on {config.listen}") from self.error

    @property
    def address(self) -> str:
        """host:port of the gateway's gRPC endpoint."""
        return f"{self.config.listen.rpartition(':')[0]}:{self.port}"

    def is_running(self) -> bool:
        """Whether the gateway's thread is still serving."""
        return self._thread.is_alive()

    def _on_ready(self, port: int, admin_port: int) -> None:
        self.port, self.admin_port = port, admin_port
        self._ready.set()

    def _run(self) -> None:
        from hloserve.gateway.app import run_gateway

        try:
            self._loop.run_until_complete(
                run_gateway(self.config, self._stop, on_ready=self._on_ready)
            )
        except BaseException as exc:  # reported by the constructor or the supervisor
            self.error = exc
            log.exception("gateway stopped with an error")
        finally:
            self._ready.set()
            self._loop.close()

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the gateway and wait for its thread (idempotent)."""
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout_s)


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
            TritonServerError: a worker exited or was not ready in time; the gateway failed.
        """
        for server in self.servers:
            server.start()
        start = time.monotonic()
        for server in self.servers:
            limit = timeout_s if timeout_s is not None else server.options.startup_timeout_s
            while True:
                if stop is not None and stop.is_set():
                    return None
                try:
                    server.wait_ready(timeout_s=2.0)
                    break
                except TritonServerError:
                    if not server.is_running() or time.monotonic() - start >= limit:
                        raise
        waited = time.monotonic() - start
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


def describe_exit(code: int) -> str:
    """'was killed by SIGKILL' or 'exited with code 3'."""
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def supervise(
    fleet: LocalFleet, stop: threading.Event, report: Callable[[str], None], poll_s: float = 0.5
) -> int:
    """Watch a started fleet until ``stop`` is set (0) or nothing is left to serve (1).

    A worker that exits is reported once and left to the gateway's health probes; the others
    and the gateway keep running. A model whose Python backend stub dies on a worker is
    reloaded there (:class:`~hloserve.node.watchdog.StubWatchdog`). Returns 1 when the gateway
    stops by itself or every worker has exited.
    """
    from hloserve.node.serve import stub_watchdog

    reported: set[int] = set()
    watchdogs = {id(server): stub_watchdog(server) for server in fleet.servers}
    while not stop.wait(poll_s):
        for server in fleet.servers:
            if id(server) not in watchdogs:  # restarted by restart_worker
                watchdogs[id(server)] = stub_watchdog(server)
            if server.is_running():
                watchdogs[id(server)].check()
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
