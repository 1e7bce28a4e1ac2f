"""``hloserve serve --workers N``: N tritonservers on the worker ports behind the gateway.

:func:`run_fleet` starts the fleet (:class:`~hloserve.node.fleet.LocalFleet`), prints where
each part listens and which models are not ready, and supervises it until stopped
(docs/gateway.md); :func:`node_observability` is the supervisor's admin port that the
one-server path of :func:`hloserve.node.serve.run_serve` uses too (docs/observability.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hloserve.node.model_control import model_states
from hloserve.node.ports import free_port
from hloserve.node.serve_options import (
    ServeOptions,
    build_arguments,
    check_worker_ports,
    server_options,
)

if TYPE_CHECKING:
    from hloserve.node.watch import Fingerprint
    from hloserve.observability.supervisor import NodeObservability


def run_fleet(
    options: ServeOptions,
    repository: Path,
    stop: threading.Event,
    watched: Mapping[str, Fingerprint] | None = None,
) -> int:
    """``--workers N``: N tritonservers on the worker ports, the gateway on the gRPC port.

    With ``watched`` (``--watch``: the bundles directory's content the repository was built
    from) the bundles directory is watched once the fleet is ready and every change is made
    on every worker (:class:`~hloserve.node.watcher.FleetModelControl`).
    """
    from hloserve.gateway.config import with_tls
    from hloserve.node.fleet import LocalFleet, supervise
    from hloserve.node.node_config import RestartConfig
    from hloserve.node.plan import fleet_gateway_config, worker_ports

    if options.grpc_port == 0:
        options = dataclasses.replace(options, grpc_port=free_port(options.host))
    if options.http_port == 0:
        options = dataclasses.replace(options, http_port=free_port(options.host))
    ports = worker_ports(options.workers, options.worker_port_base, options.host)
    check_worker_ports(options, ports)
    workers = [
        server_options(
            dataclasses.replace(
                options, http_port=p.http, grpc_port=p.grpc, metrics_port=p.metrics
            ),
            repository,
        )
        for p in ports
    ]
    gateway = with_tls(
        fleet_gateway_config(
            workers,
            f"{options.host}:{options.grpc_port}",
            options.metrics_port,
            options.gateway_config,
            http_listen=f"{options.host}:{options.http_port}",
        ),
        options.tls_cert,
        options.tls_key,
        options.tls_client_ca,
    )
    fleet = LocalFleet(workers, gateway, restart=RestartConfig())  # on-failure, as node up
    stack = contextlib.ExitStack()
    try:
        waited = fleet.start(options.startup_timeout_s, stop)
        lines = [f"hloserve: {options.workers} tritonservers serving {repository}"]
        for i, server in enumerate(fleet.servers):
            urls = server.urls
            lines.append(
                f"  worker {i} (pid {server.pid}): HTTP http://{urls.http}  gRPC {urls.grpc}"
                f"  metrics http://{urls.metrics}/metrics"
            )
        if waited is None:  # Ctrl-C during start-up
            print("\n".join(lines), flush=True)
            return 0
        assert fleet.gateway is not None
        admin = f"{options.host}:{fleet.gateway.admin_port}"
        metrics = [s.urls.metrics for s in fleet.servers if s.urls.metrics]
        observe = stack.enter_context(node_observability(options, metrics, admin))
        lines += [
            f"  gateway gRPC    {fleet.gateway.address} (KServe V2, mode {gateway.mode})",
            f"  gateway HTTP    http://{fleet.gateway.http_address} (KServe V2)",
            f"  gateway admin   http://{admin}/metrics, /healthz, /readyz",
        ]
        if observe.admin:
            lines.append(f"  admin           http://{observe.admin}/metrics (supervisor)")
        print("\n".join(lines), flush=True)
        failed = 0
        for i, server in enumerate(fleet.servers):
            key = server.options.model_control_key
            for name, (state, reason) in model_states(server.urls.http, key).items():
                if state != "READY":
                    failed += 1
                    print(f"  worker {i} model {name}: {state} - {reason}")
        for server in fleet.servers:
            server.stub_processes()  # the stub watchdog knows each live stub from now on
        first = fleet.servers[0]
        names = sorted(model_states(first.urls.http, first.options.model_control_key))
        print(f"  models: {', '.join(names)}")
        print(
            f"hloserve: ready after {waited:.1f} s"
            + (f", {failed} model(s) NOT ready" if failed else "")
            + " (Ctrl-C to stop)",
            flush=True,
        )
        if watched is None:  # /models on the admin port: the workers' index alone
            from hloserve.node.watcher import serve_model_list, server_model_control

            serve_model_list(observe, server_model_control(fleet.servers, 30.0))
        else:
            from hloserve.node.watcher import watching

            stack.enter_context(
                watching(
                    options.path,
                    repository,
                    fleet.servers,
                    observe,
                    watched,
                    build=build_arguments(options),
                    interval_s=options.watch_interval_s,
                    timeout_s=options.startup_timeout_s,
                )
            )
        return supervise(fleet, stop, lambda line: print(line, flush=True), observe=observe)
    finally:
        stack.close()
        fleet.close()
        print("hloserve: stopped", flush=True)


def node_observability(
    options: ServeOptions, worker_metrics: Sequence[str], gateway_admin: str | None
) -> NodeObservability:
    """The supervisor's admin port and scrape targets (docs/observability.md)."""
    from hloserve.observability.supervisor import NodeObservability

    return NodeObservability(
        f"serve-{options.grpc_port}",
        options.host,
        options.admin_port,
        worker_metrics,
        gateway_admin,
    )
