# hloserve gateway: one KServe V2 gRPC endpoint over the workers of a node (docs/gateway.md):
# HAProxy (Debian bookworm's haproxy 2.6.12) carries ModelInfer, the Python control plane the rest.
#   docker build -f containers/gateway.Dockerfile -t hloserve-gateway .
# Settings come from /etc/hloserve/gateway.yaml (mount one) and HLOSERVE_GATEWAY_* variables;
# with host networking it reaches the workers on 127.0.0.1 (containers/compose.yaml).
# `hloserve node up` does not need this image: it runs the gateway in its own process.
FROM python:3.11-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 JAX_PLATFORMS=cpu
RUN apt-get update && apt-get install -y --no-install-recommends haproxy \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src/hloserve
COPY pyproject.toml README.md ./
COPY hloserve ./hloserve
# The gateway needs hloserve, grpcio and tritonclient's KServe protos (no tritonserver).
RUN pip install ".[gateway]"

EXPOSE 8001 8002
ENTRYPOINT ["hloserve", "gateway"]
CMD []
