"""pb_utils adapters (hloserve.triton_backend.backends.pb) with stand-ins for the stub's objects.

DLPack capsules are produced and consumed by NumPy and by JAX (an independent DLPack
implementation that knows bfloat16), so the bf16 relabelling is checked against a real consumer.
The real stub is exercised in tests/triton_backend/test_backend_triton.py.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from hloserve.errors import HloserveError, InvalidArgumentError, NotFoundError, Status
from hloserve.model_parameters import ModelArgs
from hloserve.triton_backend.backends import dlpack, pb
from hloserve.triton_backend.backends.dlpack import _CapsuleExporter

BF16_BITS = np.array([0x0000, 0x8000, 0x3FC0, 0x7F80, 0xFF80, 0x7FC1, 0x0001, 0x7F7F], np.uint16)


class FakeTritonError:
    INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS = range(6)

    def __init__(self, message: str, code: int = 0) -> None:
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class FakeTensor:
    """A host pb_utils.Tensor: DLPack out by JAX (bf16-aware), DLPack in consumed by JAX."""

    def __init__(self, name: str, array: Any) -> None:
        self._name, self.array = name, array

    @classmethod
    def from_dlpack(cls, name: str, capsule: Any) -> FakeTensor:
        import jax

        return cls(name, np.asarray(jax.dlpack.from_dlpack(_CapsuleExporter(capsule))).copy())

    def name(self) -> str:
        return self._name

    def to_dlpack(self) -> Any:
        import jax.numpy as jnp

        if self.array.dtype == np.dtype(object):
            raise RuntimeError("BYTES has no DLPack form")
        return jnp.asarray(self.array).__dlpack__()

    def as_numpy(self) -> np.ndarray:
        return np.asarray(self.array)


class FakePbUtils:
    Tensor = FakeTensor
    TritonError = FakeTritonError

    class InferenceResponse:
        def __init__(self, output_tensors: Any = (), error: Any = None) -> None:
            self.output_tensors, self.error = list(output_tensors), error


@pytest.fixture
def x64() -> Iterator[None]:
    """JAX's 64-bit mode for one test (the stand-in tensors go through JAX)."""
    import jax

    previous = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


def test_every_status_has_a_triton_code() -> None:
    assert set(pb.TRITON_ERROR_CODE) == set(Status)
    assert pb.TRITON_ERROR_CODE[Status.INVALID_ARGUMENT] == "INVALID_ARG"
    assert pb.TRITON_ERROR_CODE[Status.NOT_FOUND] == "NOT_FOUND"
    assert pb.TRITON_ERROR_CODE[Status.UNAVAILABLE] == "UNAVAILABLE"
    assert pb.TRITON_ERROR_CODE[Status.UNIMPLEMENTED] == "UNSUPPORTED"
    assert pb.TRITON_ERROR_CODE[Status.INTERNAL] == "INTERNAL"
    for status in (Status.INVALID_ARGUMENT, Status.NOT_FOUND, Status.UNAVAILABLE):
        assert pb.status_of_code(pb.TRITON_ERROR_CODE[status]) is status
    assert pb.status_of_code("ALREADY_EXISTS") is Status.INTERNAL


def test_not_ready_text_means_unavailable_whatever_the_code() -> None:
    message = "Failed for execute the inference request. Model 'hloserve_runtime' is not ready."
    assert pb.status_of_code("INTERNAL", message) is Status.UNAVAILABLE
    err = pb.error_from_triton(FakePbUtils, FakeTritonError(message, FakeTritonError.INTERNAL))
    assert err.status is Status.UNAVAILABLE and err.message == message
    err = pb.error_from_triton(FakePbUtils, FakeTritonError("bad", FakeTritonError.NOT_FOUND))
    assert err.status is Status.NOT_FOUND


def test_error_code_and_response(caplog: pytest.LogCaptureFixture) -> None:
    assert pb.error_code(InvalidArgumentError("bad x")) == ("bad x", "INVALID_ARG")
    assert pb.error_code(NotFoundError("no y")) == ("no y", "NOT_FOUND")
    with caplog.at_level(logging.ERROR, logger="hloserve.triton_backend"):
        message, code = pb.error_code(ZeroDivisionError("oops"))
    assert (message, code) == ("internal error: ZeroDivisionError: oops", "INTERNAL")
    assert "Traceback" in caplog.text or "ZeroDivisionError" in caplog.text
    response = pb.inference_response(FakePbUtils, HloserveError("gone", status=Status.NOT_FOUND))
    assert response.error.message() == "gone"
    assert response.error.code() == FakeTritonError.NOT_FOUND


def test_bf16_capsule_out_is_read_by_jax_bit_exactly() -> None:
    import jax

    values = BF16_BITS.view(ml_dtypes.bfloat16)
    capsule = dlpack.to_capsule(values)
    assert dlpack.capsule_dtype(capsule) == (dlpack.DL_BFLOAT, 16)
    got = jax.dlpack.from_dlpack(_CapsuleExporter(capsule))
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    assert np.asarray(got).view(np.uint16).tolist() == BF16_BITS.tolist()


def test_bf16_capsule_in_from_jax_is_read_bit_exactly() -> None:
    import jax.numpy as jnp

    source = jnp.asarray(BF16_BITS.view(ml_dtypes.bfloat16))
    got = dlpack.from_capsule(source.__dlpack__())
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    assert got.view(np.uint16).tolist() == BF16_BITS.tolist()


@pytest.mark.parametrize(
    "dtype",
    [
        np.bool_,
        np.uint8,
        np.uint16,
        np.uint32,
        np.uint64,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.float16,
        ml_dtypes.bfloat16,
        np.float32,
        np.float64,
    ],
)
def test_tensor_round_trip_every_dtype(dtype: type, x64: None) -> None:
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, size=(3, 4 * np.dtype(dtype).itemsize), dtype=np.uint8)
    array = raw.view(dtype) if dtype is not np.bool_ else raw[:, :4] % 2 == 1
    tensor = dlpack.to_triton_tensor(FakePbUtils, "t", array)
    assert tensor.name() == "t"
    assert tensor.array.dtype == array.dtype and tensor.array.tobytes() == array.tobytes()
    back = dlpack.to_numpy(tensor)
    assert back.dtype == array.dtype and back.tobytes() == array.tobytes()


def test_read_only_and_strided_arrays_are_exported() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    ro = a.copy()
    ro.flags.writeable = False
    for array in (ro, a[:, ::2], a.T):
        capsule = dlpack.to_capsule(array)
        np.testing.assert_array_equal(dlpack.from_capsule(capsule), array)


def test_bytes_go_through_as_numpy() -> None:
    words = np.array([b"a", b"bc"], dtype=object)
    tensor = dlpack.to_triton_tensor(FakePbUtils, "w", words)
    assert tensor.array is words
    assert dlpack.to_numpy(tensor).tolist() == [b"a", b"bc"]
    assert dlpack.to_numpy(tensor, np.dtype(object)).tolist() == [b"a", b"bc"]


def test_model_args_from_triton() -> None:
    config = {"parameters": {"hloserve.bundle": {"string_value": "1/bundle"}}}
    args = ModelArgs.from_triton(
        {
            "model_name": "affine",
            "model_repository": "/repo/affine",
            "model_version": "1",
            "model_instance_name": "affine_0_0",
            "model_config": json.dumps(config),
        }
    )
    assert args.model_dir == Path("/repo/affine") and args.version == "1"
    assert args.parameters == {"hloserve.bundle": "1/bundle"}
