"""hloserve: serve StableHLO models on NVIDIA Triton Inference Server.

Subpackages: bundle (the bundle format, validation), export (JAX or torch -> bundle),
model_repository_tools (bundles -> Triton model repository), triton_backend (the Python-based
backends: channel, front, runtime, backends), meta (meta models' core), node (``hloserve serve``,
``node up|down``, ``status``), gateway (KServe V2 gRPC gateway over several tritonservers),
observability (scrape targets, supervisor metrics, Grafana dashboards), protos (generated).

Top-level modules: cli, cli_options, cli_serve (the command line); errors (error root and status
table); metric_names; jax_on_cpu; model_control (the repository API key); model_parameters (the
config.pbtxt parameters, typed); names (shared names and defaults); ports; prometheus_text;
settings (YAML plus environment); triton_messages (Triton texts recognised); units.

Layers, bottom first (``tests/test_import_graph.py`` enforces them: no upward import): the
modules above; bundle, observability; export, triton_backend.channel; triton_backend.front and
triton_backend.runtime (never importing each other); model_repository_tools; meta;
triton_backend.backends; gateway; node; the command line.
"""

__version__ = "0.1.0"
