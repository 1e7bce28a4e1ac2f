"""The one dtype table: manifest token, NumPy, KServe V2, Triton, StableHLO, safetensors.

Sources: KServe V2 "Tensor Data Types"; Triton ``model_config.proto`` ``DataType``; StableHLO
spec "Types"; safetensors ``Dtype``. bf16 is ``ml_dtypes.bfloat16`` (NumPy has none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from hloserve.errors import InvalidArgumentError


@dataclass(frozen=True)
class DType:
    """One row of the dtype table, e.g. ``f32``, ``float32``, ``FP32``, ``TYPE_FP32``, ``f32``,
    ``F32``; bytes: NumPy ``object``, no StableHLO or safetensors type (None)."""

    token: str
    numpy: np.dtype
    kserve: str
    triton: str
    stablehlo: str | None
    safetensors: str | None

    @property
    def itemsize(self) -> int:
        """Bytes per element (0 for bytes: variable length)."""
        return 0 if self.token == "bytes" else self.numpy.itemsize


#: One row per dtype: token, NumPy, KServe V2, Triton, StableHLO, safetensors ("-": none).
_TABLE = """\
bool   bool      BOOL    TYPE_BOOL    i1    BOOL
u8     uint8     UINT8   TYPE_UINT8   ui8   U8
u16    uint16    UINT16  TYPE_UINT16  ui16  U16
u32    uint32    UINT32  TYPE_UINT32  ui32  U32
u64    uint64    UINT64  TYPE_UINT64  ui64  U64
i8     int8      INT8    TYPE_INT8    i8    I8
i16    int16     INT16   TYPE_INT16   i16   I16
i32    int32     INT32   TYPE_INT32   i32   I32
i64    int64     INT64   TYPE_INT64   i64   I64
f16    float16   FP16    TYPE_FP16    f16   F16
bf16   bfloat16  BF16    TYPE_BF16    bf16  BF16
f32    float32   FP32    TYPE_FP32    f32   F32
f64    float64   FP64    TYPE_FP64    f64   F64
bytes  object    BYTES   TYPE_STRING  -     -
"""
_ROWS = tuple(
    DType(
        token,
        np.dtype(ml_dtypes.bfloat16 if numpy == "bfloat16" else numpy),
        kserve,
        triton,
        None if stablehlo == "-" else stablehlo,
        None if safetensors == "-" else safetensors,
    )
    for token, numpy, kserve, triton, stablehlo, safetensors in map(str.split, _TABLE.splitlines())
)

#: Every manifest dtype token, in table order.
TOKENS: tuple[str, ...] = tuple(row.token for row in _ROWS)


def _index(column: str) -> dict[Any, DType]:
    return {getattr(row, column): row for row in _ROWS if getattr(row, column) is not None}


_BY_TOKEN, _BY_TRITON, _BY_STABLEHLO, _BY_SAFETENSORS = map(
    _index, ("token", "triton", "stablehlo", "safetensors")
)
_BY_NUMPY = {row.numpy: row for row in _ROWS if row.token != "bytes"}


def _lookup(table: dict[str, DType], key: str, what: str) -> DType:
    try:
        return table[key]
    except KeyError:
        known = ", ".join(sorted(table))
        raise InvalidArgumentError(f"unknown {what} {key!r}; known: {known}") from None


def from_token(token: str) -> DType:
    """Row for a manifest token. Raises InvalidArgumentError naming the known tokens."""
    return _lookup(_BY_TOKEN, token, "dtype token")


def from_triton(data_type: str) -> DType:
    """Row for a Triton ``config.pbtxt`` data type such as ``"TYPE_FP32"``."""
    return _lookup(_BY_TRITON, data_type, "Triton data type")


def from_stablehlo(element_type: str) -> DType:
    """Row for a StableHLO element type such as ``"f32"`` or ``"ui8"``."""
    return _lookup(_BY_STABLEHLO, element_type, "StableHLO element type")


def from_safetensors(dtype: str) -> DType:
    """Row for a safetensors dtype string such as ``"F32"``."""
    return _lookup(_BY_SAFETENSORS, dtype, "safetensors dtype")


def from_numpy(dtype: np.dtype | type) -> DType:
    """Row for a NumPy dtype (bfloat16 from ml_dtypes included); bytes are not numeric."""
    key = np.dtype(dtype)
    if key not in _BY_NUMPY:
        raise InvalidArgumentError(f"unsupported NumPy dtype {key}; supported: {list(TOKENS)}")
    return _BY_NUMPY[key]
