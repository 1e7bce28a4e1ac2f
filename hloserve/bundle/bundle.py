"""A bundle on disk: a directory holding ``manifest.yaml``, executables and weights.

The directory name is the model name. Loading a bundle reads and checks only the manifest;
:mod:`hloserve.bundle.validate` checks the artifacts and weights against it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from hloserve.bundle.manifest import MANIFEST_FILE, Manifest, load_manifest
from hloserve.bundle.safetensors_file import WeightInfo, load_tensors, stored_tensors
from hloserve.bundle.stablehlo import specialize_batch, to_portable_artifact
from hloserve.errors import InvalidArgumentError, NotFoundError

#: Model names Triton accepts as repository directory names (and hloserve as bundle names).
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class Bundle:
    """A bundle whose manifest parsed and passed the format rules.

    Attributes:
        path: the bundle directory.
        manifest: the typed manifest.
        model_name: the model's name when it is not the directory's (a repository's bundle
            copy lives in ``<model>/1/bundle``); None = the directory's name.
    """

    path: Path
    manifest: Manifest
    model_name: str | None = None

    @property
    def name(self) -> str:
        """The model name: ``model_name`` when given, else the directory's name."""
        return self.model_name or self.path.name

    def executable_path(self, batch_size: int, variant: int = 0) -> Path:
        """Path of the executable compiled for ``batch_size`` (0 for an unbatched model).

        Args:
            batch_size: a compiled batch size.
            variant: index into ``variants.shapes`` (0 for a model without variants).

        Raises:
            NotFoundError: no executable for that size (and variant).
        """
        try:
            return self.path / self.manifest.all_executables[(variant, batch_size)]
        except KeyError:
            which = f" in variant {variant}" if self.manifest.variants else ""
            raise NotFoundError(
                f"model {self.name!r} has no executable for batch size {batch_size}{which}; "
                f"compiled (variant, batch size): {sorted(self.manifest.all_executables)}"
            ) from None

    def read_artifact(self, batch_size: int, variant: int = 0) -> bytes:
        """The portable artifact for ``batch_size`` (MLIR text is converted in memory).

        A symbolic-batch bundle's artifact is specialized to ``batch_size`` here
        (:func:`hloserve.bundle.stablehlo.specialize_batch`), so every caller compiles a module
        with static shapes, exactly as for a bundle with one artifact per batch size.

        Raises:
            NotFoundError: ``batch_size`` is not a compiled batch size (of that variant).
            ArtifactError: the artifact cannot be read or specialized.
        """
        data = to_portable_artifact(self.executable_path(batch_size, variant).read_bytes())
        if self.manifest.is_symbolic:
            return specialize_batch(data, batch_size)
        return data

    @property
    def weights_path(self) -> Path | None:
        """Path of the safetensors file, or None for a model without weights."""
        file = self.manifest.weights.file
        return self.path / file if file else None

    @cached_property
    def stored_weights(self) -> dict[str, WeightInfo]:
        """Every tensor in the safetensors file, by name, read from its header only.

        Raises:
            InvalidArgumentError: the file is missing, unreadable, or holds an unknown dtype.
        """
        if self.weights_path is None:
            return {}
        return stored_tensors(self.weights_path)

    @property
    def weight_nbytes(self) -> int:
        """Total bytes of the weights ``main`` takes (those named in ``weights.order``)."""
        return sum(self.stored_weights[n].nbytes for n in self.manifest.weights.order)

    def load_weights(self) -> list[np.ndarray]:
        """The weights as host NumPy arrays, in ``weights.order``.

        Raises:
            NotFoundError: a weight named in ``weights.order`` is not in the file.
        """
        if self.weights_path is None:
            return []
        return load_tensors(self.weights_path, self.manifest.weights.order)


def load_bundle(path: Path | str, *, name: str | None = None) -> Bundle:
    """Read a bundle directory's manifest and check its format rules.

    Args:
        path: the bundle directory.
        name: the model's name when it is not the directory's (a repository's bundle copy,
            ``<model>/1/bundle``); None = the directory's name.

    Raises:
        NotFoundError: the directory or its manifest.yaml does not exist.
        InvalidArgumentError: the model name is not a valid model name.
        ManifestError: the manifest breaks a rule (one line per problem).
    """
    path = Path(path)
    if not (path / MANIFEST_FILE).is_file():
        raise NotFoundError(f"{path}: not a bundle (no {MANIFEST_FILE})")
    if name is not None:
        if not _MODEL_NAME.match(name):
            raise InvalidArgumentError(
                f"{path}: model name {name!r} is not a valid model name "
                f"(must match {_MODEL_NAME.pattern})"
            )
    elif not _MODEL_NAME.match(path.resolve().name):
        raise InvalidArgumentError(
            f"{path}: bundle directory name {path.name!r} is not a valid model name "
            f"(must match {_MODEL_NAME.pattern})"
        )
    return Bundle(path, load_manifest(path / MANIFEST_FILE), name)


def discover_bundles(root: Path | str) -> list[Path]:
    """Immediate subdirectories of ``root`` that hold a ``manifest.yaml``, sorted by name."""
    root = Path(root)
    if not root.is_dir():
        raise NotFoundError(f"{root}: no such directory")
    return sorted(p for p in root.iterdir() if (p / MANIFEST_FILE).is_file())


__all__ = [
    "Bundle",
    "discover_bundles",
    "load_bundle",
]
