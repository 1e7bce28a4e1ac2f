# hloserve gateway: one KServe V2 endpoint (gRPC 8001, HTTP 8000 with http_listen; admin 8002)
# over the workers of a node (docs/gateway.md):
# HAProxy (Debian bookworm's haproxy 2.6.12) carries ModelInfer, the Python control plane the rest.
#   bash scripts/images.sh gateway  (docs/deployment.md, "Images"); by hand:
#   docker build --network=host -f containers/gateway.Dockerfile -t hloserve-gateway .
# Settings come from /etc/hloserve/gateway.yaml (mount one) and HLOSERVE_GATEWAY_* variables;
# with host networking it reaches the workers on 127.0.0.1 (containers/compose.yaml).
# BASE_IMAGE as in worker-cpu.Dockerfile; classic builder syntax, build with --network=host.
ARG BASE_IMAGE=hloserve-base:bookworm

# The build stage is worker-cpu.Dockerfile's, line for line: the daemon's layer cache builds the
# venv once for both images (the gateway needs only hloserve, grpcio and tritonclient's protos,
# but a second install of the shared dependencies would cost more than the bytes it saves).
FROM ${BASE_IMAGE} AS build
COPY containers/pip/ /etc/hloserve-pip/
ENV PIP_CONFIG_FILE=/etc/hloserve-pip/pip.conf PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3.11 -m venv /opt/hloserve
WORKDIR /src/hloserve
# The dependencies first, from pyproject.toml alone (their layer survives edits to the source
# and README), then hloserve without them.
# serve pins numpy<2, jax==jaxlib==0.7.1, nvidia-pytriton==0.7.0, tritonclient 2.51 (pyproject);
# containers/constraints.txt pins every other package to the versions built and tested.
COPY pyproject.toml ./
COPY containers/requirements.py containers/constraints.txt containers/
RUN python3.11 containers/requirements.py serve >/tmp/requirements.txt \
 && /opt/hloserve/bin/pip install -r /tmp/requirements.txt -c containers/constraints.txt
COPY README.md ./
COPY hloserve ./hloserve
RUN /opt/hloserve/bin/pip install --no-deps . && /opt/hloserve/bin/pip check

FROM ${BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends "haproxy=2.6.12-*" \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 hloserve \
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/hloserve \
        --shell /usr/sbin/nologin hloserve
COPY --from=build /opt/hloserve /opt/hloserve
ENV PATH=/opt/hloserve/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    JAX_PLATFORMS=cpu
USER hloserve
WORKDIR /home/hloserve
EXPOSE 8000 8001 8002
ENTRYPOINT ["hloserve", "gateway"]
CMD []
