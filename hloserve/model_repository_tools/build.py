"""Write a repository plan atomically: old repository or new, never a mix, for a polling
tritonserver (:func:`write_repository`, :func:`build_repository`).
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hloserve import names
from hloserve.bundle.bundle import load_bundle
from hloserve.bundle.front_spec import front_spec
from hloserve.bundle.manifest import MANIFEST_FILE
from hloserve.bundle.validate import check_bundle
from hloserve.errors import RepositoryError, Status
from hloserve.model_repository_tools.config import label_file
from hloserve.model_repository_tools.foreign import CONFIG_FILE, write_foreign
from hloserve.model_repository_tools.repository_plan import (
    BuildOptions,
    Progress,
    RepositoryPlan,
    plan_repository,
    report,
)

#: Each front's ``1/model.py`` (:data:`~hloserve.names.FRONT_SHIM`): the front as a ``python``
#: model, for a load whose config override names no backend.
FRONT_SHIM_TEXT = '''"""Written by `hloserve repo build`: this front as a `python` model, for
a load whose config override names no backend (Triton infers `python` from this file). The
ordinary load (backend "hloserve_front") does not read it."""

from hloserve.triton_backend.backends.hloserve_front.model import OverriddenFront


class TritonPythonModel(OverriddenFront):
    model_file = __file__
'''


def write_repository(
    plan: RepositoryPlan,
    out_dir: Path | str,
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Write ``plan`` as a model repository at ``out_dir``, atomically; returns its absolute path.

    Built in ``<out_dir>.tmp-XXXX``, then renamed into place (an existing ``out_dir``, only with
    ``overwrite``, is swapped out by ``renameat2(RENAME_EXCHANGE)`` on Linux, then deleted).

    Raises:
        RepositoryError (FAILED_PRECONDITION): ``out_dir`` exists and ``overwrite`` is False,
            or is not a directory, or holds a bundle source, or is a non-empty directory that is
            not a repository hloserve built (no ``hloserve_runtime/config.pbtxt``).
        ArtifactError: an MLIR text executable does not convert (nothing is left behind).
    """
    out = Path(out_dir).absolute()
    sources = [m.source for m in plan.models] + [f.source for f in plan.foreign]
    _check_target(out, sources, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}.tmp-", dir=out.parent))
    try:
        _write_tree(plan, tmp, progress)
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def build_repository(
    bundles_dir: Path | str,
    out_dir: Path | str,
    options: BuildOptions | None = None,
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
    **fields: Any,
) -> RepositoryPlan:
    """:func:`plan_repository` then :func:`write_repository` (their errors); returns the plan."""
    out = Path(out_dir).absolute()
    # fail before validating when the answer is known
    _check_target(out, [Path(bundles_dir)], overwrite)
    plan = plan_repository(bundles_dir, options, progress=progress, **fields)
    write_repository(plan, out, overwrite=overwrite, progress=progress)
    return plan


def _check_target(out: Path, sources: Sequence[Path], overwrite: bool) -> None:
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise RepositoryError(
                f"{out} exists; to replace it, build with overwrite on "
                "(`hloserve repo build --overwrite`)",
                status=Status.FAILED_PRECONDITION,
            )
        if out.is_symlink() or not out.is_dir():
            raise RepositoryError(
                f"{out} exists and is not a directory; refusing to replace it",
                status=Status.FAILED_PRECONDITION,
            )
    for source in sources:
        resolved = source.resolve()
        if resolved == out.resolve() or out.resolve() in resolved.parents:
            raise RepositoryError(
                f"{out} holds the bundle {source}; write the repository somewhere else",
                status=Status.FAILED_PRECONDITION,
            )
    built = (out / names.RUNTIME_MODEL / "config.pbtxt").is_file()
    if out.is_dir() and any(out.iterdir()) and not built:
        raise RepositoryError(
            f"{out} exists and is not a repository hloserve built (no "
            f"{names.RUNTIME_MODEL}/config.pbtxt); refusing to replace it: choose a new path",
            status=Status.FAILED_PRECONDITION,
        )


def _write_tree(plan: RepositoryPlan, root: Path, progress: Progress | None) -> None:
    from hloserve.bundle.convert import convert_bundle

    for model in plan.models:
        model_dir = root / model.name
        bundle_copy = model_dir / names.BUNDLE_SUBDIR
        bundle_copy.parent.mkdir(parents=True)
        shutil.copytree(
            model.source, bundle_copy, ignore=shutil.ignore_patterns(".*", "__pycache__")
        )
        line = f"{model.name}: copied to {model.name}/{names.BUNDLE_SUBDIR}"
        if model.manifest_text is not None:
            (bundle_copy / MANIFEST_FILE).write_text(model.manifest_text)
            # every chosen size must specialize (the artifact's own shape assertions)
            check_bundle(bundle_copy, name=model.name)
        if model.text_executables:
            converted = convert_bundle(bundle_copy)
            check_bundle(bundle_copy, name=model.name)  # the copy must still match
            line += f"; converted {', '.join(converted)} to portable artifacts"
        manifest = load_bundle(bundle_copy, name=model.name).manifest
        for spec in manifest.wire_outputs:  # Triton reads labels from the model directory
            if spec.labels is not None:
                shutil.copyfile(bundle_copy / spec.labels, model_dir / label_file(spec))
        if not manifest.is_meta:  # what the front reads instead of the manifest (its memory)
            (model_dir / names.FRONT_SPEC).write_text(front_spec(manifest).to_json())
            (model_dir / names.FRONT_SHIM).write_text(FRONT_SHIM_TEXT)
        (model_dir / CONFIG_FILE).write_text(model.config_text)
        report(progress, line)
    for foreign in plan.foreign:
        write_foreign(foreign, root / foreign.name)
        report(progress, f"{foreign.name}: copied ({foreign.backend})")
    runtime_dir = root / names.RUNTIME_MODEL
    (runtime_dir / names.MODEL_VERSION).mkdir(parents=True)
    (runtime_dir / CONFIG_FILE).write_text(plan.runtime_config_text)


def _move_into_place(new: Path, out: Path) -> None:
    """Put ``new`` at ``out``; an existing ``out`` ends up deleted."""
    if not out.exists():
        os.rename(new, out)
        return
    if _exchange(new, out):
        shutil.rmtree(new)  # now the old repository
        return
    old = out.with_name(f"{out.name}.old-{secrets.token_hex(4)}")
    os.rename(out, old)
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # linux/fs.h


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths with Linux ``renameat2(RENAME_EXCHANGE)`` (glibc >= 2.28); False when
    the platform or file system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    renameat2.restype = ctypes.c_int
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))
