"""KServe V2 gRPC gateway over several tritonservers (one per GPU).

Transport-neutral core (no gRPC):
    config: typed settings (:class:`~hloserve.gateway.config.GatewayConfig`), YAML + env.
    routing: routing table, :class:`~hloserve.gateway.routing.Router`, schedulers.
    placement: ``lpt_packing`` bin packing and the repack clock.
    packing: the ``lpt_packing`` control loop (statistics -> placement -> table).
    aggregate: fleet ``ModelStatistics`` from the workers'.
    wire: partial decoding of raw ``ModelInferRequest`` bytes.

Transport:
    proxy: ``grpc.aio`` handlers of ``inference.GRPCInferenceService``, discovery calls.
    admin: ``/healthz``, ``/readyz``, ``/metrics``.
    app: :func:`~hloserve.gateway.app.run_gateway`, used by ``hloserve gateway``.

See docs/gateway.md for what exists and what does not yet.
"""
