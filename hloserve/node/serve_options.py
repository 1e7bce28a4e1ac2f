"""The settings of ``hloserve serve`` (:class:`ServeOptions`), their checks, the tritonserver
options they make and :func:`serve_plan`, the node the supervisor runs. Starts nothing.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hloserve.errors import InvalidArgumentError
from hloserve.node.plan import SERVING_FLAGS, NodePlan, with_dependencies
from hloserve.node.triton_options import ModelControlMode, TritonServerOptions
from hloserve.ports import check_ports_free, free_port

if TYPE_CHECKING:  # the build code is imported when a repository is built
    from hloserve.model_repository_tools.build_options import BuildOptions
    from hloserve.node.node_config import NodeConfig
    from hloserve.node.plan import WorkerPlan

#: Seconds the server may take to load and warm up every model before ``serve`` gives up.
DEFAULT_STARTUP_TIMEOUT_S = 600.0


def is_repository(path: Path) -> bool:
    """Whether ``path`` is a Triton model repository: a subdirectory has config.pbtxt and none
    a manifest.yaml (docs/serving.md, "Foreign models")."""
    if not path.is_dir():
        return False
    folders = [d for d in path.iterdir() if d.is_dir()]
    return any((d / "config.pbtxt").is_file() for d in folders) and not any(
        (d / "manifest.yaml").is_file() for d in folders
    )


@dataclass(frozen=True)
class ServeOptions:
    """Settings of ``hloserve serve``: each field is the ``serve`` flag of that name (``*_s``:
    seconds), ``tritonserver_args`` the flags after ``--``; ``model_control_mode`` None =
    explicit with ``--load-model=*``, the repository API restricted to ``model_control_key``
    (None: :func:`~hloserve.model_control.launcher_key`); ``build`` None = every default."""

    path: Path
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    host: str = "127.0.0.1"
    model_control_mode: ModelControlMode | None = None
    load_models: Sequence[str] = ()
    model_control_key: str | None = field(default=None, repr=False)  # a secret: not in logs
    open_repository_api: bool = False
    repository_out: Path | None = None
    build: BuildOptions | None = None
    tritonserver_args: Sequence[str] = ()
    log_verbose: int = 0
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    workers: int | None = None
    gpus: str | None = None
    worker_port_base: int = 8100
    gateway_config: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    admin_port: int | None = None
    watch: bool = False
    watch_interval_s: float = 15.0


#: tritonserver flags ``hloserve serve`` sets itself, with the option that sets each: given
#: after ``--`` they would make the server listen, load or answer where hloserve does not look.
MANAGED_FLAGS = {
    "--http-port": "--http-port",
    "--grpc-port": "--grpc-port",
    "--metrics-port": "--metrics-port",
    "--model-repository": "PATH",
    "--model-store": "PATH",
    "--model-control-mode": "--model-control-mode",
    "--http-address": "--host",
    "--grpc-address": "--host",
    "--metrics-address": "--host",
}


def server_options(options: ServeOptions, repository: Path) -> TritonServerOptions:
    """tritonserver options for a repository of hloserve models, with
    :data:`~hloserve.node.plan.SERVING_FLAGS`; in explicit mode the named models' dependencies
    load too, and the repository API is keyed (``--open-repository-api`` opens the gateway in
    front, :func:`gateway_in_front`, not the worker).

    Raises:
        InvalidArgumentError: a port outside 1..65535, or two endpoints on one port.
    """
    from hloserve.triton_backend.backends import backend_dirs

    _check_ports(options)
    mode = options.model_control_mode
    load_models = tuple(options.load_models)
    if mode is None:  # explicit on every host: everything loads, a dead stub is reloaded
        mode, load_models = "explicit", ("*",)
    if load_models and "*" not in load_models:
        load_models = with_dependencies(repository, load_models)
    key = None
    if mode == "explicit":
        from hloserve.model_control import launcher_key

        key = options.model_control_key or launcher_key()
    return TritonServerOptions(
        model_repository=repository,
        http_port=options.http_port,
        grpc_port=options.grpc_port,
        metrics_port=options.metrics_port,
        host=options.host,
        model_control_mode=mode,
        load_models=load_models,
        model_control_key=key,
        extra_backend_dirs=backend_dirs(),
        extra_args=(*SERVING_FLAGS, *options.tritonserver_args),
        log_verbose=options.log_verbose,
        startup_timeout_s=options.startup_timeout_s,
    )


def worker_options(
    options: ServeOptions, repository: Path, worker: WorkerPlan
) -> TritonServerOptions:
    """:func:`server_options` on ``worker``'s ports, with its environment, dying with its
    supervisor."""
    from hloserve.node.plan import worker_env

    w = worker
    on_ports = dataclasses.replace(
        options, http_port=w.http_port, grpc_port=w.grpc_port, metrics_port=w.metrics_port
    )
    return dataclasses.replace(
        server_options(on_ports, repository),
        env=worker_env(worker, docker=False, repository=repository),
        die_with_parent=True,
    )


def node_server_options(
    config: NodeConfig, worker: WorkerPlan, model_control_key: str | None = None
) -> TritonServerOptions:
    """A ``node up`` worker's tritonserver options, as ``serve`` sets them; without
    ``model_control_key`` the repository API stays open."""
    t = config.tritonserver
    serve = ServeOptions(
        path=config.repository,
        host=config.host,
        model_control_mode=t.model_control_mode,
        load_models=t.loads,
        model_control_key=model_control_key,
        tritonserver_args=t.args,
        log_verbose=t.log_verbose,
        startup_timeout_s=t.startup_timeout_s,
    )
    options = worker_options(serve, config.repository, worker)
    key = model_control_key and options.model_control_key
    return dataclasses.replace(options, model_control_key=key)


def _check_ports(options: ServeOptions) -> dict[str, int]:
    """The server's ports by endpoint, checked in 1..65535 and all different."""
    ports = {"HTTP": options.http_port, "gRPC": options.grpc_port, "metrics": options.metrics_port}
    for endpoint, port in ports.items():
        if not 1 <= port <= 65535:
            raise InvalidArgumentError(f"{endpoint} port {port} is not in 1..65535")
    if len(set(ports.values())) != len(ports):
        raise InvalidArgumentError(f"HTTP, gRPC and metrics need three different ports: {ports}")
    return ports


def build_flags_set(options: ServeOptions) -> list[str]:
    """The build-only flags set to other than their defaults, in command-line spelling."""
    given = ["--repository-out"] if options.repository_out is not None else []
    return given + (options.build.flags_set() if options.build is not None else [])


def serve_gpus(options: ServeOptions) -> list[int | None]:
    """Each worker's GPU (None: CPU) from ``--gpus``, ``--workers`` and the visible GPUs.

    Raises:
        InvalidArgumentError, GpuNotFoundError: see :func:`~hloserve.node.plan.assign_gpus`.
    """
    from hloserve.node.plan import assign_gpus, detect_gpus

    return assign_gpus(options.gpus, options.workers, detect_gpus())


def gateway_in_front(options: ServeOptions, workers: int) -> bool:
    """Whether ``serve`` runs the gateway on the public ports, the ``workers`` tritonservers on
    the worker ports behind it: with two or more, or ``--open-repository-api`` (the gateway
    takes model control without a credential and refuses what would stop a worker; the
    workers keep the key). One worker without it is served directly (no gateway hop)."""
    return workers > 1 or options.open_repository_api


def serve_plan(options: ServeOptions, repository: Path, gpus: Sequence[int | None]) -> NodePlan:
    """The node ``serve`` runs: one tritonserver per entry of ``gpus``, on the worker ports
    behind the gateway when :func:`gateway_in_front`, else on the public ports.

    Raises:
        InvalidArgumentError: a worker port clashes with the gateway's, or leaves 1..65535.
        GatewayConfigError: ``--gateway-config`` is invalid.
    """
    from hloserve.model_control import launcher_key
    from hloserve.node.plan import WorkerPlan, device_name, fleet_gateway_config, worker_ports

    if options.model_control_key is None:  # one key for every worker
        options = dataclasses.replace(options, model_control_key=launcher_key())
    gateway = None
    fronted = gateway_in_front(options, len(gpus))
    if not fronted:
        ports: Sequence[tuple[int, int, int]] = [
            (options.http_port, options.grpc_port, options.metrics_port)
        ]
    else:
        if options.grpc_port == 0:
            options = dataclasses.replace(options, grpc_port=free_port(options.host))
        if options.http_port == 0:
            options = dataclasses.replace(options, http_port=free_port(options.host))
        ports = worker_ports(len(gpus), options.worker_port_base, options.host)
        check_worker_ports(options, ports)
    servers = [
        worker_options(options, repository, WorkerPlan(i, gpu, *p))
        for i, (p, gpu) in enumerate(zip(ports, gpus, strict=True))
    ]
    if fronted:
        from hloserve.gateway.config import with_tls

        gateway = with_tls(
            fleet_gateway_config(
                servers,
                f"{options.host}:{options.grpc_port}",
                options.metrics_port,
                options.gateway_config,
                http_listen=f"{options.host}:{options.http_port}",
                open_repository_api=options.open_repository_api,
            ),
            options.tls_cert,
            options.tls_key,
            options.tls_client_ca,
        )
    return NodePlan(
        servers=tuple(servers),
        gateway=gateway,
        devices=tuple(device_name(g) for g in gpus),
        name=f"serve-{options.grpc_port}",
        host=options.host,
        admin_port=options.admin_port,
        startup_timeout_s=options.startup_timeout_s,
    )


def check_options(options: ServeOptions, gpus: Sequence[int | None] | None = None) -> None:
    """Refuse bad settings before anything is built or started; ``gpus`` None: worked out.

    Raises:
        InvalidArgumentError: --load-model or --open-repository-api without explicit mode,
            --workers,
            --front-instances or --max-request-bytes below 1, --gateway-config or TLS without
            the gateway (:func:`gateway_in_front`), a port out of range or shared, a host
            that does not resolve, a build option with PATH a model repository, a managed
            flag after ``--``, bad ``--watch`` settings.
        PortInUseError: (UNAVAILABLE) a port of the server or of the gateway is taken.
    """
    for flag in (arg.split("=", 1)[0] for arg in options.tritonserver_args):
        if flag in MANAGED_FLAGS:
            raise InvalidArgumentError(
                f"{flag} after '--' would change what hloserve serve sets and watches: use "
                f"hloserve serve's {MANAGED_FLAGS[flag]} instead"
            )
    if options.load_models and options.model_control_mode != "explicit":
        raise InvalidArgumentError("--load-model needs --model-control-mode explicit")
    if options.open_repository_api and options.model_control_mode not in (None, "explicit"):
        raise InvalidArgumentError(
            "--open-repository-api needs explicit model control, the default: with "
            f"--model-control-mode {options.model_control_mode} tritonserver refuses every "
            "load and unload"
        )
    workers = len(serve_gpus(options) if gpus is None else gpus)
    build = options.build
    sizes = {} if build is None else {"--front-instances": build.front_instances}
    sizes |= {} if build is None else {"--max-request-bytes": build.max_request_bytes}
    for flag, value in sizes.items():
        least = 0 if flag == "--front-instances" else 1  # 0: the build's default
        if value < least:
            raise InvalidArgumentError(f"{flag} must be at least {least}, got {value}")
    fronted = gateway_in_front(options, workers)
    if options.gateway_config is not None and not fronted:
        raise InvalidArgumentError(
            "--gateway-config needs --workers 2 or more, or --open-repository-api (the gateway)"
        )
    if not fronted and (options.tls_cert or options.tls_key or options.tls_client_ca):
        raise InvalidArgumentError(
            "--tls-cert/--tls-key need --workers 2 or more, or --open-repository-api (the gateway)"
        )
    if options.watch:
        from hloserve.node.watcher import check_watch_options

        check_watch_options(
            interval_s=options.watch_interval_s,
            path_is_repository=is_repository(options.path),
            model_control_mode=options.model_control_mode,
            load_models=options.load_models,
        )
    build_flags = build_flags_set(options)
    if build_flags and is_repository(options.path):
        raise InvalidArgumentError(
            f"{', '.join(build_flags)} {'applies' if len(build_flags) == 1 else 'apply'} when "
            f"PATH is a bundles directory (PATH {options.path} is a model repository: rebuild "
            "it with hloserve repo build BUNDLES OUT and these options, then serve OUT)"
        )
    try:
        socket.getaddrinfo(options.host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise InvalidArgumentError(
            f"cannot resolve host '{options.host}' ({getattr(exc, 'strerror', None) or exc})"
        ) from None
    if options.admin_port is not None and not 0 <= options.admin_port <= 65535:
        raise InvalidArgumentError(f"--admin-port {options.admin_port} is not in 0..65535")
    if options.admin_port and options.admin_port in (
        options.http_port,
        options.grpc_port,
        options.metrics_port,
    ):
        raise InvalidArgumentError(
            f"--admin-port {options.admin_port} is also the HTTP, gRPC or metrics port"
        )
    if not fronted:
        check_ports_free(options.host, _check_ports(options))
        return
    gateway = {
        "HTTP": options.http_port,
        "gRPC": options.grpc_port,
        "admin (--metrics-port)": options.metrics_port,
    }
    for endpoint, port in gateway.items():
        if not 0 <= port <= 65535:
            raise InvalidArgumentError(f"gateway {endpoint} port {port} is not in 0..65535")
    chosen = [p for p in gateway.values() if p]
    if len(set(chosen)) != len(chosen):
        raise InvalidArgumentError(
            f"the gateway's HTTP, gRPC and admin ports must differ: {gateway}"
        )
    check_ports_free(options.host, {k: v for k, v in gateway.items() if v}, "gateway ")
    if options.worker_port_base:
        from hloserve.node.plan import worker_ports

        planned = worker_ports(workers, options.worker_port_base, options.host)
        check_worker_ports(options, planned)
        for i, (http, grpc, metrics) in enumerate(planned):
            endpoints = {"HTTP": http, "gRPC": grpc, "metrics": metrics}
            check_ports_free(options.host, endpoints, f"worker {i} ")


def check_worker_ports(options: ServeOptions, workers: Sequence[tuple[int, int, int]]) -> None:
    """Refuse worker ports (:func:`~hloserve.node.plan.worker_ports`) that include one of the
    gateway's.

    Raises:
        InvalidArgumentError: a worker port equals the HTTP, gRPC or metrics port.
    """
    taken = {options.http_port, options.grpc_port, options.metrics_port} - {0}
    clash = sorted(taken & {p for w in workers for p in w})
    if clash:
        raise InvalidArgumentError(
            f"worker ports from --worker-port-base {options.worker_port_base} include the "
            f"gateway's port(s) {clash}; choose another base"
        )
