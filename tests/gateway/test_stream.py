"""ModelStreamInfer through the gateway over two real tritonservers serving different models
(issue 27 item 1; hloserve/gateway/streams.py, docs/gateway.md "Data plane").

Worker 0 serves ``affine``, worker 1 ``affine_b`` (the same bundle under another name). One
stream through the gateway carries an unknown model, ``affine``, another unknown model and
``affine_b``: every message gets its own answer with its id, the served ones equal to the
workers' own answers, the unknown ones answered inside the stream with the ``error_message``
and ``id`` a tritonserver gives for the same message on a direct stream in the same run (not
strings written here). tritonclient's ``start_stream`` / ``async_stream_infer`` (the stream
kept open, as Triton's ``simple_grpc_custom_repeat.py`` does) sees the same.
"""

from __future__ import annotations

import queue
import shutil
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from typing import Any

import grpc
import numpy as np
import pytest

from hloserve.gateway.config import GatewayConfig
from hloserve.model_repository_tools.build import build_repository
from hloserve.node.gateway_thread import GatewayThread
from hloserve.node.tritonserver import TritonServer
from tests.conftest import GOLDEN, serving_options

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow, pytest.mark.timeout(600)]
grpcclient = pytest.importorskip("tritonclient.grpc")
service_pb2 = grpcclient.service_pb2
service_pb2_grpc = grpcclient.service_pb2_grpc


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[str], str]]:
    """(worker gRPC endpoints, gateway endpoint): worker 0 serves affine, worker 1 affine_b."""
    root = tmp_path_factory.mktemp("streams")
    with ExitStack() as stack:
        servers = []
        for name in ("affine", "affine_b"):
            bundles = root / f"bundles_{name}"
            bundles.mkdir()
            shutil.copytree(GOLDEN / "affine", bundles / name)
            repo = root / f"repository_{name}"
            build_repository(bundles, repo)
            servers.append(stack.enter_context(TritonServer(serving_options(repo))))
        config = GatewayConfig(workers=tuple(s.urls.grpc for s in servers))
        update = {"listen": "127.0.0.1:0", "admin_port": 0}
        gateway = GatewayThread(config.model_copy(update=update))
        stack.callback(gateway.close)
        yield [s.urls.grpc for s in servers], f"127.0.0.1:{gateway.port}"


def _message(model: str, request_id: str) -> Any:
    x = np.arange(8, dtype=np.float32).reshape(2, 4) * len(request_id)
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="x", datatype="FP32", shape=[2, 4])
    request.raw_input_contents.append(x.tobytes())
    return request


def _raw_stream(address: str, messages: Sequence[Any]) -> dict[str, Any]:
    """id -> answer of one stream carrying ``messages`` (grpc's generated stub)."""
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answers = list(stub.ModelStreamInfer(iter(messages), timeout=60))
    by_id = {a.infer_response.id: a for a in answers}
    assert len(by_id) == len(answers) == len(messages)
    return by_id


def _y(answer: Any) -> np.ndarray:
    result = grpcclient.InferResult(answer.infer_response)
    y: np.ndarray = result.as_numpy("y")
    return y


def test_each_message_of_a_stream_is_routed_by_its_model_with_tritons_errors(
    two_models: tuple[list[str], str],
) -> None:
    workers, gateway = two_models
    names = ["nope", "affine", "nix", "affine_b"]
    messages = [_message(model, f"m{i}") for i, model in enumerate(names)]
    through = _raw_stream(gateway, messages)
    # what the tritonservers answer for the same messages: unknown models on worker 0's own
    # stream, each served model on its own worker's
    direct = _raw_stream(workers[0], [messages[0], messages[1], messages[2]])
    direct |= _raw_stream(workers[1], [messages[3]])
    assert direct["m0"].error_message.startswith("Request for unknown model: 'nope'")
    for i in range(4):
        gateway_answer, triton_answer = through[f"m{i}"], direct[f"m{i}"]
        assert gateway_answer.error_message == triton_answer.error_message, i
        assert gateway_answer.infer_response.id == triton_answer.infer_response.id == f"m{i}"
        if i in (1, 3):
            assert gateway_answer.infer_response.model_name == names[i]
            np.testing.assert_array_equal(_y(gateway_answer), _y(triton_answer))
        else:  # Triton's in-stream error: the id only
            assert gateway_answer == triton_answer


def test_tritonclient_start_stream_gets_every_answer_and_the_stream_stays_open(
    two_models: tuple[list[str], str],
) -> None:
    """tritonclient's callback stream (open until stop_stream): the unknown model's error in
    Triton's words among the answers, later messages to both workers still answered."""
    workers, gateway = two_models

    def answers(address: str, models: Sequence[str]) -> list[tuple[str, str]]:
        client = grpcclient.InferenceServerClient(address)
        got: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        try:
            for i, model in enumerate(models):
                x = grpcclient.InferInput("x", [1, 4], "FP32")
                x.set_data_from_numpy(np.ones((1, 4), np.float32))
                client.async_stream_infer(model, [x], request_id=f"t{i}")
            out = []
            for _ in models:  # every message answered while the stream is still open
                result, error = got.get(timeout=30)
                out.append(("", str(error)) if error else (result.get_response().id, ""))
            return sorted(out)
        finally:
            client.stop_stream()
            client.close()

    through = answers(gateway, ["nope", "affine", "affine_b", "affine"])
    direct = answers(workers[0], ["nope"])
    assert through == [direct[0], ("t1", ""), ("t2", ""), ("t3", "")]
    assert "Request for unknown model: 'nope' is not found" in direct[0][1]
