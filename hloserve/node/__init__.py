"""Launching tritonserver processes: one local tritonserver per GPU, the gateway in front.

Modules:
    tritonserver: run one local tritonserver from the nvidia-pytriton wheel, without Docker.
    triton_options: how to run one tritonserver (options, endpoints, the flag builder).
    triton_install: tritonserver in the nvidia-pytriton wheel; the backend directory.
    procfs: a process session's members, kill and listening ports from ``/proc``.
    serve: ``hloserve serve``: build a repository if needed, then run its node plan.
    serve_options: ``hloserve serve``'s settings, their checks, its node plan and each
        worker's tritonserver options (``node up``'s too).
    plan: the node plan (:class:`~hloserve.node.plan.NodePlan`) both commands make: GPU
        detection and assignment, workers, ports, environment, gateway settings.
    supervisor: the one supervisor of ``serve`` and ``node up``: start, ready-wait, gateway,
        report, restarts, stop.
    process_runtime: the workers as local tritonservers (start-up wait, runtime-first load,
        stub watchdog, restarts with backoff).
    docker_runtime: the docker runtime: one tritonserver container per GPU (docker SDK).
    docker_spec: the containers the docker runtime asks for, as plain values (pure).
    gateway_thread: the gateway on its own event loop in a thread of the node's process.
    node: ``hloserve node up|down``: the node file's plan run by the supervisor.
    node_config: the typed node file of ``hloserve node up|down`` (YAML + HLOSERVE_NODE_*).
    watchdog: reload a model whose Python backend stub process died.
    watcher: ``serve --watch``: bundles added, changed or removed while the server runs.
    model_control_client: Triton's repository API (index, load, reload, unload) with the
        launcher's key (:mod:`hloserve.model_control`).
    perf_analyzer: run Triton's ``perf_analyzer`` and read its CSV.
    status: ``hloserve status``: the weight cache table (:mod:`hloserve.prometheus_text`).
"""
