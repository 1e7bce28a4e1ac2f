"""Reload a model whose Python backend stub process died (Triton 2.51 never restarts one), or
outside explicit mode have the worker restarted: docs/serving.md, "model control mode and dead
model processes"."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Protocol

from hloserve.model_control import RepositoryClient
from hloserve.node.tritonserver import StubProcess

log = logging.getLogger("hloserve.watchdog")


class ControlMode(Protocol):
    """Settings that name the server's ``--model-control-mode``."""

    @property
    def model_control_mode(self) -> str:
        """``explicit``, ``none`` or ``poll``."""


class StubSource(Protocol):
    """What :class:`StubWatchdog` watches: a local ``TritonServer``, or a container's
    (:class:`hloserve.node.docker_runtime.ContainerStubs`)."""

    @property
    def options(self) -> ControlMode:
        """The server's settings."""

    def stub_processes(self) -> list[StubProcess]:
        """The server's Python backend stubs, dead (unreaped) ones included."""


def describe_wait_status(status: int) -> str:
    """A ``waitpid`` status in words: "signal 9, SIGKILL" or "exit code 3"."""
    if status & 0x7F:
        number = status & 0x7F
        try:
            return f"signal {number}, {signal.Signals(number).name}"
        except ValueError:
            return f"signal {number}"
    return f"exit code {(status >> 8) & 0xFF}"


class StubWatchdog:
    """Notices dead stubs of one server (:class:`StubSource`) and reloads their models:
    ``reload(model)`` in a thread of its own; without it ``restart(model)`` has the worker
    drained and restarted; with neither, deaths are only reported. Call :meth:`check`
    periodically (one ``/proc`` scan)."""

    def __init__(
        self,
        server: StubSource,
        reload: Callable[[str], None] | None,
        report: Callable[[str], None] = log.warning,
        restart: Callable[[str], object] | None = None,
    ) -> None:
        self.server = server
        self.reload = reload
        self.restart = restart
        self.report = report
        self._seen: set[int] = set()  # dead stub pids already handled
        self._suspects: set[int] = set()  # dead at the last check, not yet handled
        self._reloading: dict[str, threading.Thread] = {}
        server.stub_processes()  # learn the live stubs' command lines (a zombie's is empty)

    def check(self) -> list[StubProcess]:
        """Report (and reload) every stub death not seen before; return those deaths (a stub
        found exited and unreaped at two checks in a row)."""
        zombies = [s for s in self.server.stub_processes() if s.dead and s.pid not in self._seen]
        # Triton reaps a stub it ended itself (unload, shutdown) at once: only a stub that is
        # still unreaped one check later died on its own.
        dead = [s for s in zombies if s.pid in self._suspects]
        self._suspects = {s.pid for s in zombies} - {s.pid for s in dead}
        self._seen |= {s.pid for s in dead}
        for model in sorted({s.model for s in dead}):
            stubs = [s for s in dead if s.model == model]
            what = ", ".join(
                f"pid {s.pid} ({s.instance}) died ({describe_wait_status(s.wait_status or 0)})"
                for s in stubs
            )
            thread = self._reloading.get(model)
            if self.reload is None and self.restart is not None:
                mode = self.server.options.model_control_mode
                self.report(
                    f"hloserve: model '{model}': Python backend stub {what}; draining and "
                    f"restarting the worker (model control mode {mode} cannot reload a model)"
                )
                self.restart(model)
            elif self.reload is None:
                self.report(
                    f"hloserve: model '{model}': Python backend stub {what}; its requests fail "
                    "until the server restarts (reloading needs --model-control-mode explicit)"
                )
            else:
                self.report(f"hloserve: model '{model}': Python backend stub {what}; reloading")
                if thread is not None and thread.is_alive():
                    continue  # the reload in flight loads fresh instances
                thread = threading.Thread(
                    target=self._reload, args=(model,), name=f"reload-{model}", daemon=True
                )
                self._reloading[model] = thread
                thread.start()
        return dead

    def join(self, timeout_s: float = 60.0) -> None:
        """Wait for the reloads in flight (tests)."""
        for thread in list(self._reloading.values()):
            thread.join(timeout_s)

    def _reload(self, model: str) -> None:
        assert self.reload is not None
        try:
            self.reload(model)
        except Exception as exc:  # reported, never raised: the watchdog keeps watching
            self.report(f"hloserve: model '{model}': reload failed: {exc}")
        else:
            self.report(f"hloserve: model '{model}': reloaded")


def stub_watchdog(
    server: StubSource,
    http_url: str,
    key: str | None,
    on_reload: Callable[[str], None],
    restart: Callable[[str], object],
    report: Callable[[str], None] = lambda line: print(line, flush=True),
) -> StubWatchdog:
    """The watchdog of a server: in explicit mode it reloads models through the repository API
    at ``http_url`` (then ``on_reload(model)``), else asks ``restart``."""
    client = RepositoryClient(http_url, key, 600.0)

    def reload(model: str) -> None:
        client.reload(model)
        on_reload(model)

    explicit = server.options.model_control_mode == "explicit"
    return StubWatchdog(server, reload if explicit else None, report, restart)
