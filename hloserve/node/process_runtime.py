"""The process runtime: the node's workers as local tritonservers (nvidia-pytriton wheel).

:func:`wait_all_ready` is the one start-up wait of every local tritonserver (``hloserve serve``,
``serve --workers``, ``node up``): slices of at most 2 s, so that Ctrl-C is honoured, counted by
the wall clock. :class:`ProcessWorkers` runs one tritonserver per planned worker for
``hloserve node up``: each worker's output goes to ``<run dir>/worker<i>.log`` and is copied to
stdout with a ``[worker i]`` prefix; :meth:`ProcessWorkers.poll` reloads a model whose Python
backend stub died (:class:`~hloserve.node.watchdog.StubWatchdog`) and restarts a worker that
exited, under the node's restart policy, after Docker's restart backoff
(:data:`RESTART_BACKOFF_S`), so that both runtimes restart alike.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from hloserve.errors import HloserveError
from hloserve.node.node_config import RestartConfig
from hloserve.node.plan import WorkerPlan, describe_exit, restart_allowed
from hloserve.node.tritonserver import TritonServer, TritonServerError, TritonServerOptions
from hloserve.node.watchdog import StubWatchdog, stub_watchdog

#: Longest slice of one readiness poll, in seconds (a stop request waits at most this long).
READY_SLICE_S = 2.0
#: Delay before the first restart of a worker, doubled at each further restart up to
#: :data:`RESTART_BACKOFF_MAX_S`; reset after the worker ran :data:`RESTART_RESET_S`. Docker's
#: restart manager uses the same numbers (100 ms doubling, at most 1 minute, reset after 10 s;
#: https://docs.docker.com/engine/containers/start-containers-automatically/).
RESTART_BACKOFF_S = 0.1
RESTART_BACKOFF_MAX_S = 60.0
RESTART_RESET_S = 10.0


def wait_all_ready(
    servers: Sequence[TritonServer], timeout_s: float, stop: threading.Event | None = None
) -> float | None:
    """Wait until every started server answers ``/v2/health/ready``, one after the other.

    Args:
        servers: started servers.
        timeout_s: seconds all of them may take together, counted by the wall clock from the
            call (each failed poll counts what it really took).
        stop: when set, return None at the next slice (Ctrl-C during start-up).

    Returns:
        Seconds waited, or None when ``stop`` was set first.

    Raises:
        TritonServerError: a server exited, or ``timeout_s`` passed (the message holds the
            server's log tail).
    """
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
    """Local tritonservers, one per planned worker, watched and restarted by this process.

    Args:
        plan: the workers (index, GPU, ports), as :func:`~hloserve.node.plan.plan_workers`
            made them.
        options: each worker's server options (same order as ``plan``); their ``log_file``
            is set to ``<run dir>/worker<i>.log`` and ``die_with_parent`` on.
        restart: the node's restart policy.
        startup_timeout_s: seconds the workers may take to get ready.
        name: the node's name (the run directory's prefix).
        report: receives one line per event (start, restart, stub reload).
    """

    def __init__(
        self,
        plan: Sequence[WorkerPlan],
        options: Sequence[TritonServerOptions],
        restart: RestartConfig,
        startup_timeout_s: float,
        name: str = "node",
        report: Callable[[str], None] = lambda line: print(line, flush=True),
    ) -> None:
        import dataclasses

        self.plan = tuple(plan)
        self.restart = restart
        self.startup_timeout_s = startup_timeout_s
        self._report = report
        self._run_dir = Path(tempfile.mkdtemp(prefix=f"hloserve-node-{name}-"))
        self.options = [
            dataclasses.replace(
                o, log_file=self._run_dir / f"worker{w.index}.log", die_with_parent=True
            )
            for w, o in zip(self.plan, options, strict=True)
        ]
        self._servers: list[TritonServer] = []
        self._watchdogs: list[StubWatchdog | None] = []
        self._restarts = [0] * len(self.plan)
        self._restart_at: dict[int, float] = {}  # worker -> when its pending restart is due
        self._started_at = [0.0] * len(self.plan)
        self._down: set[int] = set()
        self._logs_stop = threading.Event()
        self._logs: list[threading.Thread] = []

    def start(self) -> None:
        """Launch every worker (no waiting); their logs are followed with a prefix."""
        for worker, options in zip(self.plan, self.options, strict=True):
            server = TritonServer(options)
            server.start()
            self._servers.append(server)
            self._watchdogs.append(None)
            self._started_at[worker.index] = time.monotonic()
            follower = threading.Thread(
                target=follow_log,
                args=(self._run_dir / f"worker{worker.index}.log", f"[worker {worker.index}]"),
                kwargs={"stop": self._logs_stop},
                daemon=True,
            )
            follower.start()
            self._logs.append(follower)
            gpu = "CPU" if worker.gpu is None else f"GPU {worker.gpu}"
            self._report(f"hloserve node: worker {worker.index} pid {server.pid} ({gpu})")

    def wait_ready(self, stop: threading.Event) -> bool:
        """Wait until every worker answers ``/v2/health/ready`` (False if ``stop`` came first).

        Raises:
            TritonServerError: a worker exited or did not get ready in time (its log tail).
        """
        if wait_all_ready(self._servers, self.startup_timeout_s, stop) is None:
            return False
        self._watchdogs = [stub_watchdog(s) for s in self._servers]
        return True

    def poll(self) -> str | None:
        """Reload models whose stub died; restart workers that exited, under the restart
        policy and after the backoff; never asks to stop."""
        now = time.monotonic()
        for i, server in enumerate(self._servers):
            if i in self._down:
                continue
            if i in self._restart_at:
                if now >= self._restart_at[i]:
                    self._restart(i)
                continue
            code = server.exit_code()
            if code is None:
                watchdog = self._watchdogs[i]
                if watchdog is not None:
                    watchdog.check()
                continue
            if now - self._started_at[i] >= RESTART_RESET_S:
                self._restarts[i] = 0  # it ran long enough: the backoff starts over
            how = describe_exit(code)
            if not restart_allowed(self.restart, code, self._restarts[i]):
                self._down.add(i)
                self._report(f"hloserve node: worker {i} {how}; the restart policy says stay down")
                continue
            self._restarts[i] += 1
            delay = restart_delay(self._restarts[i] - 1)
            self._report(
                f"hloserve node: worker {i} {how}; restart {self._restarts[i]} in {delay:g} s"
            )
            with contextlib.suppress(HloserveError):
                server.stop(timeout_s=5.0)
            self._watchdogs[i] = None
            self._restart_at[i] = now + delay
        return None

    def _restart(self, i: int) -> None:
        del self._restart_at[i]
        replacement = TritonServer(self.options[i])
        self._servers[i] = replacement
        self._started_at[i] = time.monotonic()
        try:
            replacement.start()
        except HloserveError as exc:
            self._report(f"hloserve node: worker {i} could not restart: {exc}")
            self._down.add(i)
            return
        # the stubs' watchdog starts once the new worker has loaded its models
        self._watchdogs[i] = None
        threading.Thread(target=self._watch_when_ready, args=(i, replacement), daemon=True).start()

    def _watch_when_ready(self, i: int, server: TritonServer) -> None:
        with contextlib.suppress(HloserveError):
            server.wait_ready(self.startup_timeout_s)
            if i < len(self._servers) and self._servers[i] is server and server.is_running():
                self._watchdogs[i] = stub_watchdog(server)

    def stop(self) -> None:
        """Stop every worker (and its stubs), then the log followers; idempotent."""
        for server in self._servers:
            with contextlib.suppress(HloserveError):
                server.stop()
        self._servers = []
        self._watchdogs = []
        self._restart_at = {}
        self._logs_stop.set()
        for follower in self._logs:
            follower.join(timeout=5.0)
        shutil.rmtree(self._run_dir, ignore_errors=True)
