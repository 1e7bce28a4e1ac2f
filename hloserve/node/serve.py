"""``hloserve serve``: build a repository from bundles if needed, run tritonserver, stop cleanly.

PATH is either a **bundles directory** (subdirectories holding ``manifest.yaml``), which is
built into a Triton model repository first, or a **model repository** (subdirectories holding
``config.pbtxt``) built earlier by ``hloserve repo build``. The server runs from the
nvidia-pytriton wheel (:mod:`hloserve.node.tritonserver`) with hloserve's Python-based
backends, prints where it listens, waits for readiness, passes its log through, and on
Ctrl-C/SIGTERM shuts down leaving no tritonserver or stub process behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from hloserve import names
from hloserve.errors import FailedPreconditionError, NotFoundError
from hloserve.node.model_control import model_states
from hloserve.node.plan import describe_exit
from hloserve.node.process_runtime import wait_all_ready
from hloserve.node.serve_fleet import node_observability, run_fleet
from hloserve.node.serve_options import (
    DEFAULT_STARTUP_TIMEOUT_S,
    ServeOptions,
    build_arguments,
    build_flags_set,
    check_options,
    default_control_mode,
    is_repository,
    server_options,
)
from hloserve.node.tritonserver import TritonServer
from hloserve.node.watchdog import stub_watchdog

log = logging.getLogger("hloserve.serve")


@contextlib.contextmanager
def prepared_repository(options: ServeOptions) -> Iterator[Path]:
    """The model repository to serve: PATH itself, or PATH's bundles built into one.

    Raises:
        NotFoundError: PATH does not exist or holds neither bundles nor models.
        BundleError: a bundle is invalid (nothing is built).
    """
    path = options.path
    if not path.is_dir():
        raise NotFoundError(f"{path}: no such directory")
    if is_repository(path):
        yield path
        return
    from hloserve.bundle import discover_bundles

    if not discover_bundles(path):
        raise NotFoundError(
            f"{path}: neither a bundles directory (no */manifest.yaml) "
            "nor a model repository (no */config.pbtxt)"
        )
    from hloserve.model_repository_tools import build_repository

    scratch: Path | None = None
    if options.repository_out is None:
        scratch = Path(tempfile.mkdtemp(prefix="hloserve-repository-"))
        out = scratch / "repository"
    else:
        out = options.repository_out
        if out.exists() and not (out / names.RUNTIME_MODEL / "config.pbtxt").is_file():
            raise FailedPreconditionError(
                f"--repository-out {out} exists and is not a repository hloserve built; "
                "choose a new path (hloserve replaces only its own repositories)"
            )
    try:
        log.info("building the model repository from bundles in %s into %s", path, out)
        build_repository(path, out, overwrite=True, **build_arguments(options))
        yield out
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def run_serve(options: ServeOptions) -> int:
    """Serve until Ctrl-C or SIGTERM (exit 0) or until tritonserver dies (exit 1).

    Raises:
        HloserveError: the repository cannot be prepared, or the server cannot start.
    """
    check_options(options)
    if options.model_control_key is None:  # one key for this serve (every worker of a fleet)
        from hloserve.node.model_control import launcher_key

        options = dataclasses.replace(options, model_control_key=launcher_key())
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: stopping tritonserver", signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    watched = None
    if options.watch:  # before the build: a change made during it is acted on later
        from hloserve.node.watch import scan

        watched = scan(options.path)
    try:
        with prepared_repository(options) as repository:
            if stop.is_set():  # Ctrl-C while the repository was being built
                return 0
            if options.workers > 1:
                return run_fleet(options, repository, stop, watched)
            # die_with_parent: a SIGKILLed `hloserve serve` leaves no orphan tritonserver.
            server = TritonServer(
                dataclasses.replace(server_options(options, repository), die_with_parent=True)
            )
            server.start()
            stack = contextlib.ExitStack()
            try:
                urls = server.urls
                print(
                    f"hloserve: tritonserver (pid {server.pid}) serving {repository}\n"
                    f"  HTTP    http://{urls.http}\n  gRPC    {urls.grpc}\n"
                    f"  metrics http://{urls.metrics}/metrics",
                    flush=True,
                )
                waited = wait_all_ready([server], options.startup_timeout_s, stop)
                observe = node_observability(options, [urls.metrics] if urls.metrics else [], None)
                stack.enter_context(observe)
                watchdog = stub_watchdog(server, lambda m: observe.stub_reloaded(0, m))
                if waited is not None:
                    states = model_states(urls.http, server.options.model_control_key)
                    for name, (state, reason) in states.items():
                        print(f"  model {name}: {state}{' - ' + reason if reason else ''}")
                    failed = sum(state != "READY" for state, _ in states.values())
                    print(
                        f"hloserve: ready after {waited:.1f} s"
                        + (f", {failed} model(s) NOT ready" if failed else "")
                        + " (Ctrl-C to stop)",
                        flush=True,
                    )
                    if observe.admin:
                        print(f"  admin   http://{observe.admin}/metrics (supervisor)")
                from hloserve.node.watcher import serve_model_list, server_model_control, watching

                if watched is not None:
                    stack.enter_context(
                        watching(
                            options.path,
                            repository,
                            [server],
                            observe,
                            watched,
                            build=build_arguments(options),
                            interval_s=options.watch_interval_s,
                            timeout_s=options.startup_timeout_s,
                        )
                    )
                else:  # /models on the admin port: Triton's index alone
                    serve_model_list(observe, server_model_control([server], 30.0))
                while not stop.wait(0.5):
                    observe.workers_up(int(server.is_running()))
                    watchdog.check()
                    code = server.exit_code()
                    if code is not None:
                        how = describe_exit(code)
                        print(f"hloserve: tritonserver {how} (its log is above)", flush=True)
                        return 1
            finally:
                stack.close()
                server.stop()
                print("hloserve: stopped", flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


__all__ = [
    "DEFAULT_STARTUP_TIMEOUT_S",
    "ServeOptions",
    "build_arguments",
    "build_flags_set",
    "check_options",
    "default_control_mode",
    "is_repository",
    "model_states",
    "prepared_repository",
    "run_serve",
    "server_options",
]
