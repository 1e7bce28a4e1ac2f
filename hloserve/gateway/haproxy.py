"""Run HAProxy (``haproxy -W``, 2.6 or newer) as the gateway's data plane and change it live.

Same backends: map edits over the runtime API (HAProxy 2.6 management guide 9.3); other
backends: a hitless reload (SIGUSR2); docs/gateway.md, "Data plane".
"""

from __future__ import annotations

import atexit
import contextlib
import csv
import io
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from hloserve.errors import InvalidArgumentError, UnavailableError
from hloserve.gateway.config import GatewayConfig
from hloserve.gateway.dataplane import Layout, Listen, map_changes, render_config, render_map
from hloserve.ports import free_ports

log = logging.getLogger("hloserve.gateway")

#: Environment variable naming another HAProxy binary (default: ``haproxy`` on PATH).
HAPROXY_ENV = "HLOSERVE_HAPROXY"

#: Seconds HAProxy may take to accept its runtime socket after a start or a reload.
START_TIMEOUT_S = 10.0

#: Wait before HAProxy is started again after its master exited: first and most, seconds.
RESTART_BACKOFF_S = (0.1, 5.0)

#: Seconds HAProxy must run after a start for the next restart to wait the shortest time.
RESTART_RESET_S = 30.0


def find_haproxy() -> str:
    """Path of the HAProxy binary (``$HLOSERVE_HAPROXY``, else ``haproxy`` on PATH).

    Raises:
        UnavailableError: no such binary; the message names the package to install.
    """
    name = os.environ.get(HAPROXY_ENV, "haproxy")
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")
    if path is None:
        raise UnavailableError(
            f"gateway: HAProxy ({name!r}) is not installed; it is the gateway's data plane. "
            "Install the 'haproxy' package (Debian/Ubuntu: apt-get install -y haproxy, 2.6 or "
            f"newer) or set {HAPROXY_ENV} to its path"
        )
    return path


def runtime_command(path: str, command: str, timeout_s: float = 5.0) -> str:
    """Send one command to an HAProxy CLI socket and return its answer.

    Raises:
        OSError: the socket cannot be reached.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(path)
        sock.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def master_ready(path: str, timeout_s: float) -> bool:
    """Whether the master answers ``show proc`` within ``timeout_s`` (then it handles SIGUSR2)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        data = b""
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(1.0)
            sock.connect(path)
            sock.sendall(b"show proc\n")
            while b"# programs" not in data and (chunk := sock.recv(65536)):
                data += chunk
        if b"# programs" in data:
            return True
        time.sleep(0.05)
    return False


class HAProxy:
    """One HAProxy master-worker process serving a :class:`Layout`; the master gets SIGTERM when
    the thread that started it dies (``setpriv --pdeathsig``).

    Raises:
        UnavailableError: HAProxy is missing, refuses the configuration or cannot bind.
        InvalidArgumentError: a TLS file cannot be read.
    """

    def __init__(
        self,
        config: GatewayConfig,
        grpc: str,
        control: str,
        http_control: str | None = None,
        http_checked: str | None = None,
        client_cert_secret: str | None = None,
    ) -> None:
        self.binary = find_haproxy()
        self.config = config
        self._dir = Path(tempfile.mkdtemp(prefix="hloserve-haproxy-"))
        pem = client_ca = None
        if config.tls is not None:
            pem = str(self._dir / "tls.pem")
            try:
                text = config.tls.cert.read_text().rstrip() + "\n" + config.tls.key.read_text()
                if config.tls.client_ca is not None:
                    client_ca = str(config.tls.client_ca.resolve(strict=True))
            except OSError as exc:
                shutil.rmtree(self._dir, ignore_errors=True)
                raise InvalidArgumentError(
                    f"gateway: tls: cannot read {exc.filename}: {exc.strerror}"
                ) from None
            fd = os.open(pem, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(text)
        prometheus_port, checked_port = free_ports(2)
        self.listen = Listen(
            grpc=grpc,
            control=control,
            http=config.http_listen,
            http_control=http_control,
            http_checked=http_checked,
            prometheus=f"127.0.0.1:{prometheus_port}",
            grpc_checked=f"127.0.0.1:{checked_port}",
            runtime_socket=str(self._dir / "runtime.sock"),
            map_file=str(self._dir / "models.map"),
            pem=pem,
            client_ca=client_ca,
            verify_client=config.tls.verify_client if config.tls is not None else "required",
            client_cert_secret=client_cert_secret if client_ca is not None else None,
        )
        self.master_socket = str(self._dir / "master.sock")
        self.config_file = self._dir / "haproxy.cfg"
        self.layout = Layout()
        #: Times the master was started again after it exited (:meth:`respawn`).
        self.restarts = 0
        self._backoff_s = 0.0
        self._started_at = 0.0
        self._carried: dict[tuple[str, str], int] = {}
        self._routed: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._write(self.layout)
        atexit.register(self.close)  # no HAProxy left behind by an interpreter that exits
        self._start()

    def _write(self, layout: Layout) -> None:
        text = render_config(layout, self.config, self.listen, self.master_socket)
        Path(self.listen.map_file).write_text(render_map(layout.models))
        self.config_file.write_text(text)

    def _start(self) -> None:
        self._spawn()
        try:
            self.wait_started()
        except UnavailableError:
            self.close()
            raise

    def _spawn(self) -> None:
        self._started_at = time.monotonic()
        log_file = self._dir / "haproxy.log"
        with open(log_file, "ab") as out:
            argv = [self.binary, "-W", "-S", self.master_socket, "-f", str(self.config_file)]
            setpriv = shutil.which("setpriv")  # util-linux: PR_SET_PDEATHSIG, then exec
            if setpriv is not None:
                argv = [setpriv, "--pdeathsig", "TERM", *argv]
            self._process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_started(self) -> None:
        """Block until the worker and the master answer on their sockets.

        Raises:
            UnavailableError: not within :data:`START_TIMEOUT_S`, ending with HAProxy's output.
        """
        ok = self._wait_runtime(lambda answer: "Name: HAProxy" in answer)
        if not ok or not master_ready(self.master_socket, START_TIMEOUT_S):
            text = (self._dir / "haproxy.log").read_text(errors="replace").strip()[-2000:]
            raise UnavailableError(
                f"gateway: cannot listen on {self.listen.grpc}: HAProxy did not start: "
                f"{text or 'no output'}"
            )

    def exited(self) -> int | None:
        """The master's exit status once it exited by itself (``Popen.returncode``), else None."""
        process = self._process
        return None if process is None else process.poll()

    def restart_delay(self) -> float:
        """Seconds before the next :meth:`respawn` (:data:`RESTART_BACKOFF_S`, doubling)."""
        first, most = RESTART_BACKOFF_S
        if time.monotonic() - self._started_at >= RESTART_RESET_S:
            self._backoff_s = 0.0
        self._backoff_s = first if self._backoff_s == 0.0 else min(most, 2 * self._backoff_s)
        return self._backoff_s

    def respawn(self) -> bool:
        """Start the exited master again (then call :meth:`wait_started`); False while it runs."""
        with self._lock:
            if self.exited() is None:
                return False
            self._carried = dict(self._routed)
            self._write(self.layout)
            self._spawn()
            self.restarts += 1
            return True

    def _wait_runtime(self, ok: object) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                return False
            with contextlib.suppress(OSError):
                if ok(runtime_command(self.listen.runtime_socket, "show info")):  # type: ignore[operator]
                    return True
            time.sleep(0.05)
        return False

    @property
    def pid(self) -> int | None:
        """The master's process id (None once stopped)."""
        return self._process.pid if self._process is not None else None

    def prometheus_text(self, timeout_s: float = 2.0) -> bytes:
        """HAProxy's own Prometheus metrics; empty when unreachable."""
        try:
            url = f"http://{self.listen.prometheus}/metrics"
            with urllib.request.urlopen(url, timeout=timeout_s) as reply:
                return bytes(reply.read())
        except OSError:
            return b""

    def runtime(self, command: str) -> str:
        """One runtime API command on the current worker's socket."""
        return runtime_command(self.listen.runtime_socket, command)

    def counts(self) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
        """(requests routed, requests in flight) per (model, worker), routed kept over reloads."""
        routed = dict(self._carried)
        inflight: dict[tuple[str, str], int] = {}
        model_of = {backend: model for model, backend in self.layout.models.items()}
        model_of |= {"h_" + b[2:]: m for b, m in model_of.items()}  # KServe HTTP backends
        for row in self._stat_rows():
            backend, server = row.get("pxname", ""), row.get("svname", "")
            if backend not in model_of or not server.startswith("w") or not server[1:].isdigit():
                continue
            key = (model_of[backend], self.config.workers[int(server[1:])])
            routed[key] = routed.get(key, 0) + int(row.get("stot") or 0)
            inflight[key] = inflight.get(key, 0) + int(row.get("scur") or 0)
        self._routed = routed
        return routed, inflight

    def _stat_rows(self) -> list[dict[str, str]]:
        return list(csv.DictReader(io.StringIO(self.runtime("show stat").lstrip("# "))))

    def apply(self, layout: Layout, config: GatewayConfig | None = None) -> None:
        """Serve ``layout`` (and ``config``'s workers): map edits, else a hitless reload.

        Raises:
            UnavailableError: the reload did not come up (the old worker keeps serving).
        """
        with self._lock:
            fleet = config is not None and (
                config.workers != self.config.workers
                or config.worker_http != self.config.worker_http
            )
            if layout == self.layout and not fleet:
                return
            if not fleet and layout.same_backends(self.layout):
                self._edit_map(self.layout.models, layout.models)
                self.layout = layout
                return
            with contextlib.suppress(OSError, ValueError):
                self._carried = self.counts()[0]
            if fleet:
                assert config is not None
                self.config = config
            self._write(layout)
            self._reload()
            self.layout = layout

    def _edit_map(self, before: Mapping[str, str], after: Mapping[str, str]) -> None:
        path = self.listen.map_file
        Path(path).write_text(render_map(after))
        for verb, key, value in map_changes(before, after):
            target = "" if value is None else f" {value}"
            answer = self.runtime(f"{verb} map {path} {key}{target}").strip()
            if answer:
                log.warning("gateway: HAProxy %s map %s %s: %s", verb, path, key, answer)

    def _reload(self) -> None:
        assert self._process is not None
        pid_before = _pid(self.runtime("show info"))
        os.kill(self._process.pid, signal.SIGUSR2)
        if not self._wait_runtime(lambda answer: _pid(answer) not in ("", pid_before)):
            raise UnavailableError(
                f"gateway: HAProxy did not reload {self.config_file}; see "
                f"{self._dir / 'haproxy.log'}"
            )

    def _drain(self, drain_s: float) -> None:
        """Disable the public frontends (not SIGUSR1: a reloaded 2.6.12 master drops it), then wait
        up to ``drain_s`` until no request is in flight.
        """
        log.info("gateway: HAProxy drains: new connections refused, up to %.0f s", drain_s)
        frontends = ["grpc"] + (["http"] if self.listen.http is not None else [])
        try:
            for frontend in frontends:
                self.runtime(f"disable frontend {frontend}")
        except OSError as exc:
            log.warning("gateway: HAProxy did not stop listening (%s); stopping it", exc)
            return
        deadline = time.monotonic() + drain_s
        while (busy := self._in_flight()) > 0:
            if time.monotonic() > deadline:
                log.warning(
                    "gateway: %d requests still in flight after %.0f s "
                    "(exit_timeout_seconds); stopping HAProxy",
                    busy,
                    drain_s,
                )
                return
            time.sleep(0.05)

    def _in_flight(self) -> int:
        try:
            rows = self._stat_rows()
        except OSError:
            return 0
        return sum(
            int(row.get("scur") or 0) + int(row.get("qcur") or 0)
            for row in rows
            if row.get("svname") == "BACKEND"
        )

    def close(self, drain_s: float = 0.0) -> None:
        """Stop HAProxy (drained up to ``drain_s``, SIGTERM, SIGKILL) and remove its files."""
        process, self._process = self._process, None
        atexit.unregister(self.close)
        if process is not None and process.poll() is None and drain_s > 0:
            self._drain(drain_s)
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(5.0)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(5.0)
        shutil.rmtree(self._dir, ignore_errors=True)


def _pid(info: str) -> str:
    match = re.search(r"^\s*Pid\s*:(.*)$", info, re.MULTILINE)  # a ``show info`` line
    return match.group(1).strip() if match else ""
