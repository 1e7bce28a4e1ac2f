"""Launching tritonserver processes: one local tritonserver per GPU (and, later, the gateway).

Modules:
    tritonserver: run one local tritonserver from the nvidia-pytriton wheel, without Docker.
    status: ``hloserve status``: the weight cache state read from a server's metrics endpoint.
"""
