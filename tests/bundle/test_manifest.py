"""Manifest rules: each refusal names its cause (tensor, key, expected vs actual)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hloserve.bundle.manifest import MAX_FORMAT_VERSION, parse_manifest
from hloserve.errors import ManifestError

VALID: dict[str, Any] = {
    "format_version": 1,
    "kind": "model",
    "inputs": [
        {"name": "image", "dtype": "f32", "shape": "nhwc", "dims": {"h": 8, "w": 8, "c": 1}}
    ],
    "outputs": [{"name": "logits", "dtype": "f32", "shape": "nk", "dims": {"k": 10}}],
    "batching": {"compiled_batch_sizes": [8, 1, 32]},
    "executables": {1: "model.b1.mlirbc", 8: "model.b8.mlirbc", 32: "model.b32.mlirbc"},
    "weights": {"file": "weights.safetensors", "order": ["conv1.kernel", "conv1.bias"]},
    "producer": {"tool": "hloserve.export", "jax": "0.7.1", "jaxlib": "0.7.1"},
}


def refused(change: Any) -> ManifestError:
    data = copy.deepcopy(VALID)
    change(data)
    with pytest.raises(ManifestError) as info:
        parse_manifest(data)
    return info.value


def test_valid_manifest_parses() -> None:
    m = parse_manifest(copy.deepcopy(VALID))
    assert m.batching.compiled_batch_sizes == [1, 8, 32]
    assert m.max_batch_size == 32 and m.batch_leading
    image = m.inputs[0]
    assert image.batch_axis == 0 and image.shape_at(5) == (5, 8, 8, 1)
    assert image.nbytes_per_item == 256


def test_round_trip_through_yaml() -> None:
    import yaml

    m = parse_manifest(copy.deepcopy(VALID))
    assert parse_manifest(yaml.safe_load(m.to_yaml())) == m


def test_duplicated_axis_letter() -> None:
    err = refused(lambda d: d["inputs"][0].update(shape="nhhc", dims={"h": 8, "c": 1}))
    assert "'image'" in str(err) and "axis letter 'h' appears twice" in str(err)


def test_two_batch_letters() -> None:
    err = refused(lambda d: d["inputs"][0].update(shape="nbhwc"))
    assert "'image'" in str(err) and "two batch letters 'n' and 'b'" in str(err)


def test_letter_without_size() -> None:
    err = refused(lambda d: d["inputs"][0].update(dims={"h": 8, "w": 8}))
    assert "'image'" in str(err) and "axis 'c' has no size in dims" in str(err)


def test_dims_letter_not_in_shape() -> None:
    err = refused(lambda d: d["outputs"][0]["dims"].update(z=3))
    assert "'logits'" in str(err) and "dims names 'z'" in str(err)


def test_variable_size_needs_variants() -> None:
    err = refused(lambda d: d["inputs"][0]["dims"].update(w=-1))
    assert "are -1 (variable) but there is no variants section" in str(err)


def test_future_format_version_names_found_and_supported() -> None:
    err = refused(lambda d: d.update(format_version=MAX_FORMAT_VERSION + 1))
    assert f"format_version {MAX_FORMAT_VERSION + 1} is not supported" in str(err)
    assert f"reads versions 1 to {MAX_FORMAT_VERSION}" in str(err)


def test_missing_format_version() -> None:
    assert "format_version is missing" in str(refused(lambda d: d.pop("format_version")))


def test_unknown_dtype_token() -> None:
    err = refused(lambda d: d["outputs"][0].update(dtype="f31"))
    assert "'logits'" in str(err) and "unknown dtype token 'f31'" in str(err)


def test_bytes_not_allowed_on_executable_tensor() -> None:
    assert "dtype 'bytes' is not allowed" in str(
        refused(lambda d: d["inputs"][0].update(dtype="bytes"))
    )


def test_compiled_batch_size_without_executable() -> None:
    err = refused(lambda d: d["executables"].pop(8))
    assert "compiled batch size 8 has no artifact" in str(err)


def test_executable_for_size_not_compiled() -> None:
    err = refused(lambda d: d["executables"].update({16: "model.b16.mlirbc"}))
    assert "key 16 is not a compiled batch size" in str(err)


def test_mixed_batched_and_unbatched() -> None:
    err = refused(lambda d: d["outputs"][0].update(shape="k"))
    assert "have a batch axis but ['logits'] do not" in str(err)


def test_unknown_top_level_key() -> None:
    err = refused(lambda d: d.update(input_shapes=[]))
    assert "input_shapes: unknown key" in str(err)


def test_meta_kind_needs_format_version_2() -> None:
    err = refused(lambda d: d.update(kind="meta"))
    assert "kind 'meta' needs format_version 2 or later, got 1" in str(err)


def test_repeated_weight_and_tensor_names() -> None:
    err = refused(lambda d: d["weights"]["order"].append("conv1.bias"))
    assert "names a weight twice: ['conv1.bias']" in str(err)
    err = refused(lambda d: d["outputs"].append(dict(d["outputs"][0])))
    assert "outputs repeat a tensor name: ['logits']" in str(err)


def test_several_problems_reported_together() -> None:
    def change(d: dict[str, Any]) -> None:
        d["inputs"][0]["dtype"] = "f31"
        d["outputs"][0]["shape"] = "nkk"

    err = refused(change)
    assert len(err.problems) == 2


def test_unbatched_model_uses_key_zero() -> None:
    data = copy.deepcopy(VALID)
    data["inputs"][0]["shape"] = "hwc"
    data["outputs"][0]["shape"] = "k"
    data.pop("batching")
    data["executables"] = {0: "model.mlirbc"}
    m = parse_manifest(data)
    assert not m.batched and m.max_batch_size == 0


def test_files_must_stay_inside_the_bundle() -> None:
    err = refused(lambda d: d["executables"].update({8: "../../outside.mlirbc"}))
    expected = "executables: 8: '../../outside.mlirbc' must be a relative path inside the bundle"
    assert expected in str(err)
    err = refused(lambda d: d["weights"].update(file="/etc/passwd"))
    assert "weights.file '/etc/passwd' must be a relative path inside the bundle" in str(err)


def test_binary_manifest_is_a_clear_problem(tmp_path: Any) -> None:
    from hloserve.bundle.manifest import load_manifest

    path = tmp_path / "manifest.yaml"
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ManifestError, match="not UTF-8 text"):
        load_manifest(path)
