"""Tiny bundles that the backend tests serve, and a check that each is a valid bundle.

Imported by the tests in tests/triton_backend/ (test_front, test_runtime, test_backend_triton):
    dtypes:      one identity input/output pair per executable dtype (bit-exact transport).
    transposed:  batch axis NOT leading (``shape: "kn"``): served with ``max_batch_size: 0``.
    unbatched:   no batch axis at all (one executable, key 0).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from hloserve.bundle import dtypes
from hloserve.bundle.validate import check_bundle
from hloserve.export import OutputSpec, TensorSpec, export_bundle

#: Every dtype token an executable tensor may carry (all but bytes).
EXECUTABLE_TOKENS = tuple(t for t in dtypes.TOKENS if dtypes.from_token(t).stablehlo is not None)
DTYPES_BATCH_SIZES = (1, 4)


def export_dtypes(out: Path) -> Path:
    """``dtypes``: input ``x_<token>`` (shape nk, k=3) -> output ``y_<token>``, identity."""
    inputs = [
        TensorSpec(name=f"x_{t}", dtype=t, shape="nk", dims={"k": 3}) for t in EXECUTABLE_TOKENS
    ]
    outputs = [OutputSpec(f"y_{t}", "nk") for t in EXECUTABLE_TOKENS]

    def identity(params: Any, *xs: Any) -> tuple[Any, ...]:
        return xs

    export_bundle(identity, {}, inputs, outputs, list(DTYPES_BATCH_SIZES), out)
    return out


def extreme_values(token: str, rows: int, seed: int = 0) -> np.ndarray:
    """``(rows, 3)`` values of a dtype, with the edge cases first (NaN, inf, -0, min, max)."""
    dtype = dtypes.from_token(token).numpy
    rng = np.random.default_rng(seed)
    if token == "bool":
        return rng.integers(0, 2, size=(rows, 3)).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        edge = [info.min, info.max, 0, 1, info.max - 1, info.min + 1]
        rand = rng.integers(info.min, info.max, size=rows * 3, dtype=dtype, endpoint=True)
        return np.concatenate([np.array(edge, dtype), rand])[: rows * 3].reshape(rows, 3)
    finfo = ml_dtypes.finfo(dtype)
    edge = [np.nan, np.inf, -np.inf, -0.0, finfo.max, finfo.tiny, finfo.smallest_subnormal, -1.5]
    rand = rng.standard_normal(rows * 3).astype(dtype)
    out = np.concatenate([np.array(edge).astype(dtype), rand])[: rows * 3]
    return out.reshape(rows, 3)


TRANSPOSED_W = np.array([2.0, -3.0], np.float32)


def transposed_fn(params: Any, x: Any) -> tuple[Any, Any]:
    """x: (k=2, n) -> y: (n, k) = x.T * w, z: (k, n) = x + 1."""
    return x.T * params["w"], x + 1


def export_transposed(out: Path) -> Path:
    export_bundle(
        transposed_fn,
        {"w": TRANSPOSED_W},
        [TensorSpec(name="x", dtype="f32", shape="kn", dims={"k": 2})],
        [OutputSpec("y", "nk"), OutputSpec("z", "kn")],
        [2, 4],
        out,
    )
    return out


def export_unbatched(out: Path) -> Path:
    """``unbatched``: x (k=3) -> y = 2x + b, no batch axis."""
    export_bundle(
        lambda p, x: x * 2 + p["b"],
        {"b": np.array([1.0, 2.0, 3.0], np.float32)},
        [TensorSpec(name="x", dtype="f32", shape="k", dims={"k": 3})],
        [OutputSpec("y", "k")],
        [],
        out,
    )
    return out


def test_dtypes_bundle_is_valid(tmp_path: Path) -> None:
    bundle = check_bundle(export_dtypes(tmp_path / "dtypes"))
    assert [s.dtype for s in bundle.manifest.outputs] == list(EXECUTABLE_TOKENS)
    assert "bf16" in EXECUTABLE_TOKENS and "bytes" not in EXECUTABLE_TOKENS


def test_other_bundles_are_valid(tmp_path: Path) -> None:
    t = check_bundle(export_transposed(tmp_path / "transposed"))
    assert not t.manifest.batch_leading and t.manifest.batched
    u = check_bundle(export_unbatched(tmp_path / "unbatched"))
    assert not u.manifest.batched


def test_extreme_values_hold_edge_cases() -> None:
    f = extreme_values("bf16", 4)
    assert np.isnan(f[0, 0]) and np.isinf(f[0, 1]) and f.dtype == np.dtype(ml_dtypes.bfloat16)
    i = extreme_values("i64", 4)
    assert i[0, 0] == np.iinfo(np.int64).min and i[0, 1] == np.iinfo(np.int64).max
