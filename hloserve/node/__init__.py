"""Launching tritonserver processes: one local tritonserver per GPU, the gateway in front.

Modules:
    tritonserver: run one local tritonserver from the nvidia-pytriton wheel, without Docker.
    serve: ``hloserve serve``: build a repository if needed, run tritonserver, stop cleanly.
    fleet: ``hloserve serve --workers N``: several local tritonservers behind one gateway.
    watchdog: reload a model whose Python backend stub process died.
    perf_analyzer: run Triton's ``perf_analyzer`` and read its CSV.
    status: ``hloserve status``: the weight cache state read from a server's metrics endpoint.
    node_config: the typed node file of ``hloserve node up|down`` (YAML + HLOSERVE_NODE_*).
    node: ``hloserve node up|down``: worker plan, process runtime, the gateway in front.
    docker_runtime: the docker runtime: one tritonserver container per GPU (docker SDK).
    cli_node: the ``node`` subcommands.
"""
