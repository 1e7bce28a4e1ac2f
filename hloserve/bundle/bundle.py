"""A bundle on disk, named after its model; loading checks only the manifest (see validate)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from hloserve.bundle.manifest import MANIFEST_FILE, Manifest, load_manifest
from hloserve.bundle.manifest_sections import MODEL_NAME
from hloserve.bundle.safetensors_file import WeightInfo, load_tensors, stored_tensors
from hloserve.bundle.stablehlo import specialize_batch, to_portable_artifact
from hloserve.errors import InvalidArgumentError, NotFoundError


@dataclass(frozen=True)
class Bundle:
    """A bundle whose manifest passed the format rules; ``model_name`` None: the directory's."""

    path: Path
    manifest: Manifest
    model_name: str | None = None

    @property
    def name(self) -> str:
        """The model name: ``model_name`` when given, else the directory's name."""
        return self.model_name or self.path.name

    def executable_path(self, batch_size: int, variant: int = 0) -> Path:
        """Path of the executable for ``batch_size`` (0 unbatched) and ``variant`` index; raises
        NotFoundError: no executable for that size (and variant)."""
        try:
            return self.path / self.manifest.all_executables[(variant, batch_size)]
        except KeyError:
            which = f" in variant {variant}" if self.manifest.variants else ""
            raise NotFoundError(
                f"model {self.name!r} has no executable for batch size {batch_size}{which}; "
                f"compiled (variant, batch size): {sorted(self.manifest.all_executables)}"
            ) from None

    def read_artifact(self, batch_size: int, variant: int = 0) -> bytes:
        """The portable artifact for ``batch_size``, with static shapes (text converted, a symbolic
        batch specialized); raises NotFoundError: ``batch_size`` is not a compiled batch size (of
        that variant); ArtifactError: the artifact cannot be read or specialized."""
        data = to_portable_artifact(self.executable_path(batch_size, variant).read_bytes())
        return specialize_batch(data, batch_size) if self.manifest.is_symbolic else data

    @property
    def weights_path(self) -> Path | None:
        """Path of the safetensors file, or None for a model without weights."""
        file = self.manifest.weights.file
        return self.path / file if file else None

    @cached_property
    def stored_weights(self) -> dict[str, WeightInfo]:
        """Every tensor in the safetensors file, by name, from its header; raises
        InvalidArgumentError: the file is missing, unreadable, or holds an unknown dtype."""
        return {} if self.weights_path is None else stored_tensors(self.weights_path)

    @property
    def weight_nbytes(self) -> int:
        """Total bytes of the weights in ``weights.order``."""
        return sum(self.stored_weights[n].nbytes for n in self.manifest.weights.order)

    def load_weights(self) -> list[np.ndarray]:
        """The weights as host NumPy arrays, in ``weights.order``; raises NotFoundError: a weight
        named in ``weights.order`` is not in the file."""
        if self.weights_path is None:
            return []
        return load_tensors(self.weights_path, self.manifest.weights.order)


def load_bundle(path: Path | str, *, name: str | None = None) -> Bundle:
    """Read a bundle directory's manifest and check its format rules (``name``: see Bundle); raises
    NotFoundError: the directory or its manifest.yaml does not exist; InvalidArgumentError: the
    model name is not a valid model name; ManifestError: the manifest breaks a rule (one line per
    problem)."""
    path = Path(path)
    if not (path / MANIFEST_FILE).is_file():
        raise NotFoundError(f"{path}: not a bundle (no {MANIFEST_FILE})")
    if name is None:
        what, shown, name_checked = "bundle directory name", path.name, path.resolve().name
    else:
        what, shown, name_checked = "model name", name, name
    if not MODEL_NAME.match(name_checked):
        raise InvalidArgumentError(
            f"{path}: {what} {shown!r} is not a valid model name (must match {MODEL_NAME.pattern})"
        )
    return Bundle(path, load_manifest(path / MANIFEST_FILE), name)


def discover_bundles(root: Path | str) -> list[Path]:
    """Immediate subdirectories of ``root`` that hold a ``manifest.yaml``, sorted by name."""
    root = Path(root)
    if not root.is_dir():
        raise NotFoundError(f"{root}: no such directory")
    return sorted(p for p in root.iterdir() if (p / MANIFEST_FILE).is_file())
