"""Rewrite a bundle's MLIR text executables as StableHLO portable artifacts, in place."""

from __future__ import annotations

import os
from pathlib import Path

from hloserve.bundle.bundle import Bundle, load_bundle
from hloserve.bundle.manifest import MANIFEST_FILE
from hloserve.bundle.stablehlo import is_portable_artifact, to_portable_artifact


def convert_bundle(path: Path | str, target_version: str | None = None) -> list[str]:
    """Convert every text executable of a bundle to a portable artifact.

    Each ``X.mlir`` becomes ``X.mlirbc``; the manifest is rewritten atomically (temp file +
    rename) after the new artifacts exist, then the text files are removed.

    Args:
        path: the bundle directory.
        target_version: StableHLO target version (default: the widest-compatibility one).

    Returns:
        The executable file names that were converted (empty if all were artifacts already).

    Raises:
        ManifestError: the manifest is invalid.
        ArtifactError: a text executable does not parse.
    """
    bundle: Bundle = load_bundle(path)
    manifest = bundle.manifest
    files = dict(manifest.all_executables)
    converted = []
    for key, file in sorted(files.items()):
        data = (bundle.path / file).read_bytes()
        if is_portable_artifact(data):
            continue
        new_file = str(Path(file).with_suffix(".mlirbc"))
        (bundle.path / new_file).write_bytes(to_portable_artifact(data, target_version))
        files[key] = new_file
        converted.append(file)
    if not converted:
        return []
    if manifest.variants is None:
        update: dict[str, object] = {"executables": {s: f for (_, s), f in files.items()}}
    else:
        shapes = [
            v.model_copy(update={"executables": {s: files[(i, s)] for s in v.executables}})
            for i, v in enumerate(manifest.variants.shapes)
        ]
        update = {"variants": manifest.variants.model_copy(update={"shapes": shapes})}
    manifest = manifest.model_copy(update=update)
    executables = files
    tmp = bundle.path / f".{MANIFEST_FILE}.tmp"
    tmp.write_text(manifest.to_yaml())
    os.replace(tmp, bundle.path / MANIFEST_FILE)
    for file in converted:
        if file not in executables.values():
            (bundle.path / file).unlink()
    return converted
