# hloserve GPU worker: NVIDIA's Triton container plus hloserve and its Python-based backends.
#   docker build --network=host -f containers/worker.Dockerfile -t hloserve-worker:24.12 .
# Run by `hloserve node up` (runtime: docker, docker.launcher: tritonserver), one container per
# GPU, or by containers/compose.yaml. docs/deployment.md.
#
# Why 24.12 (tritonserver 2.53, CUDA 12.6.3, Ubuntu 24.04):
#  - it is the first NGC Triton image with Python 3.12 (24.10 and older ship Python 3.10;
#    hloserve needs >= 3.11). Triton's Python backend stub is built for the image's own
#    python3, so hloserve and JAX are installed into that interpreter, not a venv;
#  - numpy < 2 and jax == jaxlib == 0.7.1 (the last JAX for numpy 1): the combination this
#    project serves with and tests (docs/notes_tritonserver.md, "Tensors in the stub": with
#    numpy >= 2 the 2.5x Python backend stub's
#    as_numpy()/Tensor(ndarray) silently return wrong data; numeric tensors go by DLPack, but
#    the stub's helpers still touch numpy). Moving to numpy 2 needs that re-checked first;
#  - jax[cuda12] brings its CUDA 12 libraries (cuBLAS, cuDNN, NCCL) from pip, so they do not
#    depend on the image's CUDA toolkit, only on the driver (>= 560, or a data-center branch
#    NVIDIA's 24.12 release notes list).
# Bump TRITON_TAG and the pins together, then run the GPU checks in docs/deployment.md.
ARG TRITON_TAG=24.12-py3
FROM nvcr.io/nvidia/tritonserver:${TRITON_TAG}

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Ubuntu 24.04 marks the system Python externally managed; this image is the app's own.
RUN python3 -m pip install --break-system-packages \
        "numpy<2" "jax[cuda12]==0.7.1" "jaxlib==0.7.1"

WORKDIR /src/hloserve
COPY pyproject.toml README.md ./
COPY hloserve ./hloserve
# Then copy every Python-based backend beside Triton's own (python/, onnxruntime/, ...), where
# --backend-directory=/opt/tritonserver/backends finds `backend: "hloserve_*"`.
RUN python3 -m pip install --break-system-packages . "numpy<2" "jax==0.7.1" \
 && python3 -c "import shutil; from hloserve.triton_backend.backends import backend_dirs; \
[shutil.copytree(p, '/opt/tritonserver/backends/' + n, dirs_exist_ok=True) \
 for n, p in backend_dirs().items()]" \
 && ls /opt/tritonserver/backends

# The node mounts the model repository read-only here.
VOLUME ["/models"]
# Compiled executables (docs/serving.md, "Executable cache"): mount a volume here so restarts
# load them instead of compiling (containers/compose.yaml does). Not a VOLUME: an anonymous
# volume per container would outlive it.
ENV HLOSERVE_EXECUTABLE_CACHE=/var/cache/hloserve/executables
RUN mkdir -p -m 0700 /var/cache/hloserve/executables
# Triton's defaults; `hloserve node up` passes the planned ports on its command line.
CMD ["tritonserver", "--model-repository=/models", "--exit-on-error=false", \
     "--strict-readiness=false"]
