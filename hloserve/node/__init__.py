"""Launching tritonserver processes: one local tritonserver per GPU, the gateway in front.

Modules:
    serve, serve_options: ``hloserve serve``: its settings, checks and node plan.
    node, node_config: ``hloserve node up|down`` and its typed node file.
    plan: the node plan both commands make (GPUs, workers, ports, environment, gateway).
    supervisor: the one supervisor: start, ready-wait, gateway, report, restarts, stop.
    process_runtime, docker_runtime, docker_spec: the workers as processes or containers.
    tritonserver, triton_options, triton_install, procfs: one local tritonserver.
    gateway_thread: the gateway on its own event loop in a thread of the node's process.
    watchdog: reload a model whose Python backend stub process died.
    watcher: ``serve --watch``: bundles added, changed or removed while the server runs.
    model_control_client: Triton's repository API on several workers.
    perf_analyzer: run Triton's ``perf_analyzer`` and read its CSV.
    status: ``hloserve status``: the weight cache and model tables.
"""
