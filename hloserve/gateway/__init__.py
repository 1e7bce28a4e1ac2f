"""KServe V2 gRPC gateway over several tritonservers (one per GPU).

Modules:
    config: typed settings (:class:`~hloserve.gateway.config.GatewayConfig`), YAML + env.
    routing: transport-neutral routing table, schedulers and ``lpt_packing`` placement.

See docs/gateway.md for what exists and what does not yet.
"""
