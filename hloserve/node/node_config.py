"""Typed settings of ``hloserve node up|down``: a YAML file plus ``HLOSERVE_NODE_<PATH>``
overrides, read by :func:`load_node_config` (keys, defaults, override rules: docs/deployment.md).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from hloserve.errors import NodeConfigError
from hloserve.node.triton_options import ModelControlMode
from hloserve.settings import load_settings

#: Prefix of every environment override.
ENV_PREFIX = "HLOSERVE_NODE_"

Runtime = Literal["process", "docker"]
Launcher = Literal["tritonserver", "hloserve"]
RestartName = Literal["no", "on-failure", "always", "unless-stopped"]


def _matching(pattern: str, expected: str) -> AfterValidator:
    def check(value: str) -> str:
        if not re.match(pattern, value):
            raise ValueError(f"expected {expected}, got {value!r}")
        return value

    return AfterValidator(check)


_Name = Annotated[
    str, _matching(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$", "letters, digits and _.- (at most 63)")
]
_ShmSize = Annotated[str, _matching(r"^[0-9]+[bkmgBKMG]?$", "a size like 1g, 512m or 1073741824")]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PortsConfig(_Section):
    """Port plan of the workers: worker ``i`` binds ``<base> + i * stride`` (``stride`` must
    exceed the spread of the three bases); ``admin_base + i``: the admin port of the
    ``hloserve serve`` in worker container ``i`` (``docker.launcher: hloserve``; 0 = free)."""

    http_base: int = Field(default=8100, ge=1, le=65535)
    grpc_base: int = Field(default=8101, ge=1, le=65535)
    metrics_base: int = Field(default=8102, ge=1, le=65535)
    stride: int = Field(default=3, ge=1)
    admin_base: int = Field(default=8004, ge=0, le=65535)

    @model_validator(mode="after")
    def _distinct(self) -> PortsConfig:
        bases = (self.http_base, self.grpc_base, self.metrics_base)
        if len(set(bases)) != 3:
            raise ValueError(f"http_base, grpc_base and metrics_base must differ, got {bases}")
        if max(bases) - min(bases) >= self.stride:
            raise ValueError(
                f"stride {self.stride} must exceed the spread of the base ports "
                f"({max(bases) - min(bases)}), or two workers' ports overlap"
            )
        return self

    def of_worker(self, index: int) -> tuple[int, int, int]:
        """(http, grpc, metrics) ports of worker ``index``."""
        step = index * self.stride
        return self.http_base + step, self.grpc_base + step, self.metrics_base + step


class RestartConfig(_Section):
    """What happens when a worker dies: Docker's restart policy names and meaning
    (``max_retries`` 0: unlimited)."""

    policy: RestartName = "on-failure"
    max_retries: int = Field(default=5, ge=0)


class TritonConfig(_Section):
    """tritonserver settings shared by every worker (``args``: further flags, last)."""

    model_control_mode: ModelControlMode = "explicit"
    load_models: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    log_verbose: int = Field(default=0, ge=0)
    startup_timeout_s: float = Field(default=600.0, gt=0)

    @property
    def loads(self) -> tuple[str, ...]:
        """The models loaded at start: ``load_models``, or every one (``*``) in explicit mode."""
        explicit = self.model_control_mode == "explicit"
        return self.load_models or (("*",) if explicit else ())


class DockerConfig(_Section):
    """Settings of the docker runtime (ignored by the process runtime), each key in
    docs/deployment.md ("The node file", the container table); ``backend_directory``: the
    ``--backend-directory`` inside the image (launcher tritonserver); ``mounts`` ``ro`` when
    omitted; ``ulimits``: soft = hard, -1 = unlimited; ``gpu_driver``: of the device requests."""

    image: str | None = None
    launcher: Launcher = "tritonserver"
    backend_directory: str = "/opt/tritonserver/backends"
    repository_mount: str = "/models"
    ipc: Literal["host", "private"] = "host"
    shm_size: _ShmSize = "1g"
    env: dict[str, str] = Field(default_factory=dict)
    mounts: tuple[str, ...] = ()
    stop_timeout_s: int = Field(default=30, ge=0)
    ulimits: dict[str, int] = Field(default_factory=lambda: {"memlock": -1, "stack": 67108864})
    gpu_driver: str = "nvidia"

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for mount in value:
            parts = mount.split(":")
            if (
                len(parts) not in (2, 3)
                or not all(parts[:2])
                or parts[2:] not in ([], ["ro"], ["rw"])
            ):
                raise ValueError(f"expected HOST:CONTAINER[:ro|rw], got {mount!r}")
            if not parts[0].startswith("/") or not parts[1].startswith("/"):
                raise ValueError(f"mount paths must be absolute, got {mount!r}")
        return value


class NodeGatewayConfig(_Section):
    """The gateway in front of the workers, run in the ``node up`` process (``enabled: auto``:
    with two or more workers; ``settings``: further gateway keys, not the ones the node sets).
    """

    enabled: bool | Literal["auto"] = "auto"
    listen: str = "127.0.0.1:8001"
    http_listen: str | None = "127.0.0.1:8000"
    admin_port: int = Field(default=8002, ge=0, le=65535)
    settings: dict[str, Any] = Field(default_factory=dict)

    @field_validator("settings")
    @classmethod
    def _settings(cls, value: dict[str, Any]) -> dict[str, Any]:
        node_keys = {"workers", "worker_metrics", "worker_http", "listen", "http_listen"}
        reserved = sorted((node_keys | {"admin_port"}) & set(value))
        if reserved:
            raise ValueError(f"{', '.join(reserved)} are set by the node, not in settings")
        return value


class NodeConfig(_Section):
    """Settings of one node: the workers of one machine and the gateway in front of them
    (exactly one of ``gpus`` and ``cpu_workers``; ``name`` labels its containers)."""

    name: _Name = "hloserve"
    runtime: Runtime = "process"
    repository: Path
    host: str = "127.0.0.1"
    gpus: Literal["all"] | tuple[int, ...] = ()
    cpu_workers: int = Field(default=0, ge=0)
    ports: PortsConfig = Field(default_factory=PortsConfig)
    restart: RestartConfig = Field(default_factory=RestartConfig)
    tritonserver: TritonConfig = Field(default_factory=TritonConfig)
    docker: DockerConfig = Field(default_factory=DockerConfig)
    gateway: NodeGatewayConfig = Field(default_factory=NodeGatewayConfig)
    admin_port: int | None = Field(default=None, ge=0, le=65535)

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return (value,)
        if isinstance(value, str) and value != "all":
            parts = [p.strip() for p in value.split(",") if p.strip()]
            if not all(p.isdigit() for p in parts):
                raise ValueError(f"expected 'all' or GPU indices like 0,1, got {value!r}")
            return tuple(int(p) for p in parts)
        return value

    @field_validator("gpus")
    @classmethod
    def _gpu_indices(cls, value: Literal["all"] | tuple[int, ...]) -> Any:
        if value == "all":
            return value
        if any(i < 0 for i in value) or len(set(value)) != len(value):
            raise ValueError(f"GPU indices must be distinct and >= 0, got {list(value)}")
        return value

    @model_validator(mode="after")
    def _workers(self) -> NodeConfig:
        if (self.gpus == "all" or self.gpus) and self.cpu_workers:
            raise ValueError("set gpus or cpu_workers, not both")
        if not (self.gpus == "all" or self.gpus) and not self.cpu_workers:
            raise ValueError("no workers: set gpus ('all' or indices) or cpu_workers (>= 1)")
        return self


def load_node_config(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> NodeConfig:
    """Read the node settings from a YAML file (None: the environment alone) and
    ``HLOSERVE_NODE_*`` variables; a relative ``repository`` is relative to the file; raises
    NodeConfigError: unreadable file, not a mapping, unknown key or variable, or a value out of
    range; the message names every offending key path."""
    return load_settings(
        NodeConfig,
        what="node config",
        error=NodeConfigError,
        path=path,
        environ=os.environ if environ is None else environ,
        prefix=ENV_PREFIX,
        raw_keys=("gpus",),
        prepare_file=_resolve_repository,
    )


def _resolve_repository(data: dict[str, Any], path: Path) -> None:
    repository = data.get("repository")
    if isinstance(repository, str) and not Path(repository).is_absolute():
        data["repository"] = str(path.resolve().parent / repository)
