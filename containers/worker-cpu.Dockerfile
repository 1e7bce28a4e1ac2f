# hloserve CPU worker for development: no NGC access, no GPU.
#   docker build -f containers/worker-cpu.Dockerfile -t hloserve-worker-cpu .
# tritonserver 2.51 comes from the nvidia-pytriton wheel (the `serve` extra) and runs under
# `hloserve serve`, which composes its backend directory; so the node file says
# `docker.launcher: hloserve` (docs/deployment.md, containers/node-cpu.yaml).
# python:3.11-slim: the serving environment's Python (the wheel carries a Python backend stub
# per Python version; the official image's libpython is shared, which the stub links).
FROM python:3.11-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 JAX_PLATFORMS=cpu
WORKDIR /src/hloserve
COPY pyproject.toml README.md ./
COPY hloserve ./hloserve
# serve: numpy<2, jax==0.7.1, nvidia-pytriton==0.7.0, tritonclient (pyproject.toml).
RUN pip install ".[serve]"

VOLUME ["/models"]
# Compiled executables (docs/serving.md, "Executable cache"): mount a volume here so restarts
# load them instead of compiling. Not a VOLUME: an anonymous volume per container would
# outlive it.
ENV HLOSERVE_EXECUTABLE_CACHE=/var/cache/hloserve/executables
RUN mkdir -p -m 0700 /var/cache/hloserve/executables
CMD ["hloserve", "serve", "/models", "--host=0.0.0.0"]
