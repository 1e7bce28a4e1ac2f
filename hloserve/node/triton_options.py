"""How to run one tritonserver: :class:`TritonServerOptions` and :func:`server_flags`, the one
builder of its flags (local servers and the docker runtime alike). Pure values."""

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
    """How to run one tritonserver; fields named after a flag set that flag. ``metrics_port``
    None disables metrics; ``model_control_key``: with "explicit", the key Triton's repository
    API requires (:mod:`hloserve.model_control`), None leaves it open; ``extra_backend_dirs``:
    Python-based backends by name (each a directory with a ``model.py``), linked beside
    ``python/`` in the ``--backend-directory``; ``env``: over the parent's, for the server and
    its stubs; ``log_file`` receives the output (appended; None: file descriptor 1); ``run_dir``:
    where the backend directory is composed (None: a temporary one); ``die_with_parent``:
    SIGTERM the server when the thread that started it exits; ``install`` None: the
    nvidia-pytriton wheel's."""

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
        """Options with free HTTP, gRPC and metrics ports on ``host``; ``kwargs``: other fields."""
        http, grpc, metrics = free_ports(3, host)
        ports = {"http_port": http, "grpc_port": grpc, "metrics_port": metrics}
        return cls(model_repository, host=host, **ports, **kwargs)  # type: ignore[arg-type]

    def ports(self) -> dict[str, int]:
        """The ports the server binds, by endpoint name ("http", "grpc", "metrics")."""
        ports = {"http": self.http_port, "grpc": self.grpc_port}
        if self.metrics_port is not None:
            ports["metrics"] = self.metrics_port
        return ports


@dataclass(frozen=True)
class TritonServerUrls:
    """Endpoints of a server as ``host:port`` (no scheme); ``metrics`` None when disabled."""

    http: str
    grpc: str
    metrics: str | None


def server_flags(o: TritonServerOptions) -> list[str]:
    """The tritonserver flags of ``o`` that do not depend on where tritonserver is installed
    (the repository API keyed in explicit mode; ``o.extra_args`` last)."""
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
