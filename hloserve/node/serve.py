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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from hloserve.errors import HloserveError, InvalidArgumentError, NotFoundError, Status
from hloserve.node.tritonserver import (
    ModelControlMode,
    TritonServer,
    TritonServerError,
    TritonServerOptions,
)

if TYPE_CHECKING:  # the build code is imported when a repository is built
    from hloserve.model_repository_tools.build import WeightCacheOptions

log = logging.getLogger("hloserve.serve")


class FailedPreconditionError(HloserveError):
    """The command would destroy something it does not own."""

    status = Status.FAILED_PRECONDITION


#: Seconds the server may take to load and warm up every model before ``serve`` gives up.
DEFAULT_STARTUP_TIMEOUT_S = 600.0


def is_repository(path: Path) -> bool:
    """Whether ``path`` looks like a Triton model repository (a subdirectory has config.pbtxt)."""
    return path.is_dir() and any((d / "config.pbtxt").is_file() for d in path.iterdir())


@dataclass(frozen=True)
class ServeOptions:
    """Settings of ``hloserve serve``.

    Attributes:
        path: a bundles directory or a model repository.
        http_port: KServe V2 HTTP port (Triton's default 8000).
        grpc_port: KServe V2 gRPC port (Triton's default 8001).
        metrics_port: Prometheus metrics port (Triton's default 8002).
        host: address every endpoint binds; 127.0.0.1 by default, 0.0.0.0 to serve the network.
        model_control_mode: tritonserver ``--model-control-mode`` (none, poll, explicit).
        load_models: ``--load-model`` names, with ``explicit`` mode.
        repository_out: where to build the repository from bundles; None builds it in a
            temporary directory removed at exit.
        front_instances: CPU instances of each front model (``instance_group.count``).
        max_queue_delay_us: dynamic batcher ``max_queue_delay_microseconds``.
        weight_cache: the runtime's weight cache settings when building from bundles
            (docs/on_demand_weights.md); None = no budget.
        tritonserver_args: further tritonserver flags, passed through last.
        log_verbose: tritonserver ``--log-verbose`` level.
        startup_timeout_s: seconds to wait for every model to load and warm up.
    """

    path: Path
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    host: str = "127.0.0.1"
    model_control_mode: ModelControlMode = "none"
    load_models: Sequence[str] = ()
    repository_out: Path | None = None
    front_instances: int = 2
    max_queue_delay_us: int = 500
    weight_cache: WeightCacheOptions | None = None
    tritonserver_args: Sequence[str] = ()
    log_verbose: int = 0
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S


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
        from hloserve.model_repository_tools import names

        if out.exists() and not (out / names.RUNTIME_MODEL / "config.pbtxt").is_file():
            raise FailedPreconditionError(
                f"--repository-out {out} exists and is not a repository hloserve built; "
                "choose a new path (hloserve replaces only its own repositories)"
            )
    try:
        log.info("building the model repository from bundles in %s into %s", path, out)
        build_repository(
            path,
            out,
            front_instances=options.front_instances,
            max_queue_delay_us=options.max_queue_delay_us,
            weight_cache=options.weight_cache,
            overwrite=True,
        )
        yield out
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def server_options(options: ServeOptions, repository: Path) -> TritonServerOptions:
    """tritonserver options for a repository of hloserve models.

    ``--exit-on-error=false`` and ``--strict-readiness=false`` keep the server up and ready
    when one model fails to load, so the others keep serving (the failure is reported by
    :func:`model_states`). In explicit mode the runtime model is loaded with the named models.

    Raises:
        InvalidArgumentError: a port outside 1..65535, or two endpoints on one port.
    """
    from hloserve.model_repository_tools import names
    from hloserve.triton_backend.backends import backend_dirs

    ports = {"HTTP": options.http_port, "gRPC": options.grpc_port, "metrics": options.metrics_port}
    for endpoint, port in ports.items():
        if not 1 <= port <= 65535:
            raise InvalidArgumentError(f"{endpoint} port {port} is not in 1..65535")
    if len(set(ports.values())) != len(ports):
        raise InvalidArgumentError(f"HTTP, gRPC and metrics need three different ports: {ports}")
    load_models = tuple(options.load_models)
    if load_models and "*" not in load_models and names.RUNTIME_MODEL not in load_models:
        load_models += (names.RUNTIME_MODEL,)  # every front needs it; else requests wait 120 s
    return TritonServerOptions(
        model_repository=repository,
        http_port=options.http_port,
        grpc_port=options.grpc_port,
        metrics_port=options.metrics_port,
        host=options.host,
        model_control_mode=options.model_control_mode,
        load_models=load_models,
        extra_backend_dirs=backend_dirs(),
        extra_args=(
            "--exit-on-error=false",
            "--strict-readiness=false",
            *options.tritonserver_args,
        ),
        log_verbose=options.log_verbose,
        startup_timeout_s=options.startup_timeout_s,
    )


def run_serve(options: ServeOptions) -> int:
    """Serve until Ctrl-C or SIGTERM (exit 0) or until tritonserver dies (exit 1).

    Raises:
        HloserveError: the repository cannot be prepared, or the server cannot start.
    """
    if options.load_models and options.model_control_mode != "explicit":
        raise InvalidArgumentError("--load-model needs --model-control-mode explicit")
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: stopping tritonserver", signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with prepared_repository(options) as repository:
            if stop.is_set():  # Ctrl-C while the repository was being built
                return 0
            # die_with_parent: a SIGKILLed `hloserve serve` leaves no orphan tritonserver.
            server = TritonServer(
                dataclasses.replace(server_options(options, repository), die_with_parent=True)
            )
            server.start()
            try:
                urls = server.urls
                print(
                    f"hloserve: tritonserver (pid {server.pid}) serving {repository}\n"
                    f"  HTTP    http://{urls.http}\n  gRPC    {urls.grpc}\n"
                    f"  metrics http://{urls.metrics}/metrics",
                    flush=True,
                )
                waited = _wait_ready_or_stop(server, options.startup_timeout_s, stop)
                if waited is not None:
                    states = model_states(urls.http)
                    for name, (state, reason) in states.items():
                        print(f"  model {name}: {state}{' - ' + reason if reason else ''}")
                    failed = sum(state != "READY" for state, _ in states.values())
                    print(
                        f"hloserve: ready after {waited:.1f} s"
                        + (f", {failed} model(s) NOT ready" if failed else "")
                        + " (Ctrl-C to stop)",
                        flush=True,
                    )
                while not stop.wait(0.5):
                    code = server.exit_code()
                    if code is not None:
                        how = (
                            f"was killed by {signal.Signals(-code).name}"
                            if code < 0
                            else f"exited with code {code}"
                        )
                        print(f"hloserve: tritonserver {how} (its log is above)", flush=True)
                        return 1
            finally:
                server.stop()
                print("hloserve: stopped", flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def model_states(http_url: str) -> dict[str, tuple[str, str]]:
    """Every model in the repository index: name -> (state, reason), e.g. ("READY", "")."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(http_url)
    try:
        index = client.get_model_repository_index()
    finally:
        client.close()
    return {m["name"]: (m.get("state", "UNKNOWN"), m.get("reason", "")) for m in index}


def _wait_ready_or_stop(
    server: TritonServer, timeout_s: float, stop: threading.Event
) -> float | None:
    """Wait for readiness in short slices so a signal during start-up is honoured."""
    waited = 0.0
    while not stop.is_set():
        try:
            return waited + server.wait_ready(timeout_s=min(2.0, max(timeout_s - waited, 0.1)))
        except TritonServerError:
            waited += 2.0
            if not server.is_running() or waited >= timeout_s:
                raise
    return None
