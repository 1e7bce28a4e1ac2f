"""The exporter: dtypes (f16, bf16, i64), names, atomic writes, replay via the compile path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from hloserve.bundle.bundle import load_bundle
from hloserve.bundle.validate import validate_bundle
from hloserve.export import ExportError, OutputSpec, TensorSpec, export_bundle, weight_names
from hloserve.triton_backend.runtime.compile import compile_artifact


@pytest.fixture
def x64() -> Any:
    """JAX 64-bit mode for one test (the runtime process runs with it on)."""
    previous = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


def run(bundle_dir: Path, batch: int, *inputs: np.ndarray) -> list[np.ndarray]:
    bundle = load_bundle(bundle_dir)
    exe = compile_artifact(bundle.read_artifact(batch))
    return exe.run_numpy([*bundle.load_weights(), *inputs])


def test_weight_names_are_readable_and_stable() -> None:
    params = {"dense": {"w": 1, "b": 2}, "emb": [3, 4]}
    assert weight_names(params) == ["dense.b", "dense.w", "emb.0", "emb.1"]
    assert weight_names(np.zeros(2)) == ["params"]


@pytest.mark.parametrize("token", ["f16", "bf16", "f32", "i8", "u8", "i32", "bool"])
def test_narrow_dtypes_round_trip_bit_exact(token: str, tmp_path: Path) -> None:
    """Two weights of one shape, each element different: a swap of the two weights or a
    reordering of their elements changes the answers (all-ones weights would hide both)."""
    from hloserve.bundle import dtypes

    dt = dtypes.from_token(token).numpy
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((2, 3)) * 10).astype(dt)
    if token == "bool":
        params = {"k": np.array([True, True, False]), "m": np.array([False, True, False])}
    else:
        params = {"k": np.array([2, 3, 5]).astype(dt), "m": np.array([7, 1, 4]).astype(dt)}

    def fn(p: dict[str, Any], x: Any) -> tuple[Any, Any]:
        if token == "bool":
            return x & p["k"], x ^ p["m"]
        return x * p["k"], x + p["m"]

    out = tmp_path / f"m_{token}"
    export_bundle(
        fn,
        params,
        [TensorSpec(name="x", dtype=token, shape="nk", dims={"k": 3})],
        [OutputSpec("y", "nk"), OutputSpec("z", "nk")],
        [2],
        out,
    )
    y, z = run(out, 2, x)
    want_y, want_z = fn(params, x)
    assert y.dtype == dt and y.tobytes() == want_y.tobytes()
    assert z.dtype == dt and z.tobytes() == want_z.tobytes()
    assert y.tobytes() != fn({"k": params["k"][::-1], "m": params["m"]}, x)[0].tobytes()


def test_bf16_weights_are_stored_as_bf16(tmp_path: Path) -> None:
    params = {"w": np.full((2,), 1.5, ml_dtypes.bfloat16)}
    export_bundle(
        lambda p, x: x + p["w"],
        params,
        [TensorSpec(name="x", dtype="bf16", shape="nk", dims={"k": 2})],
        [OutputSpec("y", "nk")],
        [1],
        tmp_path / "m",
    )
    assert load_bundle(tmp_path / "m").stored_weights["w"].dtype == "bf16"


def test_i64_needs_and_gets_x64(tmp_path: Path, x64: None) -> None:
    big = np.array([[2**40, -(2**41)]], np.int64)
    jax.config.update("jax_enable_x64", False)  # export turns it on by itself
    export_bundle(
        lambda p, x: x * p["k"] + 1,
        {"k": np.array([3, 5], np.int64)},
        [TensorSpec(name="x", dtype="i64", shape="nk", dims={"k": 2})],
        [OutputSpec("y", "nk")],
        [1],
        tmp_path / "m",
    )
    assert jax.config.read("jax_enable_x64") is False  # restored
    bundle = load_bundle(tmp_path / "m")
    assert bundle.manifest.outputs[0].dtype == "i64"
    jax.config.update("jax_enable_x64", True)
    (y,) = run(tmp_path / "m", 1, big)
    assert y.dtype == np.int64 and (y == big * np.array([3, 5]) + 1).all()


def test_i64_without_x64_is_a_clear_error(tmp_path: Path) -> None:
    export_bundle(
        lambda p, x: x + 1,
        {},
        [TensorSpec(name="x", dtype="i64", shape="n", dims={})],
        [OutputSpec("y", "n")],
        [1],
        tmp_path / "m",
    )
    bundle = load_bundle(tmp_path / "m")
    with pytest.raises(Exception, match="enable_x64"):
        compile_artifact(bundle.read_artifact(1)).run_numpy([np.array([1], np.int64)])


def test_dict_outputs_and_unbatched_model(tmp_path: Path) -> None:
    export_bundle(
        lambda p, x: {"b": x * 2, "a": x.sum()},
        {"unused": np.zeros(1, np.float32)},
        [TensorSpec(name="x", dtype="f32", shape="k", dims={"k": 3})],
        [OutputSpec("a", ""), OutputSpec("b", "k")],
        [],
        tmp_path / "m",
    )
    bundle = load_bundle(tmp_path / "m")
    assert bundle.manifest.executables == {0: "model.mlirbc"} and not bundle.manifest.batched
    a, b = run(tmp_path / "m", 0, np.array([1, 2, 3], np.float32))
    assert a == 6 and (b == [2, 4, 6]).all()


def test_existing_directory_is_not_overwritten(tiny_bundle: Path) -> None:
    before = (tiny_bundle / "manifest.yaml").read_text()
    with pytest.raises(ExportError, match="exists; pass overwrite=True"):
        export_bundle(
            lambda p, x: x,
            {},
            [TensorSpec(name="x", dtype="f32", shape="n", dims={})],
            [OutputSpec("y", "n")],
            [1],
            tiny_bundle,
        )
    assert (tiny_bundle / "manifest.yaml").read_text() == before


def test_failed_export_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="output 'y': shape letters 'nk' have rank 2"):
        export_bundle(
            lambda p, x: x.sum(-1),
            {},
            [TensorSpec(name="x", dtype="f32", shape="nk", dims={"k": 2})],
            [OutputSpec("y", "nk")],
            [1, 2],
            tmp_path / "m",
        )
    assert list(tmp_path.iterdir()) == []


def test_output_batch_axis_must_follow_batch(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="batch axis 'n' has size 1 at batch size 2"):
        export_bundle(
            lambda p, x: x[:1],
            {},
            [TensorSpec(name="x", dtype="f32", shape="nk", dims={"k": 2})],
            [OutputSpec("y", "nk")],
            [2],
            tmp_path / "m",
        )


def test_export_replays_jax_exactly(tiny_bundle: Path) -> None:
    from tests.conftest import TINY_PARAMS, tiny_fn

    x = np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32)
    y, s = run(tiny_bundle, 4, x)
    ref_y, ref_s = jax.jit(tiny_fn)(TINY_PARAMS, x)
    np.testing.assert_array_equal(y, np.asarray(ref_y))
    np.testing.assert_array_equal(s, np.asarray(ref_s))
    assert validate_bundle(tiny_bundle) == []
    assert jnp.asarray(y).shape == (4, 3)
