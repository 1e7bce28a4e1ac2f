"""Partial decoding of a serialized KServe V2 ``ModelInferRequest``: only what routing needs.

The gateway forwards inference requests as the bytes the client sent and never re-marshals
tensor payloads (ReactantServer row 62: "partial decode of model_name field 1 and id field 3
only; lpt_packing also peeks one input's shape"). This module walks the protobuf wire format
(https://protobuf.dev/programming-guides/encoding/) and skips every field it does not need,
so ``raw_input_contents`` (field 7) and tensor ``contents`` are never copied.

Field numbers are those of ``inference.ModelInferRequest`` in Triton's ``grpc_service.proto``
(model_name = 1, model_version = 2, id = 3, inputs = 5; ``InferInputTensor``: name = 1,
shape = 3, repeated int64, packed or not).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from hloserve.errors import InvalidArgumentError

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


@dataclass(frozen=True)
class InferHead:
    """What the gateway reads of an inference request.

    Attributes:
        model_name: ``model_name`` (field 1).
        model_version: ``model_version`` (field 2), "" when absent.
        request_id: ``id`` (field 3), "" when absent.
        batch: leading extent of the batch input's shape, None when there is no such input
            or it has no dimensions (then the request counts as 1 item).
        inputs: (name, shape) of every input tensor, in request order (shapes only; the
            tensor contents are never read).
    """

    model_name: str
    model_version: str
    request_id: str
    batch: int | None
    inputs: tuple[tuple[str, tuple[int, ...]], ...] = ()


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(data):
            raise InvalidArgumentError("inference request: truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise InvalidArgumentError("inference request: varint longer than 10 bytes")


def _fields(data: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """Yield (field number, wire type, value) with LEN values as views, not copies."""
    pos = 0
    end = len(data)
    while pos < end:
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: int | memoryview
        if wire == _VARINT:
            value, pos = _varint(data, pos)
        elif wire == _I64:
            value, pos = int.from_bytes(data[pos : pos + 8], "little"), pos + 8
        elif wire == _I32:
            value, pos = int.from_bytes(data[pos : pos + 4], "little"), pos + 4
        elif wire == _LEN:
            length, pos = _varint(data, pos)
            value, pos = data[pos : pos + length], pos + length
        else:
            raise InvalidArgumentError(f"inference request: unsupported wire type {wire}")
        if pos > end:
            raise InvalidArgumentError("inference request: truncated field")
        yield number, wire, value


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _shape_and_name(tensor: memoryview) -> tuple[str, list[int]]:
    name = ""
    shape: list[int] = []
    for number, wire, value in _fields(tensor):
        if number == 1 and isinstance(value, memoryview):
            name = bytes(value).decode("utf-8", "replace")
        elif number == 3 and wire == _VARINT and isinstance(value, int):
            shape.append(_signed64(value))
        elif number == 3 and isinstance(value, memoryview):  # packed
            pos = 0
            while pos < len(value):
                dim, pos = _varint(value, pos)
                shape.append(_signed64(dim))
    return name, shape


def peek_infer_request(data: bytes, batch_input: str | None = None) -> InferHead:
    """Read model name, version, id and batch extent from a serialized ModelInferRequest.

    Args:
        data: the request exactly as received.
        batch_input: name of the input whose leading axis is the batch (Triton batches on
            the leading axis of every input); None takes the first input.

    Returns:
        The head of the request; ``batch`` is None when the input is absent or scalar.

    Raises:
        InvalidArgumentError: the bytes are not a well-formed protobuf message.
    """
    view = memoryview(data)
    name = version = request_id = ""
    batch: int | None = None
    found = False
    inputs: list[tuple[str, tuple[int, ...]]] = []
    for number, _wire, value in _fields(view):
        if not isinstance(value, memoryview):
            continue
        if number == 1:
            name = bytes(value).decode("utf-8", "replace")
        elif number == 2:
            version = bytes(value).decode("utf-8", "replace")
        elif number == 3:
            request_id = bytes(value).decode("utf-8", "replace")
        elif number == 5:
            tensor_name, shape = _shape_and_name(value)
            inputs.append((tensor_name, tuple(shape)))
            if not found and (batch_input is None or tensor_name == batch_input):
                found = True
                batch = shape[0] if shape else None
    return InferHead(name, version, request_id, batch, tuple(inputs))


def check_shapes(head: InferHead, max_batch: int | None) -> None:
    """Refuse input shapes no model can run, before the request is forwarded.

    A worker must never see a request that is malformed for every model: one such request
    (0 rows of a BYTES input) crashed tritonserver's Python backend, so the gateway checks
    what it can from the shapes alone.

    Args:
        head: the peeked request (:func:`peek_infer_request`).
        max_batch: the routed model's ``max_batch_size`` when it batches (Triton batches on
            the leading axis of every input), None when it does not batch or is unknown
            (then only negative extents are refused).

    Raises:
        InvalidArgumentError: an extent is negative; or the model batches and an input's
            leading extent is 0 or above ``max_batch``. The message names model, input,
            shape and the allowed range.
    """
    model = head.model_name
    for name, shape in head.inputs:
        if any(d < 0 for d in shape):
            raise InvalidArgumentError(
                f"model {model!r}, input {name!r}: shape {list(shape)} has a negative extent"
            )
        if max_batch is None or not shape:
            continue
        if shape[0] == 0:
            raise InvalidArgumentError(
                f"model {model!r}, input {name!r}: batch size 0 (shape {list(shape)}); "
                f"a request needs 1 to {max_batch} rows"
            )
        if shape[0] > max_batch:
            raise InvalidArgumentError(
                f"model {model!r}, input {name!r}: batch size {shape[0]} (shape "
                f"{list(shape)}) exceeds the model's max_batch_size {max_batch}"
            )
