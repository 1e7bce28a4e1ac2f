# hloserve GPU worker without NGC: the CPU worker's recipe plus JAX's CUDA 12 plugin.
#   bash scripts/images.sh gpu      (docs/deployment.md, "Images"); by hand:
#   docker build --network=host -f containers/worker-gpu.Dockerfile -t hloserve-worker-gpu .
# tritonserver 2.51 comes from the nvidia-pytriton wheel (a GPU build: it bundles libcudart) and
# runs under `hloserve serve` (`docker.launcher: hloserve`); jax[cuda12]==0.7.1 brings cuBLAS,
# cuDNN, NCCL and the rest of CUDA 12 as pip wheels, so the image needs no CUDA toolkit, only
# the host's driver (NVIDIA Container Toolkit: `--gpus`, compose's device reservation).
# Without a GPU JAX falls back to the CPU (JAX_PLATFORMS is left unset). The NGC variant
# (worker.Dockerfile: tritonserver 2.53 of Triton 24.12) stays an option.
# BASE_IMAGE and the build as in worker-cpu.Dockerfile.
ARG BASE_IMAGE=hloserve-base:bookworm

FROM ${BASE_IMAGE} AS build
COPY containers/pip/ /etc/hloserve-pip/
ENV PIP_CONFIG_FILE=/etc/hloserve-pip/pip.conf PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3.11 -m venv /opt/hloserve
WORKDIR /src/hloserve
COPY pyproject.toml README.md ./
COPY containers/requirements.py containers/constraints.txt containers/
RUN python3.11 containers/requirements.py serve >/tmp/requirements.txt \
 && echo "jax[cuda12]==0.7.1" >>/tmp/requirements.txt \
 && /opt/hloserve/bin/pip install -r /tmp/requirements.txt -c containers/constraints.txt
COPY hloserve ./hloserve
RUN /opt/hloserve/bin/pip install --no-deps . && /opt/hloserve/bin/pip check

FROM ${BASE_IMAGE}
RUN groupadd --system --gid 10001 hloserve \
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/hloserve \
        --shell /usr/sbin/nologin hloserve \
 && install -d -o hloserve -g hloserve -m 0700 /var/cache/hloserve/executables
COPY --from=build /opt/hloserve /opt/hloserve
COPY containers/healthcheck.py /opt/hloserve/healthcheck.py
ENV PATH=/opt/hloserve/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HLOSERVE_EXECUTABLE_CACHE=/var/cache/hloserve/executables \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER hloserve
WORKDIR /home/hloserve
VOLUME ["/models"]
HEALTHCHECK --interval=5s --timeout=5s --start-period=600s --retries=3 \
    CMD ["/opt/hloserve/bin/python", "/opt/hloserve/healthcheck.py"]
CMD ["hloserve", "serve", "/models", "--host=0.0.0.0"]
