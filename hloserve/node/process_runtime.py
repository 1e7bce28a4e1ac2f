"""The process runtime: the node's workers as local tritonservers (:class:`ProcessWorkers`),
restarted as Docker would (docs/deployment.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

from hloserve.errors import HloserveError, TritonServerError
from hloserve.node.model_control_client import load_all
from hloserve.node.plan import NodePlan, describe_exit, restart_allowed, runtime_first
from hloserve.node.tritonserver import TritonServer
from hloserve.node.watchdog import StubWatchdog, stub_watchdog

#: Longest slice of one readiness poll, in seconds (a stop request waits at most this long).
READY_SLICE_S = 2.0
#: Docker's restart backoff: 100 ms doubling, at most 1 minute, reset after 10 s of running
#: (https://docs.docker.com/engine/containers/start-containers-automatically/).
RESTART_BACKOFF_S = 0.1
RESTART_BACKOFF_MAX_S = 60.0
RESTART_RESET_S = 10.0


def wait_all_ready(
    servers: Sequence[TritonServer], timeout_s: float, stop: threading.Event | None = None
) -> float | None:
    """Wait until every started server is ready, within ``timeout_s`` s of wall clock for all, in
    slices of :data:`READY_SLICE_S`; seconds waited, or None once ``stop`` is set; raises
    TritonServerError: a server exited, or ``timeout_s`` passed (with its log tail)."""
    start = time.monotonic()
    for server in servers:
        while True:
            if stop is not None and stop.is_set():
                return None
            left = timeout_s - (time.monotonic() - start)
            try:
                server.wait_ready(timeout_s=min(READY_SLICE_S, max(left, 0.1)))
                break
            except TritonServerError:
                if not server.is_running() or time.monotonic() - start >= timeout_s:
                    raise
    return time.monotonic() - start


def restarts_after(restarts: int, up_since: float, now: float) -> int:
    """``restarts`` so far, or 0 once the worker has been up :data:`RESTART_RESET_S` since
    ``up_since`` (``time.monotonic()`` seconds): the backoff starts over."""
    return 0 if now - up_since >= RESTART_RESET_S else restarts


def restart_delay(restarts: int) -> float:
    """Seconds to wait before restart number ``restarts + 1`` (:data:`RESTART_BACKOFF_S`)."""
    return min(RESTART_BACKOFF_S * 2.0**restarts, RESTART_BACKOFF_MAX_S)


def follow_log(path: Path, prefix: str, stop: threading.Event) -> None:
    """Copy the lines appended to ``path`` to stdout with ``prefix`` until ``stop``."""
    handle: IO[str] | None = None
    try:
        while not stop.is_set():
            if handle is None:
                try:
                    handle = path.open(errors="replace")
                except OSError:
                    stop.wait(0.2)
                    continue
            line = handle.readline()
            if line:
                sys.stdout.write(f"{prefix} {line if line.endswith(chr(10)) else line + chr(10)}")
                sys.stdout.flush()
            else:
                stop.wait(0.2)
    finally:
        if handle is not None:
            handle.close()


class ProcessWorkers:
    """Local tritonservers, one per planned worker, watched and restarted by this process;
    each one's output is copied to stdout as ``[worker i] ...``."""

    def __init__(
        self, plan: NodePlan, report: Callable[[str], None] = lambda line: print(line, flush=True)
    ) -> None:
        self.plan = plan
        self.startup_timeout_s = plan.ready_timeout_s
        self._prefix = plan.prefix
        self.report = report
        self.on_restart: Callable[[int], None] = lambda i: None
        self.on_stub_reload: Callable[[int, str], None] = lambda i, model: None
        self._run_dir = Path(tempfile.mkdtemp(prefix=f"hloserve-node-{plan.name}-"))
        self.options = [
            dataclasses.replace(runtime_first(o)[0], log_file=self._run_dir / f"worker{i}.log")
            for i, o in enumerate(plan.servers)
        ]
        self._then_load = [runtime_first(o)[1] for o in plan.servers]
        count = len(self.options)
        self.servers = [TritonServer(o) for o in self.options]
        self._watchdogs: list[StubWatchdog | None] = [None] * count
        self._restarts = [0] * count
        self._restart_at: dict[int, float] = {}  # worker -> when its pending restart is due
        self._started_at = [0.0] * count
        self._down: set[int] = set()
        self._draining: dict[int, threading.Thread | None] = {}  # stub died: drain, restart
        self._logs_stop = threading.Event()
        self._logs: list[threading.Thread] = []

    def start(self) -> None:
        """Launch every worker (no waiting) and follow their logs."""
        for i, server in enumerate(self.servers):
            server.start()
            self._started_at[i] = time.monotonic()
            log = self._run_dir / f"worker{i}.log"
            follower = threading.Thread(
                target=follow_log, args=(log, f"[worker {i}]", self._logs_stop), daemon=True
            )
            follower.start()
            self._logs.append(follower)
            on = f" on {self.plan.devices[i]}" if self.plan.devices else ""
            u = server.urls
            self.report(
                f"{self._prefix}: worker {i} tritonserver (pid {server.pid}){on}: HTTP "
                f"http://{u.http}  gRPC {u.grpc}  metrics http://{u.metrics}/metrics"
            )

    def wait_ready(self, stop: threading.Event | None = None) -> float | None:
        """Wait until every worker is ready, load the rest of its models, start the stub
        watchdogs; seconds waited, or None once ``stop`` is set; raises TritonServerError: a
        worker exited or did not get ready in time (its log tail)."""
        start = time.monotonic()
        if wait_all_ready(self.servers, self.startup_timeout_s, stop) is None:
            return None
        with ThreadPoolExecutor(len(self.servers)) as pool:  # every worker at once
            list(pool.map(self._load_rest, range(len(self.servers)), self.servers))
        self._watchdogs = [self._watchdog(i, s) for i, s in enumerate(self.servers)]
        return time.monotonic() - start

    def _load_rest(self, i: int, server: TritonServer) -> None:
        if self._then_load[i]:
            key = server.options.model_control_key
            load_all(server.urls.http, key, self._then_load[i], self.startup_timeout_s)

    def _watchdog(self, i: int, server: TritonServer) -> StubWatchdog:
        return stub_watchdog(
            server,
            server.urls.http,
            server.options.model_control_key,
            lambda model: self.on_stub_reload(i, model),
            lambda model: self._draining.setdefault(i, None),  # poll() drains and restarts it
        )

    def _drain(self, i: int, server: TritonServer, delay: float) -> None:
        """Stop worker ``i`` gracefully, then have :meth:`poll` restart it ``delay`` s later."""
        with contextlib.suppress(HloserveError):
            server.stop(timeout_s=30.0)
        if self.servers[i] is server:
            self._restart_at[i] = time.monotonic() + delay
        self._draining.pop(i, None)

    def running(self) -> int:
        """How many workers run now."""
        return sum(s.is_running() for s in self.servers)

    def down(self) -> set[int]:
        """The workers that stay down (the restart policy allows no more restarts)."""
        return set(self._down)

    def poll(self) -> str | None:
        """Reload models whose stub died; restart workers that exited, under the restart
        policy and after the backoff. Never asks to stop (returns None)."""
        now, restart = time.monotonic(), self.plan.restart
        for i, server in enumerate(self.servers):
            if i in self._down:
                continue
            if i in self._draining:
                if self._draining[i] is None:
                    self._restarts[i] = restarts_after(self._restarts[i], self._started_at[i], now)
                    delay = restart_delay(self._restarts[i])
                    self._restarts[i] += 1
                    self._watchdogs[i] = None
                    self.report(
                        f"{self._prefix}: worker {i} drained to recover a dead Python backend"
                        f" stub; restart {self._restarts[i]} in {delay:g} s after it stops"
                    )
                    drain = threading.Thread(
                        target=self._drain, args=(i, server, delay), daemon=True
                    )
                    self._draining[i] = drain
                    drain.start()
                continue
            if i in self._restart_at:
                if now >= self._restart_at[i]:
                    del self._restart_at[i]
                    self._relaunch(i, wait=False)
                continue
            code = server.exit_code()
            if code is None:
                watchdog = self._watchdogs[i]
                if watchdog is not None and server.is_running():
                    watchdog.check()
                continue
            self._restarts[i] = restarts_after(self._restarts[i], self._started_at[i], now)
            how = describe_exit(code)
            self._watchdogs[i] = None
            if not restart_allowed(restart, code, self._restarts[i]):
                self._down.add(i)
                left = len(self.servers) - len(self._down)
                self.report(
                    f"{self._prefix}: worker {i} (gRPC {server.urls.grpc}) {how}; the restart "
                    f"policy ({restart.policy}) keeps it down, {left} worker(s) keep serving"
                )
                continue
            self._restarts[i] += 1
            delay = restart_delay(self._restarts[i] - 1)
            self.report(
                f"{self._prefix}: worker {i} {how}; restart {self._restarts[i]} in {delay:g} s"
            )
            with contextlib.suppress(HloserveError):
                server.stop(timeout_s=5.0)
            self._restart_at[i] = now + delay
        return None

    def kill_worker(self, index: int, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send ``sig`` to worker ``index``, wait for it and clean up after it."""
        server = self.servers[index]
        if server.pid is not None and server.is_running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(server.pid, sig)
        server.stop(timeout_s=10.0)

    def restart_worker(self, index: int, timeout_s: float | None = None) -> float:
        """Start worker ``index`` again on its ports; seconds waited until it is ready; raises
        TritonServerError: it did not start or get ready."""
        self.servers[index].stop()
        self._restart_at.pop(index, None)
        return self._relaunch(index, wait=True, timeout_s=timeout_s)

    def _relaunch(self, i: int, *, wait: bool, timeout_s: float | None = None) -> float:
        """A new server for worker ``i``, watched once ready (in a thread unless ``wait``)."""
        replacement = TritonServer(self.options[i])
        self.servers[i] = replacement
        self._down.discard(i)
        self._watchdogs[i] = None
        self._started_at[i] = time.monotonic()
        self.on_restart(i)
        try:
            replacement.start()
        except HloserveError as exc:
            if wait:
                raise
            self.report(f"{self._prefix}: worker {i} could not restart: {exc}")
            self._down.add(i)
            return 0.0
        if wait:
            waited = replacement.wait_ready(timeout_s)
            self._load_rest(i, replacement)
            self._watchdogs[i] = self._watchdog(i, replacement)
            return waited
        threading.Thread(target=self._watch_when_ready, args=(i, replacement), daemon=True).start()
        return 0.0

    def _watch_when_ready(self, i: int, server: TritonServer) -> None:
        with contextlib.suppress(HloserveError):
            server.wait_ready(self.startup_timeout_s)
            self._load_rest(i, server)
            if i < len(self.servers) and self.servers[i] is server and server.is_running():
                self._watchdogs[i] = self._watchdog(i, server)

    def stop(self) -> None:
        """Stop every worker, then the log followers (idempotent); the first worker error is
        raised after all were stopped."""
        errors: list[HloserveError] = []
        self._restart_at = {}
        for server in self.servers:
            try:
                server.stop()
            except HloserveError as exc:
                errors.append(exc)
        self._logs_stop.set()
        for follower in self._logs:
            follower.join(timeout=5.0)
        shutil.rmtree(self._run_dir, ignore_errors=True)
        if errors:
            raise errors[0]
