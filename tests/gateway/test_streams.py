"""ModelStreamInfer through the gateway (``run_gateway``: HAProxy and the Python servicer) over
fake gRPC workers on loopback: every message routed by its own model name, Triton's in-stream
errors (hloserve/gateway/streams.py; docs/gateway.md, "Data plane").

The client is grpc's generated stub of ``inference.GRPCInferenceService`` (an in-stream error's
``infer_response.id`` is not visible through tritonclient's callback) and tritonclient's
``grpc.aio`` ``stream_infer``. The same stream against two real tritonservers, its errors
compared with a tritonserver's own, is in tests/gateway/test_stream.py.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from hloserve.gateway.dataplane import CONTROL_BACKEND
from tests.gateway.test_admission import _scrape
from tests.gateway.test_proxy import FakeWorker, Gateway, gateway

pytestmark = pytest.mark.skipif(
    subprocess.run(["sh", "-c", "command -v haproxy || test -x /usr/sbin/haproxy"]).returncode,
    reason="HAProxy is not installed (apt-get install haproxy; scripts/env.sh does it)",
)


def run(test: Any) -> None:
    asyncio.run(asyncio.wait_for(test(), timeout=60))


def _message(model: str, request_id: str, rows: int = 1, datatype: str = "FP32") -> Any:
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="IN", datatype=datatype, shape=[rows, 4])
    if datatype == "BYTES":
        request.raw_input_contents.append(b"\x01\x00\x00\x00x" * rows)
    else:
        request.raw_input_contents.append(np.full((rows, 4), len(request_id), np.float32).tobytes())
    return request


async def _stream(g: Gateway, messages: Sequence[Any], delay_s: float = 0.0) -> list[Any]:
    """Every answer of one stream carrying ``messages`` (in arrival order); the stream is
    half-closed after the last one."""

    async def requests() -> AsyncIterator[Any]:
        await asyncio.sleep(delay_s)
        for message in messages:
            yield message

    async with grpc.aio.insecure_channel(f"127.0.0.1:{g.port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        return [answer async for answer in stub.ModelStreamInfer(requests())]


def _by_id(answers: list[Any]) -> dict[str, tuple[str, str]]:
    """id -> (error_message, the worker that answered or "")."""
    out = {}
    for a in answers:
        worker = a.infer_response.parameters["worker"].string_param
        out[a.infer_response.id] = (a.error_message, worker)
    return out


def _sessions(text: str, proxy: str) -> int:
    """Requests HAProxy sent to ``proxy``'s servers so far (its exporter's counters)."""
    pattern = rf'^haproxy_server_sessions_total{{proxy="{re.escape(proxy)}",server="[^"]+"}} (\d+)'
    return sum(int(n) for n in re.findall(pattern, text, re.MULTILINE))


def test_each_message_goes_to_a_worker_of_its_model_and_unknown_ones_answer_in_the_stream() -> None:
    """The issue's four messages on one stream: an unknown model, a model of w0, an unknown
    model, a model only w1 serves; each gets its own answer with its id, the unknown ones
    Triton's NOT_FOUND text inside the stream, which goes on."""

    async def body() -> None:
        w0, w1 = FakeWorker("w0", models=("echo",)), FakeWorker("w1", models=("other",))
        async with gateway(w0, w1) as g:
            before = _sessions(await asyncio.to_thread(_scrape, g.admin), CONTROL_BACKEND)
            messages = [_message("nope", "a"), _message("echo", "b"), _message("nix", "c")]
            answers = await _stream(g, [*messages, _message("other", "d")])
            assert len(answers) == 4
            assert _by_id(answers) == {
                "a": ("Request for unknown model: 'nope' is not found", ""),
                "b": ("", "w0"),
                "c": ("Request for unknown model: 'nix' is not found", ""),
                "d": ("", "w1"),
            }
            assert (w0.served, w1.served) == (["b"], ["d"])
            for a in answers:
                if not a.error_message:
                    raw = a.infer_response.raw_output_contents[0]
                    expected = np.full((1, 4), 1, np.float32).tobytes()  # len(id) == 1
                    assert raw == expected
            text = await asyncio.to_thread(_scrape, g.admin)
            assert _sessions(text, CONTROL_BACKEND) == before + 1  # HAProxy routed none
            assert _sessions(text, "m_echo") == _sessions(text, "m_other") == 0

    run(body)


def test_a_models_messages_stay_on_one_replica_and_streams_rotate() -> None:
    """A model on both workers: every message of one stream on one replica (a sequence's
    messages must), successive streams on the next replica."""

    async def body() -> None:
        async with gateway(FakeWorker("w0"), FakeWorker("w1")) as g:
            seen = []
            for s in range(2):
                answers = await _stream(g, [_message("echo", f"{s}-{i}") for i in range(3)])
                assert sorted(_by_id(answers)) == [f"{s}-{i}" for i in range(3)]
                workers = {w for error, w in _by_id(answers).values() if not error}
                assert len(workers) == 1
                seen += workers
            assert sorted(seen) == ["w0", "w1"]

    run(body)


def test_a_stream_whose_first_message_comes_late_is_answered() -> None:
    """tritonclient's start_stream opens a stream well before its first message."""

    async def body() -> None:
        async with gateway(FakeWorker("w0")) as g:
            answers = await _stream(g, [_message("echo", "x"), _message("echo", "y")], 1.5)
            assert _by_id(answers) == {"x": ("", "w0"), "y": ("", "w0")}

    run(body)


def test_shapes_no_model_can_run_are_refused_in_the_stream_and_never_forwarded() -> None:
    """0 BYTES rows crashed tritonserver's Python backend: such a message is answered
    INVALID_ARGUMENT's text inside the stream and the next one is still served."""

    async def body() -> None:
        worker = FakeWorker("w0")  # max_batch_size 4
        async with gateway(worker) as g:
            messages = [
                _message("echo", "b0", 1, "BYTES"),
                _message("echo", "b1", 0, "BYTES"),
                _message("echo", "b2", 5),
                _message("echo", "b3", 1, "BYTES"),
            ]
            by_id = _by_id(await _stream(g, messages))
            assert by_id["b0"] == by_id["b3"] == ("", "w0")
            assert "input 'IN': batch size 0" in by_id["b1"][0]
            assert "exceeds the model's max_batch_size 4" in by_id["b2"][0]
            assert worker.served == ["b0", "b3"]

    run(body)


def test_a_worker_failing_mid_stream_ends_the_stream_with_its_status() -> None:
    """An upstream stream that ends with an error ends the client's stream with that status
    (a message it held may have run: no failover)."""

    async def body() -> None:
        class Failing(FakeWorker):
            async def ModelStreamInfer(self, requests: Any, context: Any) -> Any:
                async for request in requests:
                    self.served.append(request.id)
                    await context.abort(grpc.StatusCode.INTERNAL, f"{self.name} broke")
                yield service_pb2.ModelStreamInferResponse()  # never reached

        async with gateway(Failing("w0")) as g:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _stream(g, [_message("echo", "x")])
            assert info.value.code() == grpc.StatusCode.INTERNAL
            assert info.value.details() == "w0 broke"

    run(body)
