"""Run one local tritonserver from the nvidia-pytriton wheel, without Docker (Linux only).

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
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from hloserve.errors import TritonServerError
from hloserve.node import procfs, triton_install
from hloserve.node.triton_install import PYTHON_BACKEND, STUB, TritonInstall
from hloserve.node.triton_options import TritonServerOptions, TritonServerUrls, server_flags
from hloserve.ports import check_ports_free

_LOG_TAIL_LINES = 60
#: First lines of the server's output kept too: an argument error ("unrecognized option")
#: comes first, before hundreds of lines of usage text.
_LOG_HEAD_LINES = 3
_POLL_INTERVAL_S = 0.1


def health_ready(address: str) -> bool:
    """Whether ``GET http://<address>/v2/health/ready`` answers 200 within 1 s (no proxies);
    any error counts as not ready."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with (
        contextlib.suppress(OSError, http.client.HTTPException),
        opener.open(f"http://{address}/v2/health/ready", timeout=1.0) as response,
    ):
        return bool(response.status == 200)
    return False


@dataclass(frozen=True)
class StubProcess:
    """One Python backend stub process of a server (one per model instance): ``instance`` is
    Triton's instance name (``digits_0_1``), ``wait_status`` the ``waitpid`` status of a dead
    stub its server has not reaped yet (``/proc/<pid>/stat`` field 52), None while it runs."""

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
        """The stub of a command line (2.51: ``triton_python_backend_stub <model.py>`` then
        instance name 8th) and ``/proc/<pid>/stat`` line; None for another process."""
        if len(argv) < 2 or Path(argv[0]).name != STUB:
            return None
        model_py = Path(argv[1])
        fields = stat[stat.rindex(")") + 2 :].split()
        instance = argv[8] if len(argv) > 8 else ""
        status = int(fields[-1]) if fields[0] in ("Z", "X") else None  # a zombie's
        return cls(pid, model_py.parent.parent.name, model_py.parent.name, instance, status)


def session_stubs(session: int, argv_seen: dict[int, list[str]]) -> list[StubProcess]:
    """The Python backend stubs, dead (unreaped) ones included, among the processes of
    ``session`` (a session or process group id in this host's ``/proc``); ``argv_seen``: pid ->
    command line of stubs seen running, kept by the caller between calls (updated here)."""
    stubs = []
    for pid, stat, words in procfs.session_processes(session):
        if not words:  # a zombie's cmdline is empty: use what was seen while it ran
            words = argv_seen.get(pid, [])
        elif Path(words[0]).name == STUB:
            argv_seen[pid] = words
        else:
            argv_seen.pop(pid, None)  # the pid was reused
        stub = StubProcess.from_proc(pid, words, stat)
        if stub is not None:
            stubs.append(stub)
    return stubs


class TritonServer:
    """One local tritonserver process, in its own session, and the stubs it starts: a context
    manager, or call :meth:`start`, :meth:`wait_ready` and :meth:`stop`. Not thread-safe."""

    def __init__(self, options: TritonServerOptions) -> None:
        self.options = options
        self._process: subprocess.Popen[bytes] | None = None
        self._run_dir: Path | None = None
        self._owns_run_dir = False
        self._shm_prefix = f"hloserve-{os.getpid()}-{secrets.token_hex(4)}-"
        self._tail: collections.deque[str] = collections.deque(maxlen=_LOG_TAIL_LINES)
        self._head: list[str] = []
        self._lines = 0
        self._log_handle: IO[bytes] | None = None
        self._forwarder: threading.Thread | None = None
        self._stub_argv: dict[int, list[str]] = {}  # a zombie's /proc cmdline is empty

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
        return session_stubs(self._process.pid, self._stub_argv)

    def start(self) -> None:
        """Compose the backend directory and launch tritonserver; do not wait for readiness;
        raises TritonServerError: already started, tritonserver not found, or launch failed;
        PortInUseError: a port is already bound on ``options.host``; InvalidArgumentError: a
        backend directory is misnamed or lacks ``model.py``."""
        if self._process is not None:
            raise TritonServerError(f"tritonserver: already started (pid {self._process.pid})")
        o = self.options
        install = o.install or TritonInstall.from_pytriton_wheel()
        triton_install.check_backends(o.model_repository, {PYTHON_BACKEND, *o.extra_backend_dirs})
        check_ports_free(o.host, o.ports(), "tritonserver: ")
        if o.run_dir is None:
            self._run_dir = Path(tempfile.mkdtemp(prefix="hloserve-tritonserver-"))
            self._owns_run_dir = True
        else:
            self._run_dir = o.run_dir
            self._run_dir.mkdir(parents=True, exist_ok=True)
        try:
            backends = triton_install.compose_backend_dir(
                self._run_dir, install, o.extra_backend_dirs
            )
            self._launch(self._argv(install, backends), self._env(install))
        except BaseException:
            self._cleanup_files()
            raise
        atexit.register(self._kill_at_exit)

    def wait_ready(self, timeout_s: float | None = None) -> float:
        """Poll ``GET /v2/health/ready`` until the server answers 200 on its own HTTP port;
        seconds waited (``timeout_s`` None: ``options.startup_timeout_s``); raises
        TritonServerError: not started, the process exited, or the timeout passed; the message
        holds the tail of the server log."""
        if self._process is None:
            raise TritonServerError("tritonserver: wait_ready() before start()")
        timeout = self.options.startup_timeout_s if timeout_s is None else timeout_s
        start = time.monotonic()
        for _ in range(int(timeout / _POLL_INTERVAL_S) + 2):
            code = self._process.poll()
            if code is not None:
                raise TritonServerError(
                    f"tritonserver exited with code {code} before it was ready "
                    f"(http {self.urls.http}, grpc {self.urls.grpc})\n{self.log_tail()}"
                )
            # A 200 from someone else on our port must not count: check the owner.
            if health_ready(self.urls.http) and self._listens_on(self.options.http_port):
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                break
            time.sleep(_POLL_INTERVAL_S)
        raise TritonServerError(
            f"tritonserver (pid {self._process.pid}) not ready after {timeout:.1f} s "
            f"at http://{self.urls.http}/v2/health/ready\n{self.log_tail()}"
        )

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the server, SIGKILL its session after ``timeout_s`` s, wait until no process
        of it is left, remove its run directory and shm files. Idempotent; raises
        TritonServerError: a process of the session survived SIGKILL for 10 s."""
        process = self._process
        if process is None:
            return
        atexit.unregister(self._kill_at_exit)
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout_s)
        survivors = procfs.kill_session(process.pid, grace_s=2.0)
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

    def log_tail(self) -> str:
        """The last 60 lines of the server's output (from ``log_file`` if set); from the
        output itself, its first 3 lines too when they are not among those."""
        log_file = self.options.log_file
        if log_file is not None and log_file.exists():
            with log_file.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
                text = f.read().decode(errors="replace")
            return "\n".join(text.splitlines()[-_LOG_TAIL_LINES:])
        head = self._head if self._lines > len(self._head) + len(self._tail) else []
        return "".join([*head, *(["...\n"] if head else []), *self._tail]).rstrip("\n")

    def __enter__(self) -> TritonServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

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
        try:
            self._process = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=self._log_handle or subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=procfs.die_with_parent if self.options.die_with_parent else None,
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
                text = line.decode(errors="replace")
                if len(self._head) < _LOG_HEAD_LINES:
                    self._head.append(text)
                self._tail.append(text)
                self._lines += 1
                with contextlib.suppress(OSError):
                    os.write(1, line)

    def _listens_on(self, port: int) -> bool:
        """Whether a process of the server's session listens on ``port`` (True if unknown)."""
        if self._process is None:
            return False
        try:
            return port in procfs.listening_ports(procfs.session_pids(self._process.pid))
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
            shutil.rmtree(self._run_dir, ignore_errors=True)  # links into the wheel: not followed
            self._run_dir = None
            self._owns_run_dir = False

    def _kill_at_exit(self) -> None:
        if self._process is not None:
            procfs.kill_session(self._process.pid, grace_s=1.0)
