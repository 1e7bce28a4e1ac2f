"""Typed settings of ``hloserve gateway``: a YAML file plus ``HLOSERVE_GATEWAY_*`` overrides.

The keys, their meaning and their defaults follow ReactantServer's gateway (docs/gateway.md,
"ReactantServer's gateway"; the differences are listed under "Configuration" there); units are
in each field's name or description. Nothing is read at import time: call :func:`load_config`.

Environment overrides use ONE scheme. A variable named ``HLOSERVE_GATEWAY_<PATH>`` sets the
field at ``<PATH>``, where ``<PATH>`` is the dotted key path upper-cased with ``__`` between
levels::

    HLOSERVE_GATEWAY_MODE=lpt_packing                      -> mode
    HLOSERVE_GATEWAY_ADMIN_PORT=9002                       -> admin_port
    HLOSERVE_GATEWAY_SCHEDULING__HYSTERESIS=0.2            -> scheduling.hysteresis
    HLOSERVE_GATEWAY_UPSTREAM__REQUEST_TIMEOUT_SECONDS=30  -> upstream.request_timeout_seconds
    HLOSERVE_GATEWAY_WORKERS=127.0.0.1:8101,127.0.0.1:8104 -> workers (comma list, replaces)
    HLOSERVE_GATEWAY_WORKER_METRICS=127.0.0.1:8102,...     -> worker_metrics (likewise)

Values are parsed like the YAML scalars they stand for (``true``, ``0.2``, ``all``). An
override wins over the file. A variable with the prefix that names no field is an error (a
typo must not be ignored silently); ``scheduling.models`` (a map) has no environment form.
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


#: A ``host:port`` endpoint (checked by :func:`_check_host_port`).
HostPort = Annotated[str, AfterValidator(_check_host_port)]

#: Keys of the Python data plane, removed when HAProxy became the only one for unary inference
#: (docs/gateway.md, "Removed settings"): key -> what to use instead.
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
        """A removed key is refused with what to use instead (:data:`REMOVED_KEYS`)."""
        if isinstance(data, Mapping):
            for key, instead in REMOVED_KEYS.get(cls.__name__, {}).items():
                if key in data:
                    raise ValueError(f"{key} was removed: {instead}")
        return data


class GrpcLimits(_Section):
    """gRPC message-size limits of the gateway's server and of every upstream channel.

    Attributes:
        max_recv_msg_bytes: largest message received, bytes (default 2 GiB - 1, as Triton).
        max_send_msg_bytes: largest message sent, bytes (default 2 GiB - 1, as Triton).
    """

    max_recv_msg_bytes: int = Field(default=MAX_GRPC_MESSAGE_BYTES, gt=0, le=MAX_GRPC_MESSAGE_BYTES)
    max_send_msg_bytes: int = Field(default=MAX_GRPC_MESSAGE_BYTES, gt=0, le=MAX_GRPC_MESSAGE_BYTES)


class UpstreamConfig(_Section):
    """How the gateway talks to workers (ReactantServer's ``worker_client`` section).

    Attributes:
        request_timeout_seconds: deadline of one forwarded inference call, seconds (60).
        probe_timeout_seconds: deadline of one discovery/health probe, seconds (8, as in
            ReactantServer).
        model_control_key: the key ``hloserve serve`` workers require on Triton's repository
            API (``RepositoryIndex``, which discovery polls; docs/serving.md). None (default):
            ``HLOSERVE_MODEL_CONTROL_KEY`` when set, else the key of the servers this process
            started (``serve --workers``, ``node up``), else none.
    """

    request_timeout_seconds: float = Field(default=60.0, gt=0)
    probe_timeout_seconds: float = Field(default=8.0, gt=0)
    model_control_key: SecretStr | None = None


class DiscoveryConfig(_Section):
    """Route discovery (docs/gateway.md, "Proxy": ``discover_table``).

    Attributes:
        poll_interval_seconds: seconds between polls of every worker's RepositoryIndex,
            ServerReady and statistics (10, ReactantServer's health interval).
    """

    poll_interval_seconds: float = Field(default=10.0, gt=0)


class HealthConfig(_Section):
    """Worker health probes (docs/gateway.md, "Health probes").

    Every ``interval_seconds`` the gateway calls each worker's ``ServerReady`` (deadline
    ``upstream.probe_timeout_seconds``). A worker failing ``failure_threshold`` probes in a row
    (error, deadline or ``ready: false``) leaves the routing table; one passing probe brings
    it back, after a discovery pass of its models.

    Attributes:
        interval_seconds: seconds between two probes of every worker (2.0, > 0).
        failure_threshold: consecutive failed probes that remove a worker (2, >= 1).
    """

    interval_seconds: float = Field(default=2.0, gt=0)
    failure_threshold: int = Field(default=2, ge=1)


class AdmissionConfig(_Section):
    """Bounds on the requests the gateway holds at once (docs/gateway.md, "Admission").

    HAProxy applies the bound where :func:`hloserve.gateway.dataplane.render_config` writes
    it: a request over it is refused at once with UNAVAILABLE (Triton's answer when a model's
    queue is full) and a message naming the model and the bound; nothing is queued.

    Attributes:
        max_inflight_requests_per_worker: requests of one model in flight on one of its
            replicas (64; 0 = unbounded); HAProxy counts requests, not items.
    """

    max_inflight_requests_per_worker: int = Field(default=64, ge=0)


class TlsConfig(_Section):
    """TLS on the gateway's public gRPC port (HAProxy terminates it; plaintext is refused).

    Attributes:
        cert: PEM file of the server certificate (and its chain).
        key: PEM file of the certificate's private key.
        client_ca: PEM file of the CAs client certificates must chain to; None (default) =
            no client certificate asked for.
    """

    cert: Path
    key: Path
    client_ca: Path | None = None


class ModelScheduling(_Section):
    """Per-model overrides of the ``lpt_packing`` knobs (replica count, fill mode and factor).

    Attributes:
        replicas: distinct workers holding the model: a positive integer or ``"all"``
            (1 when the entry is present).
        fill_mode: ``run`` or ``spread``; None inherits ``scheduling.routing_fill_mode``.
        fill_factor: multiplier of the max batch giving the fill quantum (requests), > 0;
            None inherits ``scheduling.routing_fill_factor``.
    """

    replicas: Replicas = 1
    fill_mode: FillMode | None = None
    fill_factor: float | None = Field(default=None, gt=0)


class SchedulingConfig(_Section):
    """Knobs of ``lpt_packing`` with ReactantServer's defaults (docs/gateway.md, "Configuration").

    Attributes:
        default_replicas: distinct workers per model, a positive integer or ``"all"`` (1).
        forbid_memory_oversubscription: never place a model on a worker whose weight budget it
            would overflow while a worker with room exists (true).
        hysteresis: fraction in [0, 1); a model keeps its current worker unless another one
            lowers its pressure by more than this fraction (0.0).
        rebalance_compute_seconds: fleet compute-seconds (summed over workers) between two
            traffic-driven repacks, seconds > 0 (300).
        first_rebalance_compute_seconds: budget of the first traffic-driven repack, seconds
            (60; 0 means use ``rebalance_compute_seconds``).
        routing_fill_factor: fill quantum = worker-reported max batch x this factor, rounded
            up, in requests: HAProxy counts requests, not items (1.0, > 0).
        routing_fill_mode: ``run`` fills one replica up to the quantum (in requests at
            once) before the next (HAProxy ``balance first``); ``spread`` sends each request
            to the replica with the fewest in flight (``leastconn``) (``run``).
        models: per-model overrides, keyed by model name (no environment form).
    """

    default_replicas: Replicas = 1
    forbid_memory_oversubscription: bool = True
    hysteresis: float = Field(default=0.0, ge=0.0, lt=1.0)
    rebalance_compute_seconds: float = Field(default=300.0, gt=0)
    first_rebalance_compute_seconds: float = Field(default=60.0, ge=0)
    routing_fill_factor: float = Field(default=1.0, gt=0)
    routing_fill_mode: FillMode = "run"
    models: dict[str, ModelScheduling] = Field(default_factory=dict)

    def replicas_of(self, model: str) -> Replicas:
        """Configured replica count of ``model`` (its own entry, else ``default_replicas``)."""
        entry = self.models.get(model)
        return entry.replicas if entry is not None else self.default_replicas

    def fill_mode_of(self, model: str) -> FillMode:
        """Fill mode of ``model`` (its own entry, else ``routing_fill_mode``)."""
        entry = self.models.get(model)
        if entry is not None and entry.fill_mode is not None:
            return entry.fill_mode
        return self.routing_fill_mode

    def fill_factor_of(self, model: str) -> float:
        """Fill factor of ``model`` (its own entry, else ``routing_fill_factor``)."""
        entry = self.models.get(model)
        if entry is not None and entry.fill_factor is not None:
            return entry.fill_factor
        return self.routing_fill_factor


#: Knobs of :class:`SchedulingConfig` the control plane may change live (``mode``, endpoints
#: and ports are startup-only).
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
    """Settings of one gateway process.

    Attributes:
        listen: host:port of the KServe V2 gRPC endpoint ("127.0.0.1:8001", Triton's gRPC port).
        admin_port: port of the admin HTTP server (/healthz, /readyz, /metrics) on the listen
            host (8002, Triton's metrics port).
        workers: host:port of every worker's gRPC endpoint, at least one, no duplicates.
        worker_metrics: host:port of every worker's metrics endpoint (Triton's 8002), in the
            order of ``workers``; empty (default) = weight footprints and budgets unknown.
            ``lpt_packing`` reads the runtime's ``hloserve_weight_*`` series there.
        mode: ``round_robin`` (default), ``least_outstanding`` or ``lpt_packing`` (docs/gateway.md,
            "Routing").
        scheduling: ``lpt_packing`` knobs (ignored by the other modes).
        discovery: route discovery settings.
        upstream: timeouts of calls to workers.
        grpc: message-size limits.
        health: worker health probes.
        admission: bounds on requests in flight.
        http_listen: host:port of the KServe V2 HTTP endpoint (Triton's 8000; ``worker_http``
            needed); None (default) = gRPC only.
        worker_http: host:port of every worker's HTTP endpoint, in the order of ``workers``.
        tls: TLS on the public ports (HAProxy terminates it); None = plaintext.
        exit_timeout_seconds: on stop, how long requests in flight may take to finish, seconds
            (Triton's ``--exit-timeout-secs``, default 30): the public ports stop taking new
            connections at once (HAProxy's frontends disabled), and the gateway stops when the
            last request in flight is answered or this runs out.
    """

    listen: HostPort = "127.0.0.1:8001"
    admin_port: int = Field(default=8002, ge=0, le=65535)
    workers: tuple[HostPort, ...] = Field(min_length=1)
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
    """``config`` with TLS from command-line flags (``--tls-cert``, ``--tls-key``,
    ``--tls-client-ca``); unchanged when no flag is given.

    Raises:
        GatewayConfigError: only one of cert and key, or a client CA without them.
    """
    if cert is None and key is None and client_ca is None:
        return config
    if cert is None or key is None:
        raise GatewayConfigError("gateway config: --tls-cert and --tls-key go together")
    data = config.model_dump()
    data["tls"] = {"cert": cert, "key": key, "client_ca": client_ca}
    try:
        return GatewayConfig.model_validate(data)
    except ValueError as exc:
        raise GatewayConfigError(f"gateway config: {exc}") from None


def load_config(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> GatewayConfig:
    """Read the gateway settings from a YAML file and ``HLOSERVE_GATEWAY_*`` variables.

    Args:
        path: a YAML mapping of the :class:`GatewayConfig` keys; None reads the environment
            alone (then ``HLOSERVE_GATEWAY_WORKERS`` is required).
        environ: the environment to read (``os.environ`` when None).

    Returns:
        The validated, frozen configuration.

    Raises:
        GatewayConfigError: unreadable file, not a mapping, unknown key or variable, or a
            value out of range; the message names every offending key path.
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
