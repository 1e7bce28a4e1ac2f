"""The dtype table: every token maps consistently across NumPy, KServe, Triton, StableHLO."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hloserve.bundle import dtypes
from hloserve.errors import InvalidArgumentError, Status


def test_every_token_round_trips_through_every_column() -> None:
    for token in dtypes.TOKENS:
        row = dtypes.from_token(token)
        assert [r.token for r in dtypes._ROWS if r.kserve == row.kserve] == [token]
        assert (
            row.triton == "TYPE_STRING" if token == "bytes" else row.triton == f"TYPE_{row.kserve}"
        )
        if token != "bytes":
            assert dtypes.from_stablehlo(row.stablehlo) is row  # type: ignore[arg-type]
            assert dtypes.from_safetensors(row.safetensors) is row  # type: ignore[arg-type]
            assert dtypes.from_numpy(row.numpy) is row


def test_known_rows() -> None:
    assert dtypes.from_token("bf16").numpy == np.dtype(ml_dtypes.bfloat16)
    assert dtypes.from_token("bool").stablehlo == "i1"
    assert dtypes.from_token("u16").stablehlo == "ui16"
    assert dtypes.from_token("i64").itemsize == 8
    assert dtypes.from_token("bytes").itemsize == 0
    assert dtypes.from_token("bytes").stablehlo is None


def test_unknown_token_names_it_and_the_known_ones() -> None:
    with pytest.raises(InvalidArgumentError, match=r"unknown dtype token 'f31'.*f32") as info:
        dtypes.from_token("f31")
    assert info.value.status is Status.INVALID_ARGUMENT


def test_unsupported_numpy_dtype() -> None:
    with pytest.raises(InvalidArgumentError, match="complex64"):
        dtypes.from_numpy(np.complex64)
