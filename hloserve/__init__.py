"""hloserve: serve StableHLO models on NVIDIA Triton Inference Server.

Subpackages:
    bundle: the bundle format (manifest, portable artifacts, weights), validation, dtype table.
    export: JAX function + params (or a torch module) -> bundle.
    model_repository_tools: bundles -> Triton model repository (``config.pbtxt``), validation.
    triton_backend: the typed core behind the Triton Python-based backends, a folder per
        process side: channel, front (no JAX), runtime (JAX), backends (the pb_utils shims).
    meta: meta models' core (``run(inputs, call)``, the per-worker gate, the deadline).
    node: running tritonservers: ``hloserve serve``, ``hloserve node up|down``, ``status``.
    gateway: the KServe V2 gRPC gateway over several tritonservers.
    observability: Prometheus scrape targets, the supervisor's metrics, Grafana dashboards.
    protos: generated protobuf code of the gateway's own services (scripts/gen_protos.sh).

Modules:
    cli: the ``hloserve`` command line.
    cli_options: option groups shared by ``repo build``, ``serve`` and ``gateway``.
    cli_serve: the ``serve`` subcommand's flags.
    errors: the one error root and its gRPC / HTTP status table.
    metric_names: the names of the runtime's metrics, shared by their writer and readers.
    jax_on_cpu: imported first by the front and meta shims: their JAX runs on the CPU.
    model_control: the key restricting Triton's repository API to hloserve's own clients.
    model_parameters: the config.pbtxt parameters, typed and declared once for their writer
        and readers; ``ModelArgs``, what Triton hands a Python model's ``initialize``.
    names: the names every layer shares (config.pbtxt and request parameters, defaults).
    ports: free TCP ports and the check that a server's ports are free.
    prometheus_text: Prometheus text fetched and parsed; the weight cache state read from it.
    settings: typed settings from YAML plus environment overrides (gateway and node files).
    triton_messages: the Triton error texts hloserve recognises, in one place.
    units: the one byte-count formatter.

Layers, bottom first (``tests/test_import_graph.py`` enforces them: no upward import): the
modules above; bundle, observability; export, triton_backend.channel; triton_backend.front and
triton_backend.runtime (never importing each other); model_repository_tools; meta;
triton_backend.backends; gateway; node; the command line.
"""

__version__ = "0.1.0"
