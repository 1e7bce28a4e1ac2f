"""Reading the head of a serialized KServe V2 ``ModelInferRequest``: only what routing needs,
parsed against ``InferRequestHead`` (hloserve/protos/infer_head.proto; payloads never decoded).
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError

from hloserve.errors import InvalidArgumentError
from hloserve.protos.infer_head_pb2 import InferRequestHead


@dataclass(frozen=True)
class InferHead:
    """What the gateway reads of an inference request ("" when absent); input shapes only."""

    model_name: str
    model_version: str
    request_id: str
    inputs: tuple[tuple[str, tuple[int, ...]], ...] = ()


def peek_infer_request(data: bytes) -> InferHead:
    """Read model name, version, id and input shapes from a ModelInferRequest (or a ModelReady,
    ModelMetadata, ModelConfig request).

    Raises:
        InvalidArgumentError: the bytes are not a well-formed protobuf message.
    """
    try:
        message = InferRequestHead.FromString(data)
    except DecodeError as exc:
        raise InvalidArgumentError(f"inference request: malformed protobuf ({exc})") from None
    inputs = tuple((tensor.name, tuple(tensor.shape)) for tensor in message.inputs)
    return InferHead(message.model_name, message.model_version, message.id, inputs)


def check_shapes(head: InferHead, max_batch: int | None) -> None:
    """Refuse input shapes no model can run (a 0-row BYTES input crashed tritonserver's Python
    backend).

    Raises:
        InvalidArgumentError: a negative extent; or, batching, a leading extent of 0 or above
            ``max_batch``.
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
