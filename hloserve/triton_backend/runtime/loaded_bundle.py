"""A bundle the runtime has loaded, what tells its generations apart, and variant labels."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hloserve.bundle.bundle import Bundle
from hloserve.triton_backend.runtime.compile import CompiledExecutable


@dataclass(frozen=True)
class LoadedBundle:
    """A bundle ready to run: ``key`` is ``name``, or ``name#<n>`` for a generation loaded while
    an older one is held; ``executables`` by (variant index, compiled batch size, 0 unbatched)."""

    name: str
    key: str
    bundle: Bundle
    executables: Mapping[tuple[int, int], CompiledExecutable]
    load_seconds: float


def generation(path: Path) -> tuple[Any, ...]:
    """What tells two bundles at ``path`` apart: the directory and its manifest file's identity
    (device, inode, size, modification time in ns); a rebuilt repository changes it."""
    path = Path(path)
    try:
        st = (path / "manifest.yaml").stat()
    except OSError:
        return (str(path),)
    return (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def variant_label(dims: Mapping[str, int]) -> str:
    """A variant's label: its axis letters and sizes, e.g. ``"s32"``; ``""`` for no variant."""
    return "".join(f"{letter}{size}" for letter, size in sorted(dims.items()))
