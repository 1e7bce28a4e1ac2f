"""How to run one tritonserver: :class:`TritonServerOptions`, its endpoints, and
:func:`server_flags`, the one builder of tritonserver's flags (local servers and the Docker
runtime's command alike). No process, no file: pure values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from hloserve.node.triton_install import TritonInstall
from hloserve.ports import free_ports

ModelControlMode = Literal["none", "poll", "explicit"]


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
            repository API (:mod:`hloserve.model_control`); None leaves that API open.
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


def server_flags(o: TritonServerOptions) -> list[str]:
    """The tritonserver flags of ``o`` that do not depend on where tritonserver is installed.

    Model control (``--model-control-mode``, ``--load-model``), the three endpoints on
    ``o.host`` (metrics off with ``--allow-metrics=false`` when ``o.metrics_port`` is None),
    ``--log-verbose``, the repository API restricted to ``o.model_control_key`` in explicit mode
    (:func:`hloserve.model_control.restricted_flags`), then ``o.extra_args``. The one
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
        from hloserve.model_control import restricted_flags

        flags += restricted_flags(o.model_control_key)
    return [*flags, *o.extra_args]
