"""Typed settings of ``hloserve gateway``: a YAML file plus ``HLOSERVE_GATEWAY_*`` overrides.

Keys, defaults and the environment scheme: docs/gateway.md, "Configuration". Nothing is read
at import time: call :func:`load_config`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from hloserve.errors import GatewayConfigError
from hloserve.settings import load_settings

#: Top-level keys whose environment form is a comma list that replaces the list.
_LIST_KEYS = ("workers", "worker_metrics", "worker_http")

#: Prefix of every environment override.
ENV_PREFIX = "HLOSERVE_GATEWAY_"

#: Triton's and tritonclient's gRPC message limit (2 GiB - 1 byte; gRPC takes an int32).
MAX_GRPC_MESSAGE_BYTES = 2**31 - 1

Mode = Literal["round_robin", "least_outstanding", "lpt_packing"]
FillMode = Literal["run", "spread"]


def _positive(value: int | str) -> int | str:
    if isinstance(value, int) and value < 1:
        raise ValueError(f"replicas must be a positive integer or 'all', got {value}")
    return value


Replicas = Annotated[int | Literal["all"], AfterValidator(_positive)]


def _check_host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected host:port with a port in 1..65535, got {value!r}")
    return value


HostPort = Annotated[str, AfterValidator(_check_host_port)]

#: Removed keys (docs/gateway.md, "Removed settings"): section -> key -> what to use instead.
REMOVED_KEYS: dict[str, dict[str, str]] = {
    "GatewayConfig": {
        "data_plane": "HAProxy is the only data plane; remove the key (docs/gateway.md, "
        '"Removed settings")',
    },
    "AdmissionConfig": {
        "max_inflight_items_per_model": "HAProxy counts requests, not items: use "
        "admission.max_inflight_requests_per_worker (a bound per model and replica)",
    },
    "SchedulingConfig": {
        "routing_policy": "HAProxy's balance algorithm follows routing_fill_mode (run: "
        "'first', spread: 'leastconn'); remove the key",
    },
}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _refuse_removed(cls, data: object) -> object:
        if isinstance(data, Mapping):
            for key, instead in REMOVED_KEYS.get(cls.__name__, {}).items():
                if key in data:
                    raise ValueError(f"{key} was removed: {instead}")
        return data


class GrpcLimits(_Section):
    """gRPC message-size limits (bytes) of the gateway's server and every upstream channel."""

    max_recv_msg_bytes: int = Field(default=MAX_GRPC_MESSAGE_BYTES, gt=0, le=MAX_GRPC_MESSAGE_BYTES)
    max_send_msg_bytes: int = Field(default=MAX_GRPC_MESSAGE_BYTES, gt=0, le=MAX_GRPC_MESSAGE_BYTES)


class UpstreamConfig(_Section):
    """How the gateway talks to workers (ReactantServer's ``worker_client`` section);
    ``model_control_key`` None: ``HLOSERVE_MODEL_CONTROL_KEY``, else this process's servers' key.
    """

    request_timeout_seconds: float = Field(default=60.0, gt=0)
    probe_timeout_seconds: float = Field(default=8.0, gt=0)
    model_control_key: SecretStr | None = None


class DiscoveryConfig(_Section):
    """Route discovery, and the workers from DNS (docs/kubernetes.md, "DNS discovery")."""

    poll_interval_seconds: float = Field(default=10.0, gt=0)
    dns_name: str | None = Field(default=None, min_length=1)
    dns_interval_seconds: float = Field(default=5.0, gt=0)
    dns_nameserver: HostPort | None = None
    worker_grpc_port: int = Field(default=8001, gt=0, le=65535)
    worker_http_port: int = Field(default=8000, gt=0, le=65535)
    worker_metrics_port: int = Field(default=8002, ge=0, le=65535)


class HealthConfig(_Section):
    """Worker health probes (docs/gateway.md, "Health probes")."""

    interval_seconds: float = Field(default=2.0, gt=0)
    failure_threshold: int = Field(default=2, ge=1)


class AdmissionConfig(_Section):
    """Requests of one model in flight per replica (docs/gateway.md, "Admission"; 0 = unbounded)."""

    max_inflight_requests_per_worker: int = Field(default=64, ge=0)


class TlsConfig(_Section):
    """TLS on the public ports, HAProxy terminating it (docs/gateway.md, "Control plane")."""

    cert: Path
    key: Path
    client_ca: Path | None = None
    verify_client: Literal["required", "optional"] = "required"


class AuthConfig(_Section):
    """Control-plane credentials (docs/gateway.md, "Control plane: authentication").

    Attributes:
        open_repository_api: model load and unload (gRPC ``RepositoryModelLoad`` /
            ``RepositoryModelUnload``, HTTP ``POST /v2/repository/models/{m}/load|unload``)
            need no credential, as on a plain tritonserver; ``GatewayControl`` still does.
            A load may carry model files and a Python model is code: whoever reaches the
            gateway's ports can run code on the workers. ``serve --open-repository-api`` sets it.
    """

    token_file: Path | None = None
    open_repository_api: bool = False


class ModelScheduling(_Section):
    """Per-model overrides of ``lpt_packing``'s replicas, fill mode and factor (None inherits)."""

    replicas: Replicas = 1
    fill_mode: FillMode | None = None
    fill_factor: float | None = Field(default=None, gt=0)


_NO_OVERRIDE = ModelScheduling()


class SchedulingConfig(_Section):
    """Knobs of ``lpt_packing``, ReactantServer's defaults (docs/gateway.md, "Configuration")."""

    default_replicas: Replicas = 1
    forbid_memory_oversubscription: bool = True
    hysteresis: float = Field(default=0.0, ge=0.0, lt=1.0)
    rebalance_compute_seconds: float = Field(default=300.0, gt=0)
    first_rebalance_compute_seconds: float = Field(default=60.0, ge=0)
    routing_fill_factor: float = Field(default=1.0, gt=0)
    routing_fill_mode: FillMode = "run"
    models: dict[str, ModelScheduling] = Field(default_factory=dict)

    def replicas_of(self, model: str) -> Replicas:
        """Configured replica count of ``model`` (its entry, else ``default_replicas``)."""
        entry = self.models.get(model)
        return entry.replicas if entry is not None else self.default_replicas

    def fill_mode_of(self, model: str) -> FillMode:
        """Fill mode of ``model`` (its entry, else ``routing_fill_mode``)."""
        return self.models.get(model, _NO_OVERRIDE).fill_mode or self.routing_fill_mode

    def fill_factor_of(self, model: str) -> float:
        """Fill factor of ``model`` (its entry, else ``routing_fill_factor``)."""
        return self.models.get(model, _NO_OVERRIDE).fill_factor or self.routing_fill_factor


#: Knobs of :class:`SchedulingConfig` the control plane may change live.
KNOBS = (
    "default_replicas",
    "forbid_memory_oversubscription",
    "hysteresis",
    "rebalance_compute_seconds",
    "first_rebalance_compute_seconds",
    "routing_fill_factor",
    "routing_fill_mode",
)


class GatewayConfig(_Section):
    """Settings of one gateway process (keys: docs/gateway.md, "Configuration")."""

    listen: HostPort = "127.0.0.1:8001"
    admin_port: int = Field(default=8002, ge=0, le=65535)
    workers: tuple[HostPort, ...] = ()
    worker_metrics: tuple[HostPort, ...] = ()
    mode: Mode = "round_robin"
    scheduling: SchedulingConfig = Field(default_factory=SchedulingConfig)
    discovery: DiscoveryConfig = Field(default_factory=DiscoveryConfig)
    upstream: UpstreamConfig = Field(default_factory=UpstreamConfig)
    grpc: GrpcLimits = Field(default_factory=GrpcLimits)
    health: HealthConfig = Field(default_factory=HealthConfig)
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    http_listen: HostPort | None = None
    worker_http: tuple[HostPort, ...] = ()
    tls: TlsConfig | None = None
    auth: AuthConfig = Field(default_factory=AuthConfig)
    exit_timeout_seconds: float = Field(default=30.0, ge=0)

    @field_validator("workers")
    @classmethod
    def _workers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        duplicates = sorted({w for w in value if value.count(w) > 1})
        if duplicates:
            raise ValueError(f"duplicate worker endpoints: {', '.join(duplicates)}")
        return value

    @model_validator(mode="after")
    def _same_length(self) -> GatewayConfig:
        if self.discovery.dns_name is not None:
            given = [k for k in _LIST_KEYS if getattr(self, k)]
            if given:
                raise ValueError(
                    f"discovery.dns_name ({self.discovery.dns_name}) finds the workers: "
                    f"leave {', '.join(given)} empty"
                )
            return self
        if not self.workers:
            raise ValueError("workers: give at least one worker, or discovery.dns_name")
        if self.http_listen is not None and len(self.worker_http) != len(self.workers):
            raise ValueError(
                f"http_listen needs worker_http: one HTTP endpoint per worker, in the order of"
                f" workers ({len(self.workers)}), got {len(self.worker_http)}"
            )
        if self.worker_metrics and len(self.worker_metrics) != len(self.workers):
            raise ValueError(
                f"worker_metrics names {len(self.worker_metrics)} endpoints for"
                f" {len(self.workers)} workers; give one per worker, in the same order"
            )
        return self


def with_tls(
    config: GatewayConfig, cert: Path | None, key: Path | None, client_ca: Path | None = None
) -> GatewayConfig:
    """``config`` with TLS from ``--tls-cert``, ``--tls-key``, ``--tls-client-ca`` (if given).

    Raises:
        GatewayConfigError: only one of cert and key, or a client CA without them.
    """
    if cert is None and key is None and client_ca is None:
        return config
    if cert is None or key is None:
        raise GatewayConfigError("gateway config: --tls-cert and --tls-key go together")
    data = config.model_dump()
    verify = config.tls.verify_client if config.tls is not None else "required"
    data["tls"] = {"cert": cert, "key": key, "client_ca": client_ca, "verify_client": verify}
    try:
        return GatewayConfig.model_validate(data)
    except ValueError as exc:
        raise GatewayConfigError(f"gateway config: {exc}") from None


def load_config(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> GatewayConfig:
    """Read the gateway settings from a YAML file (None: none) and ``HLOSERVE_GATEWAY_*`` variables.

    Raises:
        GatewayConfigError: a bad file, key, variable or value; names every offending key path.
    """
    return load_settings(
        GatewayConfig,
        what="gateway config",
        error=GatewayConfigError,
        path=path,
        environ=os.environ if environ is None else environ,
        prefix=ENV_PREFIX,
        list_keys=_LIST_KEYS,
        no_env_keys=("models",),
    )
