"""KServe V2 gateway over several tritonservers (one per GPU); module map: docs/gateway.md,
"What exists". HAProxy is the data plane, a Python ``grpc.aio`` servicer the control plane.
"""
