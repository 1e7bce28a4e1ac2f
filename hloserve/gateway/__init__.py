"""KServe V2 gateway over several tritonservers (one per GPU); docs/gateway.md.

Transport-neutral core (no gRPC, no process): config, routing, placement, packing,
preconditions, health, aggregate, fleet_ops (the fleet-wide calls' rules), wire, dataplane
(the HAProxy layout and configuration).

Data plane and transport: haproxy (the process, the only data plane for unary inference),
proxy (the ``grpc.aio`` servicer behind it), streams, fanout (fleet RPCs over gRPC),
fleet_http (the same over KServe HTTP), model_control, upstreams, discovery, control and ctl
(the control plane and its client), auth, interceptor, admin, app (:func:`run_gateway
<hloserve.gateway.app.run_gateway>`).
"""
