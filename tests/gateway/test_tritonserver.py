"""The gateway in front of two real tritonservers serving hloserve bundles (issue 5).

tritonclient's stock gRPC client talks to the gateway exactly as to one tritonserver: answers
equal the direct ones, requests spread over both workers, and a stopped worker's traffic fails
over to the other.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import numpy as np
import pytest

from hloserve.gateway.config import GatewayConfig
from hloserve.model_repository_tools.build import build_repository
from hloserve.node.gateway_thread import GatewayThread
from hloserve.node.tritonserver import TritonServer
from tests.conftest import GOLDEN, serving_options

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow]

grpcclient = pytest.importorskip("tritonclient.grpc")


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[list[TritonServer], Any, str]]:
    bundles = tmp_path_factory.mktemp("gateway") / "bundles"
    bundles.mkdir()
    shutil.copytree(GOLDEN / "affine", bundles / "affine")
    repo = bundles.parent / "repository"
    build_repository(bundles, repo)
    with ExitStack() as stack:
        servers = [stack.enter_context(TritonServer(serving_options(repo))) for _ in range(2)]
        config = GatewayConfig(
            workers=tuple(s.urls.grpc for s in servers),
            worker_http=tuple(s.urls.http for s in servers),
        )
        update = {"listen": "127.0.0.1:0", "admin_port": 0, "http_listen": "127.0.0.1:0"}
        gateway = GatewayThread(config.model_copy(update=update))
        stack.callback(gateway.close)
        assert gateway.http_address is not None
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{gateway.port}")
        yield servers, client, gateway.http_address


def _successes(server: TritonServer, model: str) -> int:
    stats = grpcclient.InferenceServerClient(server.urls.grpc).get_inference_statistics(model)
    count: int = stats.model_stats[0].inference_stats.success.count
    return count


def _affine(client: Any, x: np.ndarray) -> np.ndarray:
    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result: np.ndarray = client.infer("affine", [tensor]).as_numpy("y")
    return result


def test_answers_equal_direct_and_spread_over_workers(
    fleet: tuple[list[TritonServer], Any, str],
) -> None:
    servers, gateway, _ = fleet
    assert gateway.is_server_live() and gateway.is_server_ready()
    assert gateway.is_model_ready("affine")
    assert gateway.get_model_config("affine").config.max_batch_size > 0
    direct = grpcclient.InferenceServerClient(servers[0].urls.grpc)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    expected = _affine(direct, x)
    for _ in range(6):
        np.testing.assert_array_equal(_affine(gateway, x), expected)
    # Triton counts a success after the response is sent, so the last one may lag: poll
    # (bounded) until all 7 are counted, then check the split.
    deadline = time.monotonic() + 10.0
    while True:
        counts = [_successes(server, "affine") for server in servers]
        if sum(counts) >= 7 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert counts == [4, 3]  # round robin: 3 each, plus the direct one on worker 0


def test_impossible_batch_sizes_are_refused_by_the_gateway(
    fleet: tuple[list[TritonServer], Any, str],
) -> None:
    """0 rows or more than the worker-reported max_batch_size: INVALID_ARGUMENT and no worker
    counts a success. HAProxy forwards non-BYTES requests whatever their shape (its protobuf
    converter does not read the packed ``shape``), so Triton's own checks answer there."""
    from tritonclient.utils import InferenceServerException

    servers, gateway, _ = fleet
    limit = gateway.get_model_config("affine").config.max_batch_size

    def counts() -> list[tuple[int, int]]:  # (successes, failures) per worker
        stats = [
            grpcclient.InferenceServerClient(server.urls.grpc)
            .get_inference_statistics("affine")
            .model_stats[0]
            .inference_stats
            for server in servers
        ]
        return [(s.success.count, s.fail.count) for s in stats]

    before = [success for success, _ in counts()]
    for rows, match in (
        (0, "byte size mismatch for input 'x' for model 'affine'"),
        (limit + 1, f"batch-size must be <= {limit}"),
    ):
        tensor = grpcclient.InferInput("x", [rows, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((rows, 4), np.float32))
        with pytest.raises(InferenceServerException, match=match) as info:
            gateway.infer("affine", [tensor])
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert [success for success, _ in counts()] == before


def test_kserve_http_is_routed_by_the_model_in_the_path(
    fleet: tuple[list[TritonServer], Any, str],
) -> None:
    """``/v2/models/{name}[/versions/{v}]/infer`` through HAProxy answers as the worker does;
    metadata and config are the worker's own JSON; health and unknown models answered."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    servers, _, http = fleet
    gateway = httpclient.InferenceServerClient(http)
    direct = httpclient.InferenceServerClient(servers[0].urls.http)
    assert gateway.is_server_live() and gateway.is_server_ready()
    assert gateway.is_model_ready("affine")
    assert gateway.get_model_metadata("affine") == direct.get_model_metadata("affine")
    assert gateway.get_model_config("affine") == direct.get_model_config("affine")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    for version in ("", "1"):
        answers = []
        for client in (gateway, direct):
            tensor = httpclient.InferInput("x", [2, 4], "FP32")
            tensor.set_data_from_numpy(x, binary_data=True)
            answers.append(client.infer("affine", [tensor], model_version=version).as_numpy("y"))
        np.testing.assert_array_equal(answers[0], answers[1])
    with pytest.raises(InferenceServerException, match="nope"):
        gateway.get_model_metadata("nope")


def test_system_shared_memory_end_to_end_through_the_gateway(
    fleet: tuple[list[TritonServer], Any, str],
) -> None:
    """Regions registered through the gateway reach every worker; requests whose input and
    output live in them (HAProxy routes them to either worker) answer as direct calls do."""
    from multiprocessing import shared_memory

    servers, gateway, _ = fleet
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    expected = _affine(grpcclient.InferenceServerClient(servers[0].urls.grpc), x)
    sizes = {"in": x.nbytes, "out": expected.nbytes}
    regions = {
        n: shared_memory.SharedMemory(f"hloserve-gw-{os.getpid()}-{n}", create=True, size=size)
        for n, size in sizes.items()
    }
    try:
        np.ndarray(x.shape, np.float32, buffer=regions["in"].buf)[:] = x
        for n, region in regions.items():  # POSIX key: "/" + the name in /dev/shm
            gateway.register_system_shared_memory(f"gw_{n}", f"/{region.name}", sizes[n])
        for server in servers:  # fanned out: every worker lists both regions
            status = grpcclient.InferenceServerClient(server.urls.grpc)
            assert {"gw_in", "gw_out"} <= set(status.get_system_shared_memory_status().regions)
        for _ in range(4):  # round robin over both workers
            tensor = grpcclient.InferInput("x", [2, 4], "FP32")
            tensor.set_shared_memory("gw_in", sizes["in"])
            output = grpcclient.InferRequestedOutput("y")
            output.set_shared_memory("gw_out", sizes["out"])
            gateway.infer("affine", [tensor], outputs=[output])
            y = np.ndarray(expected.shape, np.float32, buffer=regions["out"].buf).copy()
            np.testing.assert_array_equal(y, expected)
        gateway.unregister_system_shared_memory()
        for server in servers:
            status = grpcclient.InferenceServerClient(server.urls.grpc)
            assert not status.get_system_shared_memory_status().regions
    finally:
        for region in regions.values():
            region.close()
            region.unlink()


def _refusal(client: Any, model: str, tensor: Any, version: str = "") -> tuple[str, str]:
    """(status, message) of the InferenceServerException ``client.infer`` raises."""
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as info:
        client.infer(model, [tensor], model_version=version)
    return str(info.value.status()), str(info.value.message())


def test_the_gateways_own_errors_are_in_tritons_words(
    fleet: tuple[list[TritonServer], Any, str],
) -> None:
    """An unknown model, an unknown version (gRPC and KServe HTTP) and a model unloaded on
    every worker (gRPC): the gateway answers with the status and text a real tritonserver
    gives for the same condition, read from one of the workers in this run (the unloaded
    model's text is followed by the workers' reasons). Runs before the stopped worker."""
    import tritonclient.http as httpclient

    from hloserve.model_control import grpc_metadata, local_key

    servers, gateway, http = fleet
    direct = grpcclient.InferenceServerClient(servers[0].urls.grpc)
    clients = {
        "grpc": (gateway, direct),
        "http": (
            httpclient.InferenceServerClient(http),
            httpclient.InferenceServerClient(servers[0].urls.http),
        ),
    }
    modules = {"grpc": grpcclient, "http": httpclient}
    for protocol, (through, worker) in clients.items():
        tensor = modules[protocol].InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        for model, version in (("nope", ""), ("affine", "7")):
            triton = _refusal(worker, model, tensor, version)
            assert _refusal(through, model, tensor, version) == triton, (protocol, model)
        assert _refusal(through, "nope", tensor)[1] == (
            "Request for unknown model: 'nope' is not found"
        )
    key = dict(grpc_metadata(local_key()))
    tensor = grpcclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    gateway.unload_model("affine", headers=key)  # every worker; the gateway rediscovers
    try:
        triton = _refusal(direct, "affine", tensor)
        assert triton == (
            "StatusCode.NOT_FOUND",
            "Request for unknown model: 'affine' has no available versions",
        )
        deadline = time.monotonic() + 10.0
        while True:  # a worker answers until HAProxy's map drops the model (0.5 s sync)
            status, message = _refusal(gateway, "affine", tensor)
            assert status == triton[0] and message.startswith(triton[1]), message
            if message != triton[1] or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert message.startswith(triton[1] + " (worker "), message  # the gateway's own
    finally:
        gateway.load_model("affine", headers=key)
        deadline = time.monotonic() + 60.0
        while not gateway.is_model_ready("affine") and time.monotonic() < deadline:
            time.sleep(0.2)
    x = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(_affine(gateway, x), _affine(direct, x))  # served again


def test_a_stopped_worker_fails_over(fleet: tuple[list[TritonServer], Any, str]) -> None:
    """With one worker stopped every request still succeeds (runs last: it stops one)."""
    servers, gateway, _ = fleet
    x = np.ones((1, 4), np.float32)
    expected = _affine(grpcclient.InferenceServerClient(servers[0].urls.grpc), x)
    servers[1].stop()
    for _ in range(6):  # bounded: every request must succeed
        np.testing.assert_array_equal(_affine(gateway, x), expected)
    assert gateway.is_server_ready()  # one ready worker is enough
