"""Launching tritonserver processes: one local tritonserver per GPU, the gateway in front.

Modules:
    tritonserver: run one local tritonserver from the nvidia-pytriton wheel, without Docker.
    triton_options: how to run one tritonserver (options, endpoints, the flag builder).
    triton_install: tritonserver in the nvidia-pytriton wheel; the backend directory.
    ports: free TCP ports and the check that ports are free.
    procfs: a process session's members, kill and listening ports from ``/proc``.
    serve: ``hloserve serve``: build a repository if needed, run tritonserver, stop cleanly.
    serve_options: ``hloserve serve``'s settings, their checks, and its tritonserver options.
    serve_fleet: ``hloserve serve --workers N``: the fleet started, reported and supervised.
    plan: the node's plan, once for every runtime: workers, ports, flags, env, gateway settings.
    process_runtime: the workers as local tritonservers (start-up wait, stub watchdog,
        restarts with backoff); ``node up`` with ``runtime: process`` and ``serve --workers``.
    docker_runtime: the docker runtime: one tritonserver container per GPU (docker SDK).
    docker_spec: the containers the docker runtime asks for, as plain values (pure).
    gateway_thread: the gateway on its own event loop in a thread of the node's process.
    fleet: ``hloserve serve --workers N``: process workers behind one gateway, supervised.
    node: ``hloserve node up|down``: the plan run with the configured runtime.
    node_config: the typed node file of ``hloserve node up|down`` (YAML + HLOSERVE_NODE_*).
    watchdog: reload a model whose Python backend stub process died.
    model_control: the key that restricts Triton's repository API to the launcher, and the
        repository index read with it.
    perf_analyzer: run Triton's ``perf_analyzer`` and read its CSV.
    status: ``hloserve status``: the weight cache state read from a server's metrics endpoint.
    cli_node: the ``node`` subcommands.
"""
