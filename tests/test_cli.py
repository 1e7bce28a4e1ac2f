"""``hloserve bundle validate|inspect|convert`` as a user runs them (a real subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hloserve.bundle.stablehlo import is_portable_artifact, module_text
from hloserve.bundle.validate import validate_bundle
from tests.conftest import GOLDEN, ROOT


def hloserve(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "hloserve.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_validate_valid_bundles_exits_zero() -> None:
    result = hloserve("bundle", "validate", GOLDEN / "affine")
    assert result.returncode == 0, result.stderr
    assert "affine: valid" in result.stdout


def test_validate_prints_one_line_per_problem(
    tiny_bundle: Path, edit_manifest: Callable[..., Any]
) -> None:
    edit_manifest(tiny_bundle, lambda d: d["outputs"][0].update(dtype="f16"))
    (tiny_bundle / "model.b4.mlirbc").unlink()
    result = hloserve("bundle", "validate", tiny_bundle, GOLDEN / "affine")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert "tiny/model.b1.mlirbc: output 'y': dtype f16 in manifest, f32 in the artifact" in lines
    assert "tiny/model.b4.mlirbc: artifact for batch size 4 is missing" in lines
    assert lines[-1].endswith("tiny: INVALID (2 problems)")
    assert "affine: valid" in result.stdout


def test_inspect_shows_tensors_sizes_and_weight_bytes() -> None:
    result = hloserve("bundle", "inspect", GOLDEN / "affine")
    assert result.returncode == 0, result.stderr
    for text in ("affine", "[n, 4]", "FP32", "model.b2.mlirbc", "2 tensors, 60 B"):
        assert text in result.stdout


def test_inspect_a_missing_bundle_is_a_clear_error(tmp_path: Path) -> None:
    result = hloserve("bundle", "inspect", tmp_path / "nope")
    assert result.returncode == 1
    assert (
        "error (NOT_FOUND)" in result.stderr and "not a bundle (no manifest.yaml)" in result.stderr
    )


def test_convert_rewrites_text_as_portable_artifacts(
    tiny_bundle: Path, edit_manifest: Callable[..., Any]
) -> None:
    for size in (1, 4):
        text = module_text((tiny_bundle / f"model.b{size}.mlirbc").read_bytes())
        (tiny_bundle / f"model.b{size}.mlirbc").unlink()
        (tiny_bundle / f"model.b{size}.mlir").write_text(text)
    edit_manifest(
        tiny_bundle, lambda d: d.update(executables={1: "model.b1.mlir", 4: "model.b4.mlir"})
    )
    assert all(p.warning for p in validate_bundle(tiny_bundle))
    result = hloserve("bundle", "validate", tiny_bundle)
    assert result.returncode == 0, result.stderr  # warnings only: valid
    assert "tiny/model.b1.mlir: warning: MLIR text, not a portable artifact" in result.stderr
    result = hloserve("bundle", "convert", tiny_bundle)
    assert result.returncode == 0, result.stderr
    assert "converted model.b1.mlir, model.b4.mlir" in result.stdout
    assert validate_bundle(tiny_bundle) == []
    assert is_portable_artifact((tiny_bundle / "model.b4.mlirbc").read_bytes())
    assert not (tiny_bundle / "model.b1.mlir").exists()
    assert "already a portable artifact" in hloserve("bundle", "convert", tiny_bundle).stdout


def test_help_explains_the_commands() -> None:
    result = hloserve("bundle", "validate", "--help")
    assert result.returncode == 0 and "one line per" in result.stdout
