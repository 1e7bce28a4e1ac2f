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

import numpy as np

from hloserve.bundle import Bundle
from hloserve.errors import InvalidArgumentError
from hloserve.triton_backend.compile import CompiledExecutable
from hloserve.triton_backend.tensors import TensorChecker


@dataclass(frozen=True)
class LoadedBundle:
    """A bundle ready to run.

    Attributes:
        name: the model name (its runtime tensor prefix).
        key: the name its weights and scheduler queue go by: ``name``, or ``name#<n>`` for a
            generation loaded while an older one of the same name is still held.
        bundle: the checked bundle.
        executables: by ``(variant index, compiled batch size)``; variant 0 for a model
            without shape variants, batch size ``0`` for an unbatched model.
        load_seconds: wall time of checking, compiling and placing weights, in seconds.
        check_inputs: checks a request's inputs against the manifest.
    """

    name: str
    key: str
    bundle: Bundle
    executables: Mapping[tuple[int, int], CompiledExecutable]
    load_seconds: float
    check_inputs: TensorChecker

    def variant_of(self, tensors: Mapping[str, np.ndarray]) -> int:
        """Index of the variant whose sizes equal the inputs' variable axes (0 if none vary).

        Raises:
            InvalidArgumentError: no variant has exactly these sizes (the front pads requests
                up to a variant; the runtime does not).
        """
        manifest = self.bundle.manifest
        if manifest.variants is None:
            return 0
        sizes = {
            letter: int(tensors[spec.name].shape[axis])
            for spec in manifest.inputs
            for axis, letter in enumerate(spec.shape)
            if letter in spec.variable_axes
        }
        for i, dims in enumerate(manifest.variant_dims):
            if dims == sizes:
                return i
        raise InvalidArgumentError(
            f"model {self.name!r}: no executable for variable axis sizes {sizes}; "
            f"variants {manifest.variant_dims}"
        )


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
