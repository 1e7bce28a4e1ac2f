# hloserve CPU worker: no NGC, no GPU. tritonserver 2.51 comes from the nvidia-pytriton wheel
# (the `serve` extra) and runs under `hloserve serve`, which composes its backend directory;
# so the node file says `docker.launcher: hloserve` (containers/node-cpu.yaml).
#   bash scripts/images.sh cpu      (docs/deployment.md, "Images"); by hand:
#   docker build --network=host -f containers/worker-cpu.Dockerfile -t hloserve-worker-cpu .
# BASE_IMAGE: hloserve-base:bookworm (`scripts/images.sh base`: Debian's packages, no registry)
# or python:3.11-slim-bookworm from a registry. Either way Python 3.11 with a shared libpython
# (the wheel's Python backend stub links it) and the project in the venv /opt/hloserve.
# Classic builder syntax only (no BuildKit here); build with --network=host.
ARG BASE_IMAGE=hloserve-base:bookworm

# --- build stage: the venv; the host's pip configuration (containers/pip/) stays here ---
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

# --- the image ---
FROM ${BASE_IMAGE}
# UID 10001 owns the executable cache (a named volume mounted there starts as this directory);
# the repository mount only needs to be readable by it.
RUN groupadd --system --gid 10001 hloserve \
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/hloserve \
        --shell /usr/sbin/nologin hloserve \
 && install -d -o hloserve -g hloserve -m 0700 /var/cache/hloserve/executables
COPY --from=build /opt/hloserve /opt/hloserve
COPY containers/healthcheck.py /opt/hloserve/healthcheck.py
ENV PATH=/opt/hloserve/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    JAX_PLATFORMS=cpu \
    HLOSERVE_EXECUTABLE_CACHE=/var/cache/hloserve/executables
USER hloserve
WORKDIR /home/hloserve
VOLUME ["/models"]
# Healthy only when the models are READY (containers/healthcheck.py): loading, failed or
# missing models keep it unhealthy while tritonserver itself already answers.
HEALTHCHECK --interval=5s --timeout=5s --start-period=600s --retries=3 \
    CMD ["/opt/hloserve/bin/python", "/opt/hloserve/healthcheck.py"]
CMD ["hloserve", "serve", "/models", "--host=0.0.0.0"]
