"""Symbolic-batch bundles: one artifact for every batch size, specialized at build/load time."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.bundle.bundle import load_bundle
from hloserve.bundle.inspect import render_bundle
from hloserve.bundle.manifest_sections import SYMBOLIC
from hloserve.bundle.stablehlo import read_signature, specialize_batch
from hloserve.bundle.validate import check_bundle, validate_bundle
from hloserve.errors import ArtifactError, BatchSizeError, BundleError, ManifestError
from hloserve.export import ExportError, OutputSpec, TensorSpec, export_bundle
from hloserve.model_repository_tools.batch_sizes import default_batch_sizes, parse_batch_sizes
from hloserve.triton_backend.runtime.compile import compile_artifact


def _with_sizes(bundle: Path, sizes: list[int], edit: Callable[..., None]) -> None:
    def change(data: dict[str, Any]) -> None:
        data["batching"]["compiled_batch_sizes"] = sizes

    edit(bundle, change)


def test_symbolic_export_writes_one_artifact_with_a_dynamic_batch(symbolic_digits: Path) -> None:
    bundle = check_bundle(symbolic_digits)
    m = bundle.manifest
    assert m.format_version == 3 and m.is_symbolic and m.batched
    assert m.batching.compiled_batch_sizes == []
    assert set(m.executables) == {SYMBOLIC}
    signature = read_signature((symbolic_digits / m.executables[SYMBOLIC]).read_bytes())
    assert signature.inputs[-1].shape == (None, 8, 8, 1)
    assert signature.outputs[0].shape == (None, 10)
    assert "symbolic:" in (symbolic_digits / "manifest.yaml").read_text()


def test_symbolic_artifact_is_at_most_half_the_three_size_bundle(
    symbolic_digits: Path, digits_bundle: Path
) -> None:
    symbolic = sum(p.stat().st_size for p in symbolic_digits.glob("*.mlirbc"))
    fixed = sum(p.stat().st_size for p in digits_bundle.glob("*.mlirbc"))
    print(f"symbolic artifact {symbolic} B vs three fixed {fixed} B: {symbolic / fixed:.2f}x")
    assert symbolic <= 0.5 * fixed


def test_specialized_outputs_equal_the_fixed_bundle(
    symbolic_digits: Path,
    digits_bundle: Path,
    digits_model: Any,
    digits_params: Any,
    tmp_path: Path,
    edit_manifest: Callable[..., None],
) -> None:
    import shutil

    chosen = tmp_path / "digits"
    shutil.copytree(symbolic_digits, chosen)
    _with_sizes(chosen, [1, 5, 8, 32, 64], edit_manifest)
    symbolic = check_bundle(chosen)
    fixed = load_bundle(digits_bundle)
    weights = fixed.load_weights()
    assert [w.tobytes() for w in symbolic.load_weights()] == [w.tobytes() for w in weights]
    rng = np.random.default_rng(0)
    for size in (1, 5, 8, 32, 64):
        x = rng.random((size, 8, 8, 1), dtype=np.float32)
        got = compile_artifact(symbolic.read_artifact(size)).run_numpy([*weights, x])[0]
        if size in (1, 8, 32):
            want = compile_artifact(fixed.read_artifact(size)).run_numpy([*weights, x])[0]
        elif size == 5:  # the fixed bundle pads 5 rows to its compiled size 8
            padded = np.concatenate([x, np.zeros((3, 8, 8, 1), np.float32)])
            exe = compile_artifact(fixed.read_artifact(8))
            want = exe.run_numpy([*weights, padded])[0][:5]
        else:  # 64: a size only the build chose; the JAX model is the reference
            want = np.asarray(digits_model.apply(digits_params, x))
        assert got.shape == (size, 10)
        # rtol: float32 logits reach ~20, where one ULP is 1.9e-6 (seen once with atol alone)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 if size != 64 else 1e-5)


def test_specialize_checks_the_artifacts_constraints(tmp_path: Path) -> None:
    out = tmp_path / "bounded"
    export_bundle(
        lambda p, x: x * p["k"],
        {"k": np.float32(3.0)},
        [TensorSpec(name="x", dtype="f32", shape="nk", dims={"k": 4})],
        [OutputSpec("y", "nk")],
        "symbolic",
        out,
        batch_min=2,
        batch_max=16,
    )
    bundle = load_bundle(out)
    assert bundle.manifest.batching.symbolic is not None
    assert bundle.manifest.batching.symbolic.max == 16
    data = (out / bundle.manifest.executables[SYMBOLIC]).read_bytes()
    assert read_signature(specialize_batch(data, 16)).inputs[-1].shape == (16, 4)
    for size, constraint in ((1, ">= 2"), (17, "b <= 16")):
        with pytest.raises(ArtifactError, match="cannot specialize") as err:
            specialize_batch(data, size)
        assert constraint in str(err.value)


def test_validator_refuses_sizes_that_break_the_constraints(
    tmp_path: Path, edit_manifest: Callable[..., None]
) -> None:
    out = tmp_path / "bounded"
    export_bundle(
        lambda p, x: x + 1.0,
        {},
        [TensorSpec(name="x", dtype="f32", shape="nk", dims={"k": 4})],
        [OutputSpec("y", "nk")],
        "symbolic",
        out,
        batch_max=16,
    )
    _with_sizes(out, [8, 32], edit_manifest)  # the manifest's own constraint
    problems = [str(p) for p in validate_bundle(out)]
    assert any("32 breaks the symbolic batch constraint b <= 16" in p for p in problems), problems

    def loosen(data: dict[str, Any]) -> None:  # the manifest no longer says it; the artifact does
        del data["batching"]["symbolic"]["max"]

    edit_manifest(out, loosen)
    problems = [str(p) for p in validate_bundle(out)]
    assert len(problems) == 1, problems
    assert "compiled batch size 32 is refused by the artifact's constraints" in problems[0]
    assert "input 'x', batch axis 'n'" in problems[0] and "b <= 16" in problems[0]


def test_manifest_rules_for_symbolic(
    symbolic_digits: Path, tmp_path: Path, edit_manifest: Callable[..., None]
) -> None:
    import shutil

    bundle = tmp_path / "digits"
    shutil.copytree(symbolic_digits, bundle)

    def old_version(data: dict[str, Any]) -> None:
        data["format_version"] = 2

    edit_manifest(bundle, old_version)
    with pytest.raises(ManifestError, match=r"batching\.symbolic needs format_version 3"):
        load_bundle(bundle)

    def fixed_key(data: dict[str, Any]) -> None:
        data["format_version"] = 3
        data["executables"] = {8: data["executables"]["symbolic"]}

    edit_manifest(bundle, fixed_key)
    with pytest.raises(ManifestError, match="a symbolic-batch model has only the key 'symbolic'"):
        load_bundle(bundle)


def test_a_static_artifact_is_not_accepted_as_symbolic(
    digits_bundle: Path, tmp_path: Path, edit_manifest: Callable[..., None]
) -> None:
    import shutil

    bundle = tmp_path / "digits"
    shutil.copytree(digits_bundle, bundle)

    def claim_symbolic(data: dict[str, Any]) -> None:
        data["format_version"] = 3
        data["batching"] = {"symbolic": {"min": 1}}
        data["executables"] = {"symbolic": data["executables"][8]}

    edit_manifest(bundle, claim_symbolic)
    with pytest.raises(BundleError) as err:
        check_bundle(bundle)
    assert "input 'image': shape [?, 8, 8, 1] in manifest, [8, 8, 8, 1] in the artifact" in str(
        err.value
    )


def test_export_refuses_symbolic_without_batch_axis(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="needs a batch axis"):
        export_bundle(
            lambda p, x: x,
            {},
            [TensorSpec(name="x", dtype="f32", shape="k", dims={"k": 4})],
            [OutputSpec("y", "k")],
            "symbolic",
            tmp_path / "m",
        )
    with pytest.raises(ExportError, match="only with batch_sizes='symbolic'"):
        export_bundle(
            lambda p, x: x,
            {},
            [TensorSpec(name="x", dtype="f32", shape="nk", dims={"k": 4})],
            [OutputSpec("y", "nk")],
            [1],
            tmp_path / "m",
            batch_max=4,
        )


def test_inspect_shows_symbolic_batch(symbolic_digits: Path) -> None:
    from rich.console import Console

    console = Console(width=160, record=True)
    console.print(render_bundle(load_bundle(symbolic_digits)))
    text = console.export_text()
    assert "symbolic batch (b >= 1) (sizes chosen at repo build)" in text
    assert "model.symbolic.mlirbc" in text


def test_parse_batch_sizes() -> None:
    options = parse_batch_sizes(["1,4,16", "digits=8,1"])
    assert options.default == (1, 4, 16) and options.per_model == {"digits": (1, 8)}
    for bad, message in (
        (["1,x"], "comma-separated positive integers"),
        (["0,4"], "positive and distinct"),
        (["1", "2"], "given twice"),
        (["a=1", "a=2"], "'a' is given twice"),
        (["=1"], "expected MODEL=SIZES"),
    ):
        with pytest.raises(BatchSizeError, match=message):
            parse_batch_sizes(bad)


def test_default_ladder_is_bounded_by_constraints_and_memory(symbolic_digits: Path) -> None:
    manifest = load_bundle(symbolic_digits).manifest
    assert default_batch_sizes(manifest) == (1, 4, 16, 64)
    bounded = manifest.model_copy(
        update={
            "batching": manifest.batching.model_copy(
                update={"symbolic": manifest.batching.symbolic.model_copy(update={"max": 20})}  # type: ignore[union-attr]
            )
        }
    )
    assert default_batch_sizes(bounded) == (1, 4, 16)


def test_a_scalar_weight_keeps_its_shape(tmp_path: Path) -> None:
    """A 0-d weight is stored 0-d (NumPy's ascontiguousarray would make it 1-d)."""
    bundle = export_bundle(
        lambda p, x: x * p["k"],
        {"k": np.float32(3.0)},
        [TensorSpec(name="x", dtype="f32", shape="nk", dims={"k": 2})],
        [OutputSpec("y", "nk")],
        [1],
        tmp_path / "scalar",
    )
    (k,) = bundle.load_weights()
    assert k.shape == () and k == np.float32(3.0)
