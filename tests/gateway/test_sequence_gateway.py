"""A stateful model through the gateway with two real tritonservers: a sequence stays on one
worker (issue 30).

HAProxy cannot hash on the correlation ID, so discovery routes a model whose config has
``sequence_batching`` to one replica; every step of interleaved sequences then reaches the
runtime holding their state, and the other worker serves none of them. perf_analyzer in
sequence mode (``--sequence-length``) drives the example bundle (examples/sequence, Triton's
``simple_sequence``) through the gateway with zero errors.
"""

from __future__ import annotations

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
from tests.accumulator_bundle import export_accumulator, infer_step
from tests.conftest import import_example, serving_options

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow]

grpcclient = pytest.importorskip("tritonclient.grpc")


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[list[TritonServer], Any, str]]:
    root = tmp_path_factory.mktemp("sequence_gateway")
    export_accumulator(root / "bundles" / "accumulator")
    import_example("sequence", "export").export_sequence(root / "bundles")
    build_repository(root / "bundles", root / "repository")
    with ExitStack() as stack:
        servers = [
            stack.enter_context(TritonServer(serving_options(root / "repository")))
            for _ in range(2)
        ]
        config = GatewayConfig(workers=tuple(s.urls.grpc for s in servers))
        update = {"listen": "127.0.0.1:0", "admin_port": 0}
        gateway = GatewayThread(config.model_copy(update=update))
        stack.callback(gateway.close)
        address = f"127.0.0.1:{gateway.port}"
        client = grpcclient.InferenceServerClient(address)
        deadline = time.monotonic() + 60
        while not all(client.is_model_ready(m) for m in ("accumulator", "simple_sequence")):
            assert time.monotonic() < deadline  # discovery has seen the workers
            time.sleep(0.2)
        yield servers, client, address


def _successes(server: TritonServer, model: str = "accumulator") -> int:
    stats = grpcclient.InferenceServerClient(server.urls.grpc).get_inference_statistics(model)
    count: int = stats.model_stats[0].inference_stats.success.count
    return count


def test_every_step_of_every_sequence_reaches_one_worker(
    fleet: tuple[list[TritonServer], Any, str],
) -> None:
    servers, client, _ = fleet
    ids = [31, 32, 33]
    steps = 4
    for i in ids:
        assert infer_step(client, i, float(i), start=True) == float(i)
    for step in range(1, steps):
        for i in ids:  # interleaved: a step of each sequence in turn
            assert infer_step(client, i, 1.0, end=step == steps - 1) == i + step
    expected = len(ids) * steps
    deadline = time.monotonic() + 10
    counts = [0, 0]
    while time.monotonic() < deadline:  # Triton counts a success after it answers: poll
        counts = [_successes(s) for s in servers]
        if sum(counts) == expected:
            break
        time.sleep(0.1)
    assert sorted(counts) == [0, expected], counts


def test_perf_analyzer_in_sequence_mode_through_the_gateway_has_zero_errors(
    fleet: tuple[list[TritonServer], Any, str],
) -> None:
    from hloserve.node.perf_analyzer import run_perf_analyzer

    servers, _, address = fleet
    before = [_successes(s, "simple_sequence") for s in servers]
    results, output = run_perf_analyzer(
        "simple_sequence",
        address,  # the gateway
        concurrency=(4,),  # 4 live sequences at a time
        request_count=200,  # answers are the point, not a stable rate
        extra_args=["--sequence-length", "8", "--sequence-id-range", "1000:100000"],
    )
    print(output[-1500:])
    (result,) = results
    assert result.throughput > 0, output
    assert "error" not in output.lower(), output
    after = [_successes(s, "simple_sequence") for s in servers]
    served = [a - b for a, b in zip(after, before, strict=True)]
    assert min(served) == 0 and max(served) > 0, served  # all of it on one worker


def test_interleaved_sequences_over_one_stream_through_the_gateway(
    fleet: tuple[list[TritonServer], Any, str],
) -> None:
    """Triton's stream variant (``simple_grpc_sequence_stream_infer_client.py``): two
    sequences' steps interleaved on one bidirectional stream, answered in order; the second
    has a string ID (a UUID), as the example's third sequence."""
    import queue
    import uuid

    _, client, _ = fleet
    key = str(uuid.uuid4())
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        sent = []
        for step, value in enumerate([1, 2, 3, 4]):
            for sequence, scale in ((41, 1), (key, -1)):
                x = np.full((1, 1), scale * value, np.int32)
                tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                tensor.set_data_from_numpy(x)
                client.async_stream_infer(
                    "simple_sequence",
                    [tensor],
                    request_id=f"{sequence}-{step}",
                    sequence_id=sequence,
                    sequence_start=step == 0,
                    sequence_end=step == 3,
                )
                sent.append(f"{sequence}-{step}")
        got = {}
        for _ in sent:
            result, error = answers.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            got[response.id] = int(result.as_numpy("OUTPUT")[0, 0])
    finally:
        client.stop_stream()
    # Triton's simple_sequence: each sequence's START is its input plus 1, later steps the input
    assert [got[f"41-{s}"] for s in range(4)] == [2, 2, 3, 4]
    assert [got[f"{key}-{s}"] for s in range(4)] == [0, -2, -3, -4]
