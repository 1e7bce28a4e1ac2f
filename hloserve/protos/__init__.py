"""Protocol buffers of hloserve's own gRPC services (generated code, do not edit by hand).

``gateway_control.proto`` defines ``hloserve.gateway.v1.GatewayControl``, the gateway's control
plane (docs/gateway.md). Regenerate with ``bash scripts/gen_protos.sh``; ``scripts/test.sh``
fails when the committed code drifts from the ``.proto``.
"""
