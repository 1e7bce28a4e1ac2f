"""The validator against real artifacts: each broken bundle is refused with the cause named."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export as jax_export

from hloserve.bundle.manifest import MAX_FORMAT_VERSION
from hloserve.bundle.stablehlo import to_portable_artifact
from hloserve.bundle.validate import check_bundle, validate_bundle
from hloserve.errors import BundleError

Edit = Callable[[Path, Callable[[dict[str, Any]], None]], None]


def errors(bundle: Path) -> list[str]:
    return [str(p) for p in validate_bundle(bundle) if not p.warning]


def write_artifact(
    path: Path, fn: Callable[..., Any], *shapes: tuple[tuple[int, ...], Any]
) -> None:
    structs = [jax.ShapeDtypeStruct(s, d) for s, d in shapes]
    path.write_bytes(to_portable_artifact(jax_export.export(jax.jit(fn))(*structs).mlir_module()))


def test_valid_bundle_has_no_problem(tiny_bundle: Path) -> None:
    assert validate_bundle(tiny_bundle) == []
    assert check_bundle(tiny_bundle).name == "tiny"


def test_output_dtype_differs_from_artifact(tiny_bundle: Path, edit_manifest: Edit) -> None:
    edit_manifest(tiny_bundle, lambda d: d["outputs"][0].update(dtype="f16"))
    found = errors(tiny_bundle)
    assert "model.b1.mlirbc: output 'y': dtype f16 in manifest, f32 in the artifact" in found
    assert "model.b4.mlirbc: output 'y': dtype f16 in manifest, f32 in the artifact" in found


def test_wrong_input_size(tiny_bundle: Path, edit_manifest: Edit) -> None:
    edit_manifest(tiny_bundle, lambda d: d["inputs"][0]["dims"].update(k=5))
    assert "model.b4.mlirbc: input 'x': shape [4, 5] in manifest, [4, 4] in the artifact" in errors(
        tiny_bundle
    )


def test_output_shape_differs(tiny_bundle: Path, edit_manifest: Edit) -> None:
    edit_manifest(tiny_bundle, lambda d: d["outputs"][0]["dims"].update(j=2))
    assert (
        "model.b1.mlirbc: output 'y': shape [1, 2] in manifest, [1, 3] in the artifact"
        in errors(tiny_bundle)
    )


def test_compiled_batch_size_without_artifact_file(tiny_bundle: Path) -> None:
    (tiny_bundle / "model.b4.mlirbc").unlink()
    assert errors(tiny_bundle) == ["model.b4.mlirbc: artifact for batch size 4 is missing"]


def test_missing_weight(tiny_bundle: Path, edit_manifest: Edit) -> None:
    edit_manifest(tiny_bundle, lambda d: d["weights"]["order"].insert(0, "extra_bias"))
    found = errors(tiny_bundle)
    assert (
        "weights.safetensors: weight 'extra_bias' is in weights.order but not in the file" in found
    )
    assert any("main takes 3 arguments, expected 4 (3 weights + 1 inputs)" in f for f in found)


def test_extra_weight(tiny_bundle: Path) -> None:
    from safetensors.numpy import load_file, save_file

    path = tiny_bundle / "weights.safetensors"
    stored = load_file(str(path))
    stored["unused"] = np.zeros(2, np.float32)
    save_file(stored, str(path))
    assert errors(tiny_bundle) == [
        "weights.safetensors: weight 'unused' is in the file but not in weights.order"
    ]


def test_weight_shape_differs_from_artifact(tiny_bundle: Path) -> None:
    from safetensors.numpy import load_file, save_file

    path = tiny_bundle / "weights.safetensors"
    stored = load_file(str(path))
    stored["w"] = np.zeros((4, 2), np.float32)
    save_file(stored, str(path))
    assert (
        "model.b1.mlirbc: weight 'w': shape [4, 2] in safetensors, [4, 3] in the artifact"
        in errors(tiny_bundle)
    )


def test_wrong_argument_count(tiny_bundle: Path) -> None:
    write_artifact(
        tiny_bundle / "model.b1.mlirbc",
        lambda b, w, x, extra: (x @ w + b, x.sum(-1) + extra),
        ((3,), jnp.float32),
        ((4, 3), jnp.float32),
        ((1, 4), jnp.float32),
        ((), jnp.float32),
    )
    assert errors(tiny_bundle) == [
        "model.b1.mlirbc: main takes 4 arguments, expected 3 (2 weights + 1 inputs)"
    ]


def test_wrong_result_count(tiny_bundle: Path) -> None:
    write_artifact(
        tiny_bundle / "model.b1.mlirbc",
        lambda b, w, x: x @ w + b,
        ((3,), jnp.float32),
        ((4, 3), jnp.float32),
        ((1, 4), jnp.float32),
    )
    assert errors(tiny_bundle) == [
        "model.b1.mlirbc: main returns 1 results, manifest declares 2 outputs"
    ]


def test_garbage_artifact(tiny_bundle: Path) -> None:
    (tiny_bundle / "model.b1.mlirbc").write_bytes(b"\xff\xfe not mlir")
    assert errors(tiny_bundle) == [
        "model.b1.mlirbc: neither a portable artifact nor UTF-8 MLIR text"
    ]
    (tiny_bundle / "model.b1.mlirbc").write_bytes(b"module { garbage }")
    (found,) = errors(tiny_bundle)
    assert found.startswith("model.b1.mlirbc: MLIR does not parse") and "garbage" in found


def test_text_executable_is_a_warning_only(tiny_bundle: Path, edit_manifest: Edit) -> None:
    from hloserve.bundle.stablehlo import module_text

    text = module_text((tiny_bundle / "model.b1.mlirbc").read_bytes())
    (tiny_bundle / "model.b1.mlir").write_text(text)
    edit_manifest(tiny_bundle, lambda d: d["executables"].update({1: "model.b1.mlir"}))
    problems = validate_bundle(tiny_bundle)
    assert [p.warning for p in problems] == [True]
    assert "bundle convert" in str(problems[0])


def test_manifest_problems_come_first_and_alone(tiny_bundle: Path, edit_manifest: Edit) -> None:
    edit_manifest(tiny_bundle, lambda d: d.update(format_version=MAX_FORMAT_VERSION + 1))
    assert errors(tiny_bundle) == [
        f"manifest.yaml: format_version {MAX_FORMAT_VERSION + 1} is not supported; "
        f"this hloserve reads versions 1 to {MAX_FORMAT_VERSION}"
    ]


def test_check_bundle_raises_with_every_problem(tiny_bundle: Path, edit_manifest: Edit) -> None:
    edit_manifest(tiny_bundle, lambda d: d["outputs"][1].update(dtype="i32"))
    with pytest.raises(BundleError) as info:
        check_bundle(tiny_bundle)
    assert len(info.value.problems) == 2 and "bundle 'tiny'" in str(info.value)


def test_invalid_model_name(tiny_bundle: Path) -> None:
    bad = tiny_bundle.parent / "has space"
    shutil.move(tiny_bundle, bad)
    assert "is not a valid model name" in errors(bad)[0]


def test_missing_weights_file_is_one_problem_line(tiny_bundle: Path) -> None:
    (tiny_bundle / "weights.safetensors").unlink()
    assert errors(tiny_bundle) == ["weights.safetensors: weights file is missing"]


def test_truncated_weights_file_is_one_problem_line(tiny_bundle: Path) -> None:
    (tiny_bundle / "weights.safetensors").write_bytes(b"\x08\x00\x00")
    (found,) = errors(tiny_bundle)
    assert found.startswith("weights.safetensors: ") and "cannot read safetensors file" in found


def test_empty_artifact_is_not_called_text(tiny_bundle: Path) -> None:
    (tiny_bundle / "model.b1.mlirbc").write_bytes(b"")
    problems = validate_bundle(tiny_bundle)
    assert not any(p.warning for p in problems)
    assert len([p for p in problems if not p.warning]) == 1
