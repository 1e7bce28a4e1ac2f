"""KServe V2 gateway over several tritonservers (one per GPU).

Transport-neutral core (no gRPC, no process):
    config: typed settings (:class:`~hloserve.gateway.config.GatewayConfig`), YAML + env.
    routing: the routing table and :class:`~hloserve.gateway.routing.Router`, its holder
        (with the live knobs and HAProxy's routed and in-flight counts).
    placement: ``lpt_packing`` bin packing and the repack clock.
    packing: the ``lpt_packing`` control loop (statistics -> placement -> table).
    preconditions: ``lpt_packing``'s check that every worker schedules ``fifo`` or ``edf``.
    health: consecutive probe failures and the table restricted to healthy workers.
    aggregate: fleet ``ModelStatistics`` from the workers'.
    fleet_ops: the fleet-wide calls' rules (register with roll-back, unregister, merged
        index and statistics, first answer) as plans that gRPC and HTTP both drive.
    wire: partial decoding of raw ``ModelInferRequest`` bytes.
    dataplane: the HAProxy layout (backends per model, model map) and its configuration:
        where balance, fill quanta, admission and failover are defined.

Data plane and transport:
    haproxy: the HAProxy process, the only data plane for unary inference: map edits over
        its runtime API, hitless reloads, counters.
    proxy: the ``grpc.aio`` servicer of ``inference.GRPCInferenceService`` behind HAProxy
        (every other RPC, unrouted models and BYTES inputs checked, unrouted streams).
    fanout: that service's RPCs answered from every worker (index, statistics, shm, ...).
    fleet_http: the KServe HTTP calls that need every worker, on a threaded loopback server.
    upstreams: the channels to the workers, health probes, statistics polls, index and config
        reads.
    discovery: the routing table from the workers' answers; single-flight refreshes.
    control: the control plane: the scheduling state it reads and changes, and its
        ``hloserve.gateway.v1.GatewayControl`` servicer.
    interceptor: the one error-to-status path of the gateway's gRPC server.
    ctl: ``hloserve gateway-ctl``, the control plane's command-line client.
    admin: ``/healthz``, ``/readyz``, ``/metrics``.
    app: :func:`~hloserve.gateway.app.run_gateway`, used by ``hloserve gateway``.

See docs/gateway.md for what exists and what does not yet.
"""
