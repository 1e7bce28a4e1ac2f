"""The gateway's data plane layout: which HAProxy backends exist and where each model goes.

Pure logic: :func:`plan_layout` (a routing table to a :class:`Layout`) and :func:`render_config`
(its HAProxy 2.6 configuration); docs/gateway.md, "Data plane".
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from hloserve.errors import GRPC_CODE, Status
from hloserve.gateway.auth import CERT_HEADER
from hloserve.gateway.config import GatewayConfig, SchedulingConfig
from hloserve.gateway.fleet_http import CONDITIONS as FLEET_HTTP_CONDITIONS
from hloserve.gateway.fleet_http import MODEL_CONTROL_PATH, MODEL_CONTROL_TIMEOUT_S
from hloserve.gateway.routing import RoutingTable

#: The Python control plane's backend: unknown models and every method but ModelInfer.
CONTROL_BACKEND = "hloserve_control"

#: KServe HTTP requests that name no routable model: any worker answers.
HTTP_ANY_BACKEND = "hloserve_http_any"

#: KServe HTTP requests that need every worker (:mod:`hloserve.gateway.fleet_http`).
HTTP_CONTROL_BACKEND = "hloserve_http_control"

#: KServe HTTP model load and unload: the same server, waited for longer.
HTTP_MODEL_CONTROL_BACKEND = "hloserve_http_model_control"

MODEL_INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"

#: Bytes HAProxy waits for before routing a ModelInfer request: the 5-byte gRPC prefix plus
#: ``model_name`` (field 1, first on the wire); a large request is never buffered whole.
ROUTE_AFTER_BYTES = 256

#: gRPC status codes of HAProxy's own answers (:data:`hloserve.errors.GRPC_CODE`).
GRPC_UNAVAILABLE = GRPC_CODE[Status.UNAVAILABLE]
GRPC_DEADLINE_EXCEEDED = GRPC_CODE[Status.DEADLINE_EXCEEDED]

#: An ``InferInputTensor``'s datatype field naming BYTES, hex: tag 0x12, length 5, "BYTES".
BYTES_DATATYPE_HEX = "1205" + b"BYTES".hex().upper()

Balance = str  # "roundrobin" | "leastconn" | "first"

#: Largest JSON part of a KServe HTTP inference request passed on, bytes: tritonserver 2.51
#: crashes parsing about 4 MiB of JSON (docs/gateway.md; triton-inference-server/server#5840).
HTTP_MAX_JSON_BYTES = 4_000_000
#: The gateway's answer to an HTTP request over :data:`HTTP_MAX_JSON_BYTES`.
HTTP_TOO_LARGE = (
    f"the request's JSON exceeds the gateway's limit of {HTTP_MAX_JSON_BYTES} bytes "
    "(tritonserver 2.51 crashes parsing larger JSON bodies); send large tensors with the "
    "binary data extension, over gRPC, or in shared memory"
)

#: Model names HAProxy can name a backend and a map key after (else :data:`UNROUTABLE_NAME`).
BACKEND_NAME = re.compile(r"[A-Za-z0-9_.:-]+")

#: The answer to a request for a model whose name :data:`BACKEND_NAME` rejects.
UNROUTABLE_NAME = (
    "model {model!r}: the gateway routes model names of letters, digits and '_.:-' only; "
    "rename the model's directory"
)


@dataclass(frozen=True)
class Backend:
    """One HAProxy backend: ``servers`` (indices into ``workers``), requests one server takes at
    once (``maxconn``) and the backend holds before refusing (``admit``); 0 = unbounded.
    """

    name: str
    servers: tuple[int, ...]
    balance: Balance
    maxconn: int
    admit: int


@dataclass(frozen=True)
class Layout:
    """Backends and the model -> backend map (a model absent goes to the control plane)."""

    backends: tuple[Backend, ...] = ()
    models: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def same_backends(self, other: Layout) -> bool:
        """Whether ``other`` needs no reload (the same backends; maps may differ)."""
        return self.backends == other.backends


def fill_quantum(max_batch: int | None, fill_factor: float) -> int:
    """Fill quantum of fill mode ``run`` in requests: ``ceil(max_batch x fill_factor)``, at least
    1, an unknown max batch counting 1 (docs/gateway.md, "Routing").
    """
    return max(1, math.ceil((max_batch or 1) * fill_factor))


def _balance(mode: str, scheduling: SchedulingConfig, model: str) -> Balance:
    if mode == "round_robin":
        return "roundrobin"
    if mode == "least_outstanding":
        return "leastconn"
    return "first" if scheduling.fill_mode_of(model) == "run" else "leastconn"


def plan_layout(
    table: RoutingTable, config: GatewayConfig, scheduling: SchedulingConfig | None = None
) -> Layout:
    """The layout serving ``table`` with the live ``scheduling`` knobs (default the config's);
    models on unknown endpoints only, or not :data:`BACKEND_NAME`, are left out.
    """
    scheduling = scheduling or config.scheduling
    index = {w: i for i, w in enumerate(config.workers)}
    per_worker = config.admission.max_inflight_requests_per_worker
    backends: dict[str, Backend] = {}
    models: dict[str, str] = {}
    for model, route in sorted(table.routes.items()):
        servers = tuple(sorted(index[w] for w in route.replicas if w in index))
        if not servers or not BACKEND_NAME.fullmatch(model):
            continue
        balance = _balance(config.mode, scheduling, model)
        maxconn = per_worker
        # a run of Q requests per replica; a lone replica is not capped (no next to open)
        if balance == "first" and len(servers) > 1:
            quantum_requests = fill_quantum(route.max_batch, scheduling.fill_factor_of(model))
            maxconn = min(per_worker, quantum_requests) if per_worker else quantum_requests
        name = f"m_{model}"
        backends[name] = Backend(name, servers, balance, maxconn, per_worker * len(servers))
        models[model] = name
    ordered = tuple(backends[n] for n in sorted(backends))
    return Layout(ordered, MappingProxyType(models))


@dataclass(frozen=True)
class Listen:
    """Where HAProxy accepts clients and reaches the control plane (host:port unless a path).

    ``*_checked``: loopback frontends for requests the control plane checked; ``http_control``
    None: any worker answers the fleet paths; ``client_cert_secret``: the
    :data:`~hloserve.gateway.auth.CERT_HEADER` value of a verified client certificate.
    """

    grpc: str
    control: str
    runtime_socket: str
    map_file: str
    http: str | None = None
    prometheus: str | None = None
    pem: str | None = None
    client_ca: str | None = None
    verify_client: str = "required"
    client_cert_secret: str | None = None
    http_control: str | None = None
    http_checked: str | None = None
    grpc_checked: str | None = None


#: HAProxy's own error answers as gRPC statuses: (HTTP status, gRPC status, message); clients
#: read ``grpc-status`` before the HTTP status (grpc/doc/PROTOCOL-HTTP2.md, "Responses").
ERROR_ANSWERS: tuple[tuple[int, int, str], ...] = (
    (
        502,
        GRPC_UNAVAILABLE,
        "model '%[var(txn.model)]': the worker failed while it held the request (its "
        "connection was lost); the gateway does not send a request that may have crashed a "
        "worker to another replica",
    ),
    (
        503,
        GRPC_UNAVAILABLE,
        "model '%[var(txn.model)]': no replica could take the request (every connection "
        "attempt was refused, or it waited in the queue past upstream.request_timeout_seconds)",
    ),
    (
        504,
        GRPC_DEADLINE_EXCEEDED,
        "model '%[var(txn.model)]': the worker did not answer within "
        "upstream.request_timeout_seconds",
    ),
)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _refuse(message: str, condition: str) -> str:
    return (
        "  http-request return status 200"
        f" hdr grpc-status {GRPC_UNAVAILABLE} hdr grpc-message {_quote(message)} if {condition}"
    )


def _client_cert_rules(listen: Listen, control: str) -> list[str]:
    """Remove the client's :data:`CERT_HEADER`; set the secret on a verified ``control`` request."""
    rules = [f"  http-request del-header {CERT_HEADER}"]
    if listen.client_cert_secret is not None:
        rules.append(
            f"  http-request set-header {CERT_HEADER} {listen.client_cert_secret}"
            f" if {{ ssl_c_used }} {{ ssl_c_verify 0 }} {control}"
        )
    return rules


def render_config(layout: Layout, config: GatewayConfig, listen: Listen, master_socket: str) -> str:
    """The HAProxy 2.6 configuration of ``layout``; ``master_socket`` is named in a comment."""
    timeout = config.upstream
    ssl = ""
    if listen.pem is not None:
        ssl = f" ssl crt {listen.pem} alpn h2"
        if listen.client_ca is not None:
            ssl += f" ca-file {listen.client_ca} verify {listen.verify_client}"
    lines = [
        "# Written by hloserve's gateway control plane (hloserve/gateway/dataplane.py);",
        f"# master socket {master_socket}. Changes are made live or by a reload.",
        "global",
        "  master-worker",
        f"  stats socket {listen.runtime_socket} mode 600 level admin expose-fd listeners",
        "  nbthread 1",
        "  noreuseport",
        "  tune.h2.initial-window-size 1048576",
        f"  hard-stop-after {int(timeout.request_timeout_seconds) + 5}s",
        "defaults",
        "  mode http",
        f"  timeout connect {int(timeout.probe_timeout_seconds * 1000)}ms",
        "  timeout client 3600s",
        f"  timeout server {int(timeout.request_timeout_seconds * 1000)}ms",
        f"  timeout queue {int(timeout.request_timeout_seconds * 1000)}ms",
        "  timeout http-request 3600s",
        f"  retries {max(1, len(config.workers) - 1)}",
        "  retry-on conn-failure",
        "  http-reuse never",
        "  option http-no-delay",
        "  option redispatch 1",
    ]
    for status, code, message in ERROR_ANSWERS:
        grpc_headers = f"hdr grpc-status {code} hdr grpc-message {_quote(message)}"
        lines.append(f"  http-error status {status} {grpc_headers}")
    infer = f"{{ path {MODEL_INFER_PATH} }}"
    checked = ""
    if listen.grpc_checked is not None:
        checked = f"{{ dst_port {listen.grpc_checked.rpartition(':')[2]} }}"
    lines += [
        "frontend grpc",
        f"  bind {listen.grpc} proto h2{ssl}",
        *([f"  bind {listen.grpc_checked} proto h2"] if listen.grpc_checked else []),
        f"  http-request wait-for-body time 1s at-least {ROUTE_AFTER_BYTES} if {infer}",
        f"  http-request set-var(txn.model) req.body,bytes(5),protobuf(1) if {infer}",
        f"  http-request set-var(txn.be) var(txn.model),map({listen.map_file},{CONTROL_BACKEND})"
        f" if {infer}",
        # every other method, ModelStreamInfer included, goes to the control plane
        f"  http-request set-var(txn.be) str({CONTROL_BACKEND}) if !{{ var(txn.be) -m found }}",
        # a BYTES first input goes to the control plane to check its shapes; HAProxy 2.6's
        # protobuf converter cannot reach field 5.2, so input 1's bytes are searched
        f"  http-request set-var(txn.be) str({CONTROL_BACKEND})"
        f" if {infer} {{ req.body,bytes(5),protobuf(5),hex -m sub {BYTES_DATATYPE_HEX} }}"
        + (f" !{checked}" if checked else ""),
        *_client_cert_rules(listen, f"{{ var(txn.be) -m str {CONTROL_BACKEND} }}"),
    ]
    if checked:  # the control plane checked it: never back to the control plane
        no_replica = "model '%[var(txn.model)]' has no ready replica"
        lines.append(_refuse(no_replica, f"{checked} {{ var(txn.be) -m str {CONTROL_BACKEND} }}"))
    per_worker = config.admission.max_inflight_requests_per_worker
    for backend in layout.backends:
        if not backend.admit:
            continue
        workers = ", ".join(config.workers[i] for i in backend.servers)
        message = (
            "model '%[var(txn.model)]': the gateway holds "
            f"{backend.admit} requests of the model in flight on worker(s) {workers} "
            f"(admission.max_inflight_requests_per_worker = {per_worker} per replica); "
            "retry later"
        )
        full = f"{{ be_conn({backend.name}) ge {backend.admit} }}"
        lines.append(_refuse(message, f"{{ var(txn.be) -m str {backend.name} }} {full}"))
    lines += [
        "  use_backend %[var(txn.be)]",
        f"backend {CONTROL_BACKEND}",
        f"  server control {listen.control} proto h2",
    ]
    for backend in layout.backends:
        lines += [f"backend {backend.name}", f"  balance {backend.balance}"]
        for i in backend.servers:
            limit = f" maxconn {backend.maxconn}" if backend.maxconn else ""
            lines.append(f"  server w{i} {config.workers[i]} proto h2{limit}")
    if listen.http is not None:
        lines += _render_http(layout, config, listen, ssl)
    if listen.prometheus is not None:  # read by the admin port's /metrics
        lines += [
            "frontend prometheus",
            f"  bind {listen.prometheus}",
            "  http-request use-service prometheus-exporter if { path /metrics }",
        ]
    return "\n".join(lines) + "\n"


def _render_http(layout: Layout, config: GatewayConfig, listen: Listen, ssl: str) -> list[str]:
    """KServe HTTP: model paths to ``h_<model>``, fleet paths to the control plane, else any."""
    checked = listen.http_checked is not None and listen.http_control is not None
    lines = _http_frontend("http", f"{listen.http}{ssl.replace(' alpn h2', '')}", listen, checked)
    if checked:
        lines += _http_frontend("http_checked", str(listen.http_checked), listen, False)
    if listen.http_control is not None:
        # a register's fan-out and roll-back, with room for the control plane's answer
        timeout = config.upstream
        wait_ms = int((timeout.request_timeout_seconds + timeout.probe_timeout_seconds + 5) * 1000)
        lines += [
            f"backend {HTTP_CONTROL_BACKEND}",
            f"  timeout server {wait_ms}ms",
            f"  server control {listen.http_control}",
            f"backend {HTTP_MODEL_CONTROL_BACKEND}",
            f"  timeout server {MODEL_CONTROL_TIMEOUT_S}s",
            f"  server control {listen.http_control}",
        ]
    lines += [f"backend {HTTP_ANY_BACKEND}", "  balance roundrobin"]
    lines += [f"  server w{i} {w}" for i, w in enumerate(config.worker_http)]
    for backend in layout.backends:
        lines += [f"backend h_{backend.name[2:]}", f"  balance {backend.balance}"]
        for i in backend.servers:
            limit = f" maxconn {backend.maxconn}" if backend.maxconn else ""
            lines.append(f"  server w{i} {config.worker_http[i]}{limit}")
    return lines


def _http_frontend(name: str, bind: str, listen: Listen, json_to_control: bool) -> list[str]:
    """One KServe HTTP frontend; ``json_to_control``: all-JSON inference to the control plane."""
    by_model = "{ path_beg /v2/models/ }"
    infer = f"{by_model} {{ path_end /infer }}"
    binary = "{ req.hdr(inference-header-content-length) -m found }"
    too_large = _quote('{"error":' + _quote(HTTP_TOO_LARGE) + "}")
    refuse = f"  http-request return status 400 content-type application/json string {too_large}"
    lines = [
        f"frontend {name}",
        f"  bind {bind}",
        *_client_cert_rules(listen, f"{{ path_reg {MODEL_CONTROL_PATH} }}"),
        # the JSON part over the limit: refused here, never sent to a worker
        f"{refuse} if {infer} !{binary} {{ req.hdr_val(content-length) gt {HTTP_MAX_JSON_BYTES} }}",
        f"{refuse} if {infer} {{ req.hdr_val(inference-header-content-length)"
        f" gt {HTTP_MAX_JSON_BYTES} }}",
        f"  http-request set-var(txn.model) path,field(4,/) if {by_model}",
        f"  http-request set-var(txn.hbe) var(txn.model),map({listen.map_file}),"
        "regsub(^m_,h_) if { var(txn.model) -m found }",
    ]
    if json_to_control:
        # all JSON: no binary data extension, or a JSON part that is the whole body
        whole = "{ req.hdr_val(content-length),sub(txn.json_bytes) -m int le 0 }"
        lines += [
            f"  http-request set-var(txn.json_bytes) req.hdr_val(inference-header-content-length)"
            f" if {infer} {binary}",
            f"  use_backend {HTTP_CONTROL_BACKEND} if {infer} !{binary} || {infer} {whole}",
        ]
    if listen.http_control is not None:
        lines += [
            *(f"  use_backend {HTTP_CONTROL_BACKEND} if {c}" for c in FLEET_HTTP_CONDITIONS),
            f"  use_backend {HTTP_MODEL_CONTROL_BACKEND} if {{ path_reg {MODEL_CONTROL_PATH} }}",
        ]
    lines += [
        "  use_backend %[var(txn.hbe)] if { var(txn.hbe) -m found }",
        f"  default_backend {HTTP_ANY_BACKEND}",
    ]
    return lines


def render_map(entries: Mapping[str, str]) -> str:
    """A map file: ``key value`` per line."""
    return "".join(f"{k} {v}\n" for k, v in sorted(entries.items()))


def map_changes(
    before: Mapping[str, str], after: Mapping[str, str]
) -> list[tuple[str, str, str | None]]:
    """Runtime API edits ``(verb, key, value)`` turning map ``before`` into ``after``."""
    edits: list[tuple[str, str, str | None]] = []
    for key, value in sorted(after.items()):
        if key not in before:
            edits.append(("add", key, value))
        elif before[key] != value:
            edits.append(("set", key, value))
    edits += [("del", key, None) for key in sorted(before) if key not in after]
    return edits
