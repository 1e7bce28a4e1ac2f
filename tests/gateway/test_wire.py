"""Reading the head of ModelInferRequest bytes (docs/gateway.md, "Proxy")."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from hloserve.errors import InvalidArgumentError
from hloserve.gateway.wire import check_shapes, peek_infer_request


def _request(**inputs: list[int]) -> bytes:
    request = service_pb2.ModelInferRequest(model_name="digits", model_version="3", id="r-7")
    for name, shape in inputs.items():
        tensor = request.inputs.add(name=name, datatype="FP32")
        tensor.shape.extend(shape)
        request.raw_input_contents.append(np.zeros(shape, np.float32).tobytes())
    return request.SerializeToString()


def test_reads_name_version_id_and_input_shapes() -> None:
    head = peek_infer_request(_request(x=[5, 28, 28], y=[7, 2]))
    assert (head.model_name, head.model_version, head.request_id) == ("digits", "3", "r-7")
    assert head.inputs == (("x", (5, 28, 28)), ("y", (7, 2)))
    assert peek_infer_request(_request()).inputs == ()
    assert peek_infer_request(_request(x=[])).inputs == (("x", ()),)


def test_unpacked_shape_is_read_too() -> None:
    # InferInputTensor{name: "x" (field 1), shape: 4 then 9 as two unpacked varints (field 3)}
    tensor = b"\x0a\x01x" + b"\x18\x04" + b"\x18\x09"
    data = b"\x0a\x01m" + b"\x2a" + bytes([len(tensor)]) + tensor
    head = peek_infer_request(data)
    assert head.model_name == "m" and head.inputs == (("x", (4, 9)),)


def test_large_payload_is_skipped() -> None:
    request = _request(x=[1, 20 * 1024 * 1024 // 4])
    assert len(request) > 20 * 1024 * 1024
    assert peek_infer_request(request).inputs == (("x", (1, 20 * 1024 * 1024 // 4)),)


@pytest.mark.parametrize("data", [b"\x0a\x05ab", b"\x0a", b"\x0f", b"\x08\xff"])
def test_malformed_bytes_are_invalid_argument(data: bytes) -> None:
    with pytest.raises(InvalidArgumentError, match="inference request"):
        peek_infer_request(data)


def test_inputs_and_check_shapes() -> None:
    head = peek_infer_request(_request(x=[0, 3], y=[2, 2]))
    assert head.inputs == (("x", (0, 3)), ("y", (2, 2)))
    check_shapes(head, None)  # not batching: 0 rows may be meaningful
    with pytest.raises(InvalidArgumentError, match="model 'digits', input 'x': batch size 0"):
        check_shapes(head, 8)
    check_shapes(peek_infer_request(_request(x=[8, 3])), 8)
    with pytest.raises(InvalidArgumentError, match=r"batch size 9 .* max_batch_size 8"):
        check_shapes(peek_infer_request(_request(x=[9, 3])), 8)
    request = service_pb2.ModelInferRequest(model_name="digits")
    request.inputs.add(name="x", datatype="FP32").shape.extend([2, -1])
    negative = peek_infer_request(request.SerializeToString())
    assert negative.inputs == (("x", (2, -1)),)
    with pytest.raises(InvalidArgumentError, match=r"input 'x': shape \[2, -1\] has a negative"):
        check_shapes(negative, None)


def test_head_fields_match_tritons_model_infer_request() -> None:
    """infer_head.proto mirrors grpc_service.proto: same numbers, names and wire types."""
    from google.protobuf.descriptor import FieldDescriptor

    from hloserve.protos.infer_head_pb2 import InferInputHead, InferRequestHead

    length_delimited = {FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_MESSAGE}
    pairs = [
        (InferRequestHead.DESCRIPTOR, service_pb2.ModelInferRequest.DESCRIPTOR),
        (InferInputHead.DESCRIPTOR, service_pb2.ModelInferRequest.InferInputTensor.DESCRIPTOR),
    ]
    for head, triton in pairs:
        assert {f.number for f in head.fields} == {f.number for f in triton.fields}
        for field in head.fields:
            theirs = triton.fields_by_number[field.number]
            assert field.name == theirs.name, (head.name, field.number)
            if field.type == FieldDescriptor.TYPE_BYTES:  # opaque: theirs must be LEN-encoded
                assert theirs.type in length_delimited, (head.name, field.name)
            else:
                assert field.type == theirs.type, (head.name, field.name)
                assert field.label == theirs.label, (head.name, field.name)


def test_model_ready_metadata_and_config_requests_read_the_same_way() -> None:
    for message in (
        service_pb2.ModelReadyRequest(name="digits", version="2"),
        service_pb2.ModelMetadataRequest(name="digits", version="2"),
        service_pb2.ModelConfigRequest(name="digits", version="2"),
    ):
        head = peek_infer_request(message.SerializeToString())
        assert (head.model_name, head.model_version, head.inputs) == ("digits", "2", ())
