"""Replay the checked-in golden bundle: bytes an earlier hloserve wrote still load and agree."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hloserve.bundle.bundle import load_bundle
from hloserve.bundle.stablehlo import is_portable_artifact, read_signature
from hloserve.bundle.validate import check_bundle
from hloserve.triton_backend.runtime.compile import compile_artifact
from tests.conftest import GOLDEN

AFFINE = GOLDEN / "affine"


def test_golden_bundle_validates_and_its_manifest_reads_as_written() -> None:
    bundle = check_bundle(AFFINE)
    m = bundle.manifest
    assert bundle.name == "affine" and m.format_version == 1
    assert [(t.name, t.dtype, t.shape, t.dims) for t in m.inputs] == [("x", "f32", "nk", {"k": 4})]
    assert [(t.name, t.dtype, t.shape) for t in m.outputs] == [
        ("y", "f32", "nj"),
        ("label", "i32", "n"),
    ]
    assert m.executables == {1: "model.b1.mlirbc", 2: "model.b2.mlirbc"}
    assert m.weights.order == ["b", "w"] and bundle.weight_nbytes == (3 + 12) * 4


def test_golden_artifacts_are_portable_with_the_documented_signature() -> None:
    data = (AFFINE / "model.b2.mlirbc").read_bytes()
    assert is_portable_artifact(data)
    sig = read_signature(data)
    assert [(t.shape, t.element_type) for t in sig.inputs] == [
        ((3,), "f32"),
        ((4, 3), "f32"),
        ((2, 4), "f32"),
    ]
    assert [(t.shape, t.element_type) for t in sig.outputs] == [((2, 3), "f32"), ((2,), "i32")]


def test_golden_bundle_replays_its_expected_outputs() -> None:
    expected = np.load(GOLDEN / "affine.expected.npz")
    bundle = load_bundle(AFFINE)
    weights = bundle.load_weights()
    y, label = compile_artifact(bundle.read_artifact(2)).run_numpy([*weights, expected["x"]])
    np.testing.assert_allclose(y, expected["y"], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(label, expected["label"])
    for row in range(2):  # batch size 1 agrees with the rows of batch size 2
        y1, label1 = compile_artifact(bundle.read_artifact(1)).run_numpy(
            [*weights, expected["x"][row : row + 1]]
        )
        np.testing.assert_allclose(y1[0], expected["y"][row], rtol=1e-6, atol=1e-6)
        assert label1[0] == expected["label"][row]


def test_golden_files_are_small() -> None:
    assert sum(p.stat().st_size for p in Path(AFFINE).iterdir()) < 16 * 1024
