"""tritonserver in the ``nvidia-pytriton==0.7.0`` wheel (tritonserver 2.51, its libraries,
the Python backend, one stub per Python version) and the backend directory a server runs with.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hloserve.errors import InvalidArgumentError, TritonServerError

#: Name of Triton's Python backend directory inside ``--backend-directory``.
PYTHON_BACKEND = "python"
#: File name of the Python backend's stub executable.
STUB = "triton_python_backend_stub"


@dataclass(frozen=True)
class TritonInstall:
    """Where the tritonserver binary, its libraries and the Python backend live:
    ``library_dirs`` (``LD_LIBRARY_PATH``) the wheel's libraries, then the interpreter's
    ``LIBDIR`` (the ``libpython3.X.so`` the stub links); ``python_bin_dir`` goes first on
    ``PATH``: the isolated stub interpreter computes ``sys.prefix`` from the first ``python3``
    there, so it sees the venv."""

    server_binary: Path
    library_dirs: tuple[Path, ...]
    python_backend_files: Mapping[str, Path]
    cache_dir: Path
    python_bin_dir: Path

    @classmethod
    def from_pytriton_wheel(cls) -> TritonInstall:
        """Locate (not import) tritonserver in the nvidia-pytriton wheel, for this Python; raises
        TritonServerError: the wheel is not installed, or a file is missing from it."""
        spec = importlib.util.find_spec("pytriton")
        if spec is None or spec.origin is None:
            raise TritonServerError(
                "tritonserver: the nvidia-pytriton wheel is not installed in "
                f"{sys.prefix} (pip install 'hloserve[serve]')"
            )
        package = Path(spec.origin).parent
        dist = package / "tritonserver"
        wheel_libs = package.parent / "nvidia_pytriton.libs"
        if not wheel_libs.is_dir():  # editable pytriton checkout
            wheel_libs = dist / "external_libs"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        backend = dist / "backends" / PYTHON_BACKEND
        files = {
            "libtriton_python.so": backend / "libtriton_python.so",
            "triton_python_backend_utils.py": backend / "triton_python_backend_utils.py",
            STUB: dist / "python_backend_stubs" / version / STUB,
        }
        libdir = sysconfig.get_config_var("LIBDIR")
        install = cls(
            server_binary=dist / "bin" / "tritonserver",
            library_dirs=(wheel_libs, *([Path(libdir)] if libdir else [])),
            python_backend_files=files,
            cache_dir=dist / "caches",
            python_bin_dir=Path(sys.executable).parent,
        )
        required = (
            install.server_binary,
            wheel_libs,
            *files.values(),
            install.python_bin_dir / "python3",
        )
        missing = [p for p in required if not p.exists()]
        if missing:
            raise TritonServerError(
                f"tritonserver: the nvidia-pytriton wheel in {package.parent} lacks "
                f"{', '.join(map(str, missing))} (Python {version})"
            )
        return install


def check_backends(repository: Path, available: set[str]) -> None:
    """Refuse a repository with a model whose backend this tritonserver lacks (hloserve's own are
    composed by the launcher; others need the NGC image, docs/deployment.md); raises
    InvalidArgumentError: naming each model, the backend it needs and the ones there are."""
    from hloserve.model_repository_tools.foreign import repository_backends

    missing = {
        backend: models
        for backend, models in repository_backends(repository).items()
        if backend not in available and not backend.startswith("hloserve_")
    }
    if missing:
        needs = "; ".join(f"{', '.join(ms)} need(s) backend {b!r}" for b, ms in missing.items())
        raise InvalidArgumentError(
            f"tritonserver: {needs}, which this tritonserver does not have (it has "
            f"{', '.join(sorted(available))}): serve these models with the NGC Triton image "
            "(containers/worker.Dockerfile, docs/deployment.md) or leave them out"
        )


def compose_backend_dir(
    run_dir: Path, install: TritonInstall, extra_backend_dirs: Mapping[str, Path]
) -> Path:
    """Build ``<run_dir>/backends``: ``python/`` and one symlink per extra backend; raises
    InvalidArgumentError: a backend name is reserved, or its directory has no model.py."""
    backends = run_dir / "backends"
    python = backends / PYTHON_BACKEND
    python.mkdir(parents=True, exist_ok=True)
    for name, target in install.python_backend_files.items():
        _link_or_copy(python / name, target)
    for name, directory in extra_backend_dirs.items():
        if name == PYTHON_BACKEND or not name or "/" in name or name.startswith("."):
            raise InvalidArgumentError(
                f"tritonserver: backend name {name!r} is reserved or not a directory name"
            )
        if not (directory / "model.py").is_file():
            raise InvalidArgumentError(
                f"tritonserver: backend {name!r}: {directory} has no model.py"
            )
        _link_or_copy(backends / name, directory.resolve(), symbolic=True)
    return backends


def _link_or_copy(dst: Path, src: Path, *, symbolic: bool = False) -> None:
    """Link ``src`` at ``dst``: a symlink when ``symbolic``, else a hard link or a copy
    (Triton refuses a symlinked backend library that "escapes backend directory")."""
    if dst.is_symlink() or dst.exists():
        dst.unlink()
    if symbolic:
        dst.symlink_to(src)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
