"""A bundle the runtime has loaded (:class:`LoadedBundle`), and what names its generations
and variants: :func:`generation` (which bundle at a path) and :func:`variant_label`.

docs/serving.md, "Front -> runtime (the channel)": a bundle is held per generation, so a
reloaded model's new bundle loads beside the old one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hloserve.bundle.bundle import Bundle
from hloserve.triton_backend.runtime.compile import CompiledExecutable


@dataclass(frozen=True)
class LoadedBundle:
    """A bundle ready to run.

    Attributes:
        name: the model name.
        key: the name its weights and scheduler queue go by: ``name``, or ``name#<n>`` for a
            generation loaded while an older one of the same name is still held.
        bundle: the checked bundle.
        executables: by ``(variant index, compiled batch size)``; variant 0 for a model
            without shape variants, batch size ``0`` for an unbatched model.
        load_seconds: wall time of checking, compiling and placing weights, in seconds.
    """

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
