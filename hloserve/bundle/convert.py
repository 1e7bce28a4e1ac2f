"""Rewrite a bundle's MLIR text executables as StableHLO portable artifacts, in place."""

from __future__ import annotations

import os
from pathlib import Path

from hloserve.bundle.bundle import load_bundle
from hloserve.bundle.manifest import MANIFEST_FILE
from hloserve.bundle.stablehlo import is_portable_artifact, to_portable_artifact


def convert_bundle(path: Path | str, target_version: str | None = None) -> list[str]:
    """Convert each text executable ``X.mlir`` to ``X.mlirbc``; the converted file names.

    The manifest is replaced atomically once the artifacts exist, then the text files removed.

    Raises:
        ManifestError: the manifest is invalid.
        ArtifactError: a text executable does not parse.
    """
    bundle = load_bundle(path)
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
    tmp = bundle.path / f".{MANIFEST_FILE}.tmp"
    tmp.write_text(manifest.model_copy(update=update).to_yaml())
    os.replace(tmp, bundle.path / MANIFEST_FILE)
    for file in converted:
        if file not in files.values():
            (bundle.path / file).unlink()
    return converted
