"""Launching tritonserver processes: one local tritonserver per GPU, the gateway in front.

``serve`` and ``serve_options`` (``hloserve serve``), ``node`` and ``node_config`` (``hloserve
node up|down``) make a ``plan`` that the ``supervisor`` runs on ``process_runtime`` or
``docker_runtime`` (``docker_spec``); ``tritonserver``, ``triton_options``, ``triton_install``
and ``procfs`` run one local server; ``watchdog`` reloads a model whose stub died; ``watcher``
is ``serve --watch``; ``gateway_thread``, ``model_control_client``, ``perf_analyzer`` and
``status`` do what they are named for.
"""
