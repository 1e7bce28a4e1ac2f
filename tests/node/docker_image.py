"""The images of the docker tests, built from containers/*.Dockerfile once per test session.

:func:`ensure_images` runs ``bash scripts/images.sh cpu gateway`` (the documented build:
the Debian base from ``debootstrap`` when missing, then ``docker build --network=host`` of
``worker-cpu.Dockerfile`` and ``gateway.Dockerfile``) the first time a test asks, and
remembers the answer for the rest of the process: the daemon's layer cache makes every later
session's build take seconds; a cold one (no base, no layers) takes minutes
(docs/deployment.md, "Images"). Nothing is pulled: no registry is needed.
"""

from __future__ import annotations

import functools
import os
import resource
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The worker image's user (containers/worker-cpu.Dockerfile).
IMAGE_UID = 10001
#: Bound of a cold build (debootstrap, then the serving environment from PyPI; about 10 min on
#: a shared 2-core machine), below the tests' own 900 s timeout, which the build counts against.
#: A slower host builds first: ``bash scripts/images.sh cpu gateway``.
BUILD_TIMEOUT_S = 840
#: This host's hard memlock limit: a nested or unprivileged daemon cannot raise it.
_HARD_MEMLOCK = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
MEMLOCK = -1 if _HARD_MEMLOCK == resource.RLIM_INFINITY else _HARD_MEMLOCK


@dataclass(frozen=True)
class Images:
    """Tags of the built images and what building them took."""

    worker_cpu: str
    gateway: str
    build_s: float
    log: str


@functools.cache
def ensure_images() -> Images:
    """Build (or find in the layer cache) the CPU worker and gateway images; once per process.

    Raises:
        RuntimeError: the build failed or ran past :data:`BUILD_TIMEOUT_S`; the message holds
            the end of its log.
    """
    log = Path(tempfile.gettempdir()) / f"hloserve-images-{os.getpid()}.log"
    start = time.monotonic()
    with log.open("wb") as out:
        try:
            done = subprocess.run(
                ["bash", str(ROOT / "scripts" / "images.sh"), "cpu", "gateway"],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=BUILD_TIMEOUT_S,
                check=False,
            )
            failed = done.returncode != 0
        except subprocess.TimeoutExpired:
            failed = True
    text = log.read_text(errors="replace")
    if failed:
        raise RuntimeError(
            f"scripts/images.sh cpu gateway failed or ran past {BUILD_TIMEOUT_S} s:\n{text[-4000:]}"
        )
    return Images(
        "hloserve-worker-cpu:latest", "hloserve-gateway:latest", time.monotonic() - start, text
    )


#: Image of the ``docker.launcher: tritonserver`` tests, built from the CPU worker image.
TRITONSERVER_LAUNCHER_IMAGE = "hloserve-worker-cpu-tritonserver:test"
#: Its Dockerfile (classic builder): the CPU image with what the ``tritonserver`` launcher
#: expects of an NGC-based one (containers/worker.Dockerfile): ``tritonserver`` on ``PATH`` (a
#: wrapper setting the wheel's libraries, venv Python and cache directory) and hloserve's
#: backends beside the Python backend in ``/opt/tritonserver/backends``.
_LAUNCHER_DOCKERFILE = """FROM hloserve-worker-cpu:latest
USER root
COPY compose.py /tmp/compose.py
RUN /opt/hloserve/bin/python /tmp/compose.py && rm /tmp/compose.py
USER hloserve
"""
_LAUNCHER_COMPOSE = """import shutil
from pathlib import Path
from hloserve.node.triton_install import TritonInstall
from hloserve.triton_backend.backends import backend_dirs
install = TritonInstall.from_pytriton_wheel()
backends = Path("/opt/tritonserver/backends")
(backends / "python").mkdir(parents=True)
for name, target in install.python_backend_files.items():
    shutil.copy2(target, backends / "python" / name)
for name, directory in backend_dirs().items():
    shutil.copytree(directory, backends / name)
lib = ":".join(str(p) for p in install.library_dirs)
wrapper = Path("/usr/local/bin/tritonserver")
wrapper.write_text(
    "#!/bin/sh\\n"
    f"export LD_LIBRARY_PATH={lib}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\\n"
    f"export PATH={install.python_bin_dir}:$PATH\\n"
    f'exec {install.server_binary} --cache-directory={install.cache_dir} "$@"\\n'
)
wrapper.chmod(0o755)
"""


@functools.cache
def ensure_tritonserver_launcher_image() -> str:
    """Build :data:`TRITONSERVER_LAUNCHER_IMAGE` on :func:`ensure_images`' CPU worker image;
    its tag.

    Raises:
        RuntimeError: the build failed (the end of its output).
    """
    ensure_images()
    with tempfile.TemporaryDirectory(prefix="hloserve-launcher-image-") as context:
        (Path(context) / "Dockerfile").write_text(_LAUNCHER_DOCKERFILE)
        (Path(context) / "compose.py").write_text(_LAUNCHER_COMPOSE)
        done = subprocess.run(
            ["docker", "build", "-q", "-t", TRITONSERVER_LAUNCHER_IMAGE, context],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"building {TRITONSERVER_LAUNCHER_IMAGE} failed:\n{done.stderr[-4000:]}")
    return TRITONSERVER_LAUNCHER_IMAGE
