"""Run one local tritonserver from the nvidia-pytriton wheel, without Docker.

The ``nvidia-pytriton==0.7.0`` wheel carries tritonserver 2.51 (``pytriton/tritonserver/bin``),
its shared libraries (``nvidia_pytriton.libs/``), the Python backend
(``pytriton/tritonserver/backends/python/``) and one ``triton_python_backend_stub`` per Python
version (``pytriton/tritonserver/python_backend_stubs/<major.minor>/``). :class:`TritonInstall`
finds these; :class:`TritonServer` composes a backend directory from them (links in a run
directory), sets the environment and runs the binary in its own session, so that
:meth:`TritonServer.stop` can end the server and every stub process it started.

Every endpoint binds ``TritonServerOptions.host`` (127.0.0.1 by default). Nothing here runs at
import time. Linux only (``/proc`` is read to find the server's processes and sockets).

Example::

    options = TritonServerOptions.on_free_ports(Path("repo"), extra_backend_dirs={"add": d})
    with TritonServer(options) as server:  # start() + wait_ready()
        client = tritonclient.grpc.InferenceServerClient(server.urls.grpc)
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import http.client
import importlib.util
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Literal

from hloserve.errors import (
    InvalidArgumentError,
    PortInUseError,
    TritonServerError,
)

ModelControlMode = Literal["none", "poll", "explicit"]

#: Name of Triton's Python backend directory inside ``--backend-directory``.
PYTHON_BACKEND = "python"
_STUB = "triton_python_backend_stub"
_LOG_TAIL_LINES = 60
_POLL_INTERVAL_S = 0.1


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free when asked.

    Another process may take the port before it is used; tests that start servers should pick
    ports immediately before starting them.
    """
    return free_ports(1, host)[0]


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (``ip_local_port_range``; 32768 if unread)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int, host: str = "127.0.0.1", *, contiguous: bool = False) -> tuple[int, ...]:
    """Return ``count`` distinct TCP ports on ``host`` that were free when asked.

    Ports come from 10000 up to the kernel's ephemeral range, never from inside it: a client
    polling a port in the ephemeral range before its server binds it can connect to itself (TCP
    simultaneous open, its own source port being the target) and then hold the port, so the
    server fails with "address already in use". All sockets are held open until every port is
    chosen, so the ports differ.

    Args:
        count: how many ports.
        host: the address they must be free on.
        contiguous: the ports must be consecutive (``base .. base + count - 1``).

    Raises:
        ValueError: ``count`` is below 1.
        OSError: no such ports were found in 200 tries.
    """
    if count < 1:
        raise ValueError(f"free_ports: count must be >= 1, got {count}")
    rng = random.Random()
    high = max(_ephemeral_low(), 10000 + 2 * count)
    for _ in range(200):
        if contiguous:
            base = rng.randrange(10000, high - count)
            candidates = list(range(base, base + count))
        else:
            candidates = rng.sample(range(10000, high), count)
        with contextlib.ExitStack() as stack:
            try:
                for port in candidates:
                    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    sock.bind((host, port))
            except OSError:
                continue
            return tuple(candidates)
    raise OSError(f"free_ports: no {count} free ports on {host} below {high} after 200 tries")


@dataclass(frozen=True)
class TritonInstall:
    """Where the tritonserver binary, its libraries and the Python backend live.

    Attributes:
        server_binary: the ``tritonserver`` executable.
        library_dirs: ``LD_LIBRARY_PATH`` entries, in order: the wheel's bundled libraries, then
            the interpreter's ``LIBDIR`` (holds ``libpython3.X.so`` that the stub links; without
            it the loader may pick a system libpython of the same version).
        python_backend_files: files of the ``python/`` backend directory by name:
            ``libtriton_python.so``, ``triton_python_backend_utils.py`` and
            ``triton_python_backend_stub`` (the stub for the running Python version).
        cache_dir: ``--cache-directory`` (holds the local response cache library).
        python_bin_dir: put first on ``PATH``. The stub's embedded interpreter runs isolated
            (``sys.flags.isolated == 1``: ``PYTHONPATH`` and ``PYTHONHOME`` are ignored) and
            computes ``sys.prefix`` from the first ``python3`` on ``PATH``; the venv's
            ``python3`` (beside ``pyvenv.cfg``) makes it a venv interpreter whose
            site-packages, ``.pth`` files included, are on ``sys.path``.
    """

    server_binary: Path
    library_dirs: tuple[Path, ...]
    python_backend_files: Mapping[str, Path]
    cache_dir: Path
    python_bin_dir: Path

    @classmethod
    def from_pytriton_wheel(cls) -> TritonInstall:
        """Locate tritonserver in the installed nvidia-pytriton wheel, for the running Python.

        ``pytriton`` is located, not imported.

        Raises:
            TritonServerError: the wheel is not installed, or a file is missing from it (for
                instance no stub for this Python version).
        """
        spec = importlib.util.find_spec("pytriton")
        if spec is None or spec.origin is None:
            raise TritonServerError(
                "tritonserver: the nvidia-pytriton wheel is not installed in "
                f"{sys.prefix} (pip install 'hloserve[serve]')"
            )
        package = Path(spec.origin).parent
        dist = package / "tritonserver"
        wheel_libs = package.parent / "nvidia_pytriton.libs"
        if not wheel_libs.is_dir():  # editable pytriton checkout
            wheel_libs = dist / "external_libs"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        backend = dist / "backends" / PYTHON_BACKEND
        files = {
            "libtriton_python.so": backend / "libtriton_python.so",
            "triton_python_backend_utils.py": backend / "triton_python_backend_utils.py",
            _STUB: dist / "python_backend_stubs" / version / _STUB,
        }
        libdir = sysconfig.get_config_var("LIBDIR")
        install = cls(
            server_binary=dist / "bin" / "tritonserver",
            library_dirs=(wheel_libs, *([Path(libdir)] if libdir else [])),
            python_backend_files=files,
            cache_dir=dist / "caches",
            python_bin_dir=Path(sys.executable).parent,
        )
        required = (
            install.server_binary,
            wheel_libs,
            *files.values(),
            install.python_bin_dir / "python3",
        )
        missing = [p for p in required if not p.exists()]
        if missing:
            raise TritonServerError(
                f"tritonserver: the nvidia-pytriton wheel in {package.parent} lacks "
                f"{', '.join(map(str, missing))} (Python {version})"
            )
        return install


@dataclass(frozen=True)
class TritonServerOptions:
    """How to run one tritonserver.

    Attributes:
        model_repository: ``--model-repository`` directory.
        http_port: HTTP/REST port (KServe V2); readiness is polled here. Default 8000.
        grpc_port: gRPC port (KServe V2). Default 8001.
        metrics_port: Prometheus metrics port, or None to disable metrics. Default 8002.
        host: address every endpoint binds (``--http-address``, ``--grpc-address``,
            ``--metrics-address``). Default 127.0.0.1.
        model_control_mode: ``--model-control-mode``: "none" loads the whole repository at
            start, "explicit" loads ``load_models`` and then what clients ask for, "poll" follows
            the repository. Default "none".
        load_models: ``--load-model`` names at start ("*" for all); only with "explicit".
        model_control_key: with "explicit", the key a client must send to reach Triton's
            repository API (:mod:`hloserve.node.model_control`); None leaves that API open.
        extra_backend_dirs: Python-based backends by backend name: each directory holds a
            ``model.py`` and is selected in ``config.pbtxt`` by ``backend: "<name>"``. Linked
            beside ``python/`` in the composed ``--backend-directory``.
        extra_args: further tritonserver flags, appended last (for instance
            ``--backend-config=python,shm-default-byte-size=16777216``).
        env: environment variables set for the server and its stubs (for instance
            ``CUDA_VISIBLE_DEVICES``), over the parent's environment.
        log_verbose: ``--log-verbose`` level; 0 is Triton's default.
        log_file: file that receives the server's and stubs' stdout and stderr (appended), or
            None to forward them to the parent's stdout (file descriptor 1).
        run_dir: directory for the composed backend directory, or None for a temporary one that
            :meth:`TritonServer.stop` removes.
        exit_timeout_s: ``--exit-timeout-secs``: how long the server waits for in-flight
            requests at shutdown, in seconds. Default 10.
        startup_timeout_s: how long the context manager waits for readiness, in seconds.
        die_with_parent: SIGTERM the server when the thread that started it exits (Linux
            ``PR_SET_PDEATHSIG``), so a SIGKILLed launcher leaves no orphan server. Only for a
            launcher whose starting thread lives as long as the server (``hloserve serve``'s
            main thread): the signal follows the thread, not the process.
        install: where tritonserver lives; None finds it in the nvidia-pytriton wheel.
    """

    model_repository: Path
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int | None = 8002
    host: str = "127.0.0.1"
    model_control_mode: ModelControlMode = "none"
    load_models: Sequence[str] = ()
    model_control_key: str | None = field(default=None, repr=False)  # a secret: not in logs
    extra_backend_dirs: Mapping[str, Path] = field(default_factory=dict)
    extra_args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    log_verbose: int = 0
    log_file: Path | None = None
    run_dir: Path | None = None
    exit_timeout_s: int = 10
    startup_timeout_s: float = 120.0
    die_with_parent: bool = False
    install: TritonInstall | None = None

    @classmethod
    def on_free_ports(
        cls, model_repository: Path, host: str = "127.0.0.1", **kwargs: object
    ) -> TritonServerOptions:
        """Options with HTTP, gRPC and metrics ports chosen by :func:`free_ports` on ``host``.

        ``kwargs`` are the other fields of :class:`TritonServerOptions`.
        """
        http, grpc, metrics = free_ports(3, host)
        return cls(
            model_repository,
            http_port=http,
            grpc_port=grpc,
            metrics_port=metrics,
            host=host,
            **kwargs,  # type: ignore[arg-type]
        )

    def ports(self) -> dict[str, int]:
        """The ports the server binds, by endpoint name ("http", "grpc", "metrics")."""
        ports = {"http": self.http_port, "grpc": self.grpc_port}
        if self.metrics_port is not None:
            ports["metrics"] = self.metrics_port
        return ports


@dataclass(frozen=True)
class TritonServerUrls:
    """Endpoints of a running server as ``host:port`` (what tritonclient takes; no scheme).

    Attributes:
        http: KServe V2 HTTP/REST endpoint.
        grpc: KServe V2 gRPC endpoint.
        metrics: Prometheus endpoint (``http://<metrics>/metrics``), or None when disabled.
    """

    http: str
    grpc: str
    metrics: str | None


@dataclass(frozen=True)
class StubProcess:
    """One Python backend stub process of a server (one per model instance).

    Attributes:
        pid: process id.
        model: the model's name (the stub's command line names
            ``<repository>/<model>/<version>/model.py``).
        version: the model version directory name.
        instance: Triton's instance name, e.g. ``digits_0_1``.
        wait_status: the ``waitpid`` status of a dead stub that its server has not reaped yet
            (a zombie; ``/proc/<pid>/stat`` field 52), None while the stub runs.
    """

    pid: int
    model: str
    version: str
    instance: str
    wait_status: int | None = None

    @property
    def dead(self) -> bool:
        """Whether the stub has exited (its server has not noticed: Triton reaps it on unload)."""
        return self.wait_status is not None

    @classmethod
    def from_proc(cls, pid: int, argv: Sequence[str], stat: str) -> StubProcess | None:
        """The stub described by a command line and a ``/proc/<pid>/stat`` line, or None when
        the process is not a Python backend stub.

        The 2.51 stub runs as ``triton_python_backend_stub <model.py> <shm region> <shm size>
        <shm growth> <parent pid> <python backend dir> <ipc size> <instance name> ...``.
        """
        if len(argv) < 2 or Path(argv[0]).name != _STUB:
            return None
        model_py = Path(argv[1])
        fields = stat[stat.rindex(")") + 2 :].split()
        zombie = fields[0] in ("Z", "X")
        return cls(
            pid=pid,
            model=model_py.parent.parent.name,
            version=model_py.parent.name,
            instance=argv[8] if len(argv) > 8 else "",
            wait_status=int(fields[-1]) if zombie else None,
        )


def server_flags(o: TritonServerOptions) -> list[str]:
    """The tritonserver flags of ``o`` that do not depend on where tritonserver is installed.

    Model control (``--model-control-mode``, ``--load-model``), the three endpoints on
    ``o.host`` (metrics off with ``--allow-metrics=false`` when ``o.metrics_port`` is None),
    ``--log-verbose``, the repository API restricted to ``o.model_control_key`` in explicit mode
    (:func:`hloserve.node.model_control.restricted_flags`), then ``o.extra_args``. The one
    builder of these flags: :class:`TritonServer` puts the install's paths in front, the docker
    runtime the container's.
    """
    flags = [
        f"--model-control-mode={o.model_control_mode}",
        *(f"--load-model={name}" for name in o.load_models),
        f"--http-address={o.host}",
        f"--http-port={o.http_port}",
        f"--grpc-address={o.host}",
        f"--grpc-port={o.grpc_port}",
    ]
    if o.metrics_port is None:
        flags.append("--allow-metrics=false")
    else:
        flags += [f"--metrics-address={o.host}", f"--metrics-port={o.metrics_port}"]
    flags.append(f"--log-verbose={o.log_verbose}")
    if o.model_control_key is not None and o.model_control_mode == "explicit":
        from hloserve.node.model_control import restricted_flags

        flags += restricted_flags(o.model_control_key)
    return [*flags, *o.extra_args]


class TritonServer:
    """One local tritonserver process and the stub processes it starts.

    The server runs in a new session (its own process group); :meth:`stop` ends the whole
    group and waits until no process of it is left. Use as a context manager, or call
    :meth:`start`, :meth:`wait_ready` and :meth:`stop`. Not thread-safe.
    """

    def __init__(self, options: TritonServerOptions) -> None:
        self.options = options
        self._process: subprocess.Popen[bytes] | None = None
        self._run_dir: Path | None = None
        self._owns_run_dir = False
        self._shm_prefix = f"hloserve-{os.getpid()}-{secrets.token_hex(4)}-"
        self._tail: collections.deque[str] = collections.deque(maxlen=_LOG_TAIL_LINES)
        self._log_handle: IO[bytes] | None = None
        self._forwarder: threading.Thread | None = None
        self._stub_argv: dict[int, list[str]] = {}  # a zombie's /proc cmdline is empty

    # -- properties ---------------------------------------------------------------------------

    @property
    def urls(self) -> TritonServerUrls:
        """The server's endpoints (``host:port``), known before the server is ready."""
        o = self.options
        return TritonServerUrls(
            http=f"{o.host}:{o.http_port}",
            grpc=f"{o.host}:{o.grpc_port}",
            metrics=None if o.metrics_port is None else f"{o.host}:{o.metrics_port}",
        )

    @property
    def pid(self) -> int | None:
        """Process id of tritonserver (also its process group and session id), or None."""
        return None if self._process is None else self._process.pid

    def exit_code(self) -> int | None:
        """The server's exit status once it has exited (negative: killed by that signal)."""
        return None if self._process is None else self._process.poll()

    def is_running(self) -> bool:
        """Whether the tritonserver process has been started and has not exited."""
        return self._process is not None and self._process.poll() is None

    def stub_processes(self) -> list[StubProcess]:
        """The Python backend stubs of this server's session, dead (unreaped) ones included."""
        if self._process is None:
            return []
        session = self._process.pid
        stubs = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                group, sid = stat[stat.rindex(")") + 2 :].split()[2:4]
                if session not in (int(group), int(sid)):
                    continue
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except (OSError, ValueError):
                continue
            words = [a.decode(errors="replace") for a in argv if a]
            if not words:  # a zombie's cmdline is empty: use what was seen while it ran
                words = self._stub_argv.get(pid, [])
            elif Path(words[0]).name == _STUB:
                self._stub_argv[pid] = words
            else:
                self._stub_argv.pop(pid, None)  # the pid was reused
            stub = StubProcess.from_proc(pid, words, stat)
            if stub is not None:
                stubs.append(stub)
        return stubs

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Compose the backend directory and launch tritonserver; do not wait for readiness.

        Raises:
            TritonServerError: already started, tritonserver not found, or launch failed.
            PortInUseError: a port is already bound on ``options.host``.
            InvalidArgumentError: a backend directory is misnamed or lacks ``model.py``.
        """
        if self._process is not None:
            raise TritonServerError(f"tritonserver: already started (pid {self._process.pid})")
        o = self.options
        install = o.install or TritonInstall.from_pytriton_wheel()
        _check_backends(o.model_repository, {PYTHON_BACKEND, *o.extra_backend_dirs})
        _check_ports_free(o.host, o.ports())
        if o.run_dir is None:
            self._run_dir = Path(tempfile.mkdtemp(prefix="hloserve-tritonserver-"))
            self._owns_run_dir = True
        else:
            self._run_dir = o.run_dir
            self._run_dir.mkdir(parents=True, exist_ok=True)
        try:
            backends = _compose_backend_dir(self._run_dir, install, o.extra_backend_dirs)
            argv = self._argv(install, backends)
            env = self._env(install)
            self._launch(argv, env)
        except BaseException:
            self._cleanup_files()
            raise
        atexit.register(self._kill_at_exit)

    def wait_ready(self, timeout_s: float | None = None) -> float:
        """Poll ``GET /v2/health/ready`` until the server answers 200 on its own HTTP port.

        Args:
            timeout_s: how long to wait, in seconds; None uses ``options.startup_timeout_s``.

        Returns:
            Seconds waited.

        Raises:
            TritonServerError: not started, the process exited, or the timeout passed; the
                message holds the tail of the server log.
        """
        if self._process is None:
            raise TritonServerError("tritonserver: wait_ready() before start()")
        timeout = self.options.startup_timeout_s if timeout_s is None else timeout_s
        url = f"http://{self.urls.http}/v2/health/ready"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxies
        start = time.monotonic()
        for _ in range(int(timeout / _POLL_INTERVAL_S) + 2):
            code = self._process.poll()
            if code is not None:
                raise TritonServerError(
                    f"tritonserver exited with code {code} before it was ready "
                    f"(http {self.urls.http}, grpc {self.urls.grpc})\n{self.log_tail()}"
                )
            # OSError covers URLError, HTTPError (503 while loading), refused, timeout;
            # HTTPException a malformed answer (BadStatusLine) from a half-started server.
            with (
                contextlib.suppress(OSError, http.client.HTTPException),
                opener.open(url, timeout=1.0) as response,
            ):
                # A 200 from someone else on our port must not count: check the owner.
                if response.status == 200 and self._listens_on(self.options.http_port):
                    return time.monotonic() - start
            if time.monotonic() - start > timeout:
                break
            time.sleep(_POLL_INTERVAL_S)
        raise TritonServerError(
            f"tritonserver (pid {self._process.pid}) not ready after {timeout:.1f} s "
            f"at {url}\n{self.log_tail()}"
        )

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the server, SIGKILL its process group after ``timeout_s``, clean up.

        Waits until no process of the server's session is left (stubs included), then removes
        the temporary run directory and the Python backend's shared-memory files. Idempotent.

        Args:
            timeout_s: seconds to wait for a graceful exit before SIGKILL.

        Raises:
            TritonServerError: a process of the session survived SIGKILL for 10 s.
        """
        process = self._process
        if process is None:
            return
        atexit.unregister(self._kill_at_exit)
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout_s)
        survivors = _kill_session(process.pid, grace_s=2.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5.0)
        if self._forwarder is not None:
            self._forwarder.join(timeout=5.0)
        self._process = None
        self._cleanup_files()
        if survivors:
            raise TritonServerError(
                f"tritonserver (session {process.pid}): processes {survivors} survived SIGKILL"
            )

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server's output (from ``log_file`` if set)."""
        log_file = self.options.log_file
        if log_file is not None and log_file.exists():
            with log_file.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
                text = f.read().decode(errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        return "".join(list(self._tail)[-lines:]).rstrip("\n")

    def __enter__(self) -> TritonServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals ----------------------------------------------------------------------------

    def _argv(self, install: TritonInstall, backends: Path) -> list[str]:
        o = self.options
        argv = [
            str(install.server_binary),
            f"--model-repository={o.model_repository.resolve()}",
            f"--backend-directory={backends}",
            f"--cache-directory={install.cache_dir}",
            f"--exit-timeout-secs={o.exit_timeout_s}",
        ]
        if not any("shm-region-prefix-name" in arg for arg in o.extra_args):
            # Unique per server: two servers on one host must not share stub shm regions.
            argv.append(f"--backend-config=python,shm-region-prefix-name={self._shm_prefix}")
        else:
            self._shm_prefix = ""
        return [*argv, *server_flags(o)]

    def _env(self, install: TritonInstall) -> dict[str, str]:
        env = {**os.environ, **self.options.env}

        def prepend(name: str, entries: Sequence[Path]) -> None:
            old = [p for p in env.get(name, "").split(os.pathsep) if p]
            env[name] = os.pathsep.join(dict.fromkeys([*map(str, entries), *old]))

        prepend("LD_LIBRARY_PATH", install.library_dirs)
        prepend("PATH", [install.python_bin_dir])
        return env

    def _launch(self, argv: list[str], env: dict[str, str]) -> None:
        log_file = self.options.log_file
        if log_file is not None:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            self._log_handle = log_file.open("ab")
        stdout: IO[bytes] | int = (
            self._log_handle if self._log_handle is not None else subprocess.PIPE
        )
        try:
            self._process = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent if self.options.die_with_parent else None,
            )
        except OSError as e:
            raise TritonServerError(f"tritonserver: cannot run {argv[0]}: {e}") from e
        if self._process.stdout is not None:
            self._forwarder = threading.Thread(
                target=self._forward, args=(self._process.stdout,), daemon=True
            )
            self._forwarder.start()

    def _forward(self, pipe: IO[bytes]) -> None:
        """Copy the server's output to file descriptor 1, keeping the last lines."""
        with pipe:
            for line in iter(pipe.readline, b""):
                self._tail.append(line.decode(errors="replace"))
                with contextlib.suppress(OSError):
                    os.write(1, line)

    def _listens_on(self, port: int) -> bool:
        """Whether a process of the server's session listens on ``port`` (True if unknown)."""
        if self._process is None:
            return False
        try:
            return port in _listening_ports(_session_pids(self._process.pid))
        except OSError:
            return True

    def _cleanup_files(self) -> None:
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        if self._shm_prefix:
            for shm in Path("/dev/shm").glob(f"{self._shm_prefix}*"):
                with contextlib.suppress(OSError):
                    shm.unlink()
        if self._owns_run_dir and self._run_dir is not None:
            _remove_tree(self._run_dir)
            self._run_dir = None
            self._owns_run_dir = False

    def _kill_at_exit(self) -> None:
        if self._process is not None:
            _kill_session(self._process.pid, grace_s=1.0)


def _die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM it when the parent thread dies."""
    import ctypes

    pr_set_pdeathsig = 1  # <linux/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM))


def _check_backends(repository: Path, available: set[str]) -> None:
    """Refuse a repository with a model whose backend this tritonserver lacks, before start.

    The nvidia-pytriton wheel's tritonserver has only the Python backend (and the
    Python-based backends composed beside it); ONNX Runtime, PyTorch, TensorRT and TensorFlow
    models need the NGC image (docs/deployment.md). hloserve's own backends are not checked
    here (the launcher composes them).

    Raises:
        InvalidArgumentError: naming each model, the backend it needs and the ones there are.
    """
    from hloserve.model_repository_tools.foreign import repository_backends

    missing = {
        backend: models
        for backend, models in repository_backends(repository).items()
        if backend not in available and not backend.startswith("hloserve_")
    }
    if missing:
        needs = "; ".join(f"{', '.join(ms)} need(s) backend {b!r}" for b, ms in missing.items())
        raise InvalidArgumentError(
            f"tritonserver: {needs}, which this tritonserver does not have (it has "
            f"{', '.join(sorted(available))}): serve these models with the NGC Triton image "
            "(containers/worker.Dockerfile, docs/deployment.md) or leave them out"
        )


def _compose_backend_dir(
    run_dir: Path, install: TritonInstall, extra_backend_dirs: Mapping[str, Path]
) -> Path:
    """Build ``<run_dir>/backends``: ``python/`` (hard links or copies) and one symlink per
    extra backend directory."""
    backends = run_dir / "backends"
    python = backends / PYTHON_BACKEND
    python.mkdir(parents=True, exist_ok=True)
    for name, target in install.python_backend_files.items():
        _link_or_copy(python / name, target)
    for name, directory in extra_backend_dirs.items():
        if name == PYTHON_BACKEND or not name or "/" in name or name.startswith("."):
            raise InvalidArgumentError(
                f"tritonserver: backend name {name!r} is reserved or not a directory name"
            )
        if not (directory / "model.py").is_file():
            raise InvalidArgumentError(
                f"tritonserver: backend {name!r}: {directory} has no model.py"
            )
        _symlink(backends / name, directory.resolve())
    return backends


def _symlink(link: Path, target: Path) -> None:
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def _link_or_copy(dst: Path, src: Path) -> None:
    """Hard-link ``src`` to ``dst``, copying across file systems; never a symlink.

    Triton resolves symlinks and refuses a backend library that "escapes backend directory"
    (a symlinked ``python/libtriton_python.so`` fails every Python-based backend).
    """
    if dst.is_symlink() or dst.exists():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _remove_tree(path: Path) -> None:
    """Remove ``path`` without following symlinks (the links point into the wheel)."""
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(root, name))
        for name in dirs:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(root, name))
    with contextlib.suppress(OSError):
        path.rmdir()


def _check_ports_free(host: str, ports: Mapping[str, int]) -> None:
    check_ports_free(host, ports, "tritonserver: ")


def check_ports_free(host: str, ports: Mapping[str, int], what: str = "", hint: str = "") -> None:
    """Raise PortInUseError if a port cannot be bound on ``host`` (TIME_WAIT is not "in use").

    Args:
        host: the address the ports will be bound on.
        ports: port by endpoint name ("gRPC", "metrics", ...).
        what: prefix of the message's endpoint name, e.g. "gateway ".
        hint: appended to the message, e.g. what to change.

    Raises:
        PortInUseError: (UNAVAILABLE) "<what><endpoint> port <host>:<port> is already in use".
    """
    for endpoint, port in ports.items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as e:
                raise PortInUseError(
                    f"{what}{endpoint} port {host}:{port} is already in use ({e}){hint}"
                ) from e


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, session) of ``pid`` from ``/proc/<pid>/stat``, or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[0], int(fields[2]), int(fields[3])


def _session_pids(session: int) -> list[int]:
    """Live (non-zombie) processes whose process group or session is ``session``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _proc_stat(int(entry))
        if stat is not None and stat[0] != "Z" and session in (stat[1], stat[2]):
            pids.append(int(entry))
    return pids


def _kill_session(session: int, grace_s: float) -> list[int]:
    """SIGKILL every process of ``session``; return those still alive after ``grace_s`` + 8 s."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(session, signal.SIGKILL)
    deadline = time.monotonic() + grace_s + 8.0
    pids = _session_pids(session)
    for _ in range(int((grace_s + 8.0) / 0.05) + 1):
        if not pids or time.monotonic() > deadline:
            break
        for pid in pids:  # processes that left the group but not the session
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
        pids = _session_pids(session)
    return pids


def _listening_ports(pids: Sequence[int]) -> set[int]:
    """TCP ports in LISTEN state whose sockets are open in one of ``pids`` (``/proc/net``)."""
    inodes: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            next(f, None)
            for line in f:
                cols = line.split()
                if len(cols) > 9 and cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports
