"""Issue 5's done-when checks on real tritonservers: the gateway is one more tritonserver.

One fleet for the module (2 cores): a repository with ``digits`` (trained, exported),
``affine`` (golden) and ``big`` (20 MiB in and out), built once, served by two workers through
:class:`hloserve.node.supervisor.Node` (the code ``hloserve serve --workers`` runs). Worker 0
loads every model; worker 1 (explicit model control) loads ``affine`` and ``big`` only, so
``digits`` has one replica and the others two. Unchanged tritonclient and perf_analyzer talk
to the gateway; the last test kills worker 0 under a bounded load loop and starts it again.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.gateway.config import GatewayConfig
from hloserve.model_repository_tools.build import build_repository
from hloserve.node.plan import NodePlan
from hloserve.node.serve_options import ServeOptions, server_options
from hloserve.node.supervisor import Node
from hloserve.ports import free_ports
from tests.conftest import BIG_ITEMS, serving_bundles

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow]

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402


@pytest.fixture(scope="module")
def fleet(digits_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    bundles = serving_bundles(tmp_path_factory.mktemp("e2e") / "bundles", digits_bundle)
    repo = bundles.parent / "repository"
    build_repository(bundles, repo, front_instances=1)
    workers = []
    for load in ((), ("affine", "big")):
        http, grpc, metrics = free_ports(3)
        options = ServeOptions(
            path=repo,
            http_port=http,
            grpc_port=grpc,
            metrics_port=metrics,
            model_control_mode="explicit" if load else "none",
            load_models=load,
        )
        workers.append(dataclasses.replace(server_options(options, repo), startup_timeout_s=240))
    listen, http_listen = free_ports(2)
    config = GatewayConfig(
        listen=f"127.0.0.1:{listen}",
        http_listen=f"127.0.0.1:{http_listen}",
        admin_port=0,
        workers=tuple(f"127.0.0.1:{w.grpc_port}" for w in workers),
        worker_http=tuple(f"127.0.0.1:{w.http_port}" for w in workers),
        health={"interval_seconds": 0.5, "failure_threshold": 1},
        discovery={"poll_interval_seconds": 2.0},
    )
    with Node(NodePlan(tuple(workers), config)) as running:
        yield running


@pytest.fixture(scope="module")
def gateway(fleet: Node) -> Any:
    assert fleet.gateway is not None
    return grpcclient.InferenceServerClient(fleet.gateway.address)


def _direct(fleet: Node, worker: int) -> Any:
    return grpcclient.InferenceServerClient(fleet.servers[worker].urls.grpc)


def _infer(client: Any, model: str, name: str, output: str, x: np.ndarray) -> np.ndarray:
    tensor = grpcclient.InferInput(name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(np.ascontiguousarray(x))
    result: np.ndarray = client.infer(model, [tensor]).as_numpy(output)
    return result


def _digits(client: Any, images: np.ndarray) -> np.ndarray:
    return _infer(client, "digits", "image", "logits", images)


def _affine(client: Any, x: np.ndarray) -> np.ndarray:
    return _infer(client, "affine", "x", "y", x)


def test_digits_answers_through_the_gateway_equal_direct(
    fleet: Node, gateway: Any, digits_model: Any
) -> None:
    images = digits_model.load_split()[2][:40].astype(np.float32)
    direct = _direct(fleet, 0)
    for batch in (1, 8, 32):
        for start in range(0, 40 - batch + 1, batch):
            chunk = images[start : start + batch]
            np.testing.assert_array_equal(_digits(gateway, chunk), _digits(direct, chunk))
    assert gateway.is_server_ready() and gateway.is_model_ready("digits")
    assert gateway.get_model_config("digits").config.max_batch_size == 32


def test_digits_over_kserve_http_equal_direct(fleet: Node, digits_model: Any) -> None:
    import tritonclient.http as httpclient

    assert fleet.gateway is not None and fleet.gateway.http_address is not None
    images = digits_model.load_split()[2][:16].astype(np.float32)
    answers = []
    for url in (fleet.gateway.http_address, fleet.servers[0].urls.http):
        client = httpclient.InferenceServerClient(url)
        tensor = httpclient.InferInput("image", list(images.shape), "FP32")
        tensor.set_data_from_numpy(images, binary_data=True)
        answers.append(client.infer("digits", [tensor]).as_numpy("logits"))
    np.testing.assert_array_equal(answers[0], answers[1])


def test_a_20_mib_tensor_round_trips_through_the_gateway(gateway: Any) -> None:
    x = np.random.default_rng(0).standard_normal((1, BIG_ITEMS)).astype(np.float32)
    for _ in range(2):  # round robin: both workers, every hop raised to 2 GiB
        y = _infer(gateway, "big", "x", "y", x)
        assert y.nbytes == 20 * 1024 * 1024 and np.array_equal(y, x * 2)


def test_perf_analyzer_through_the_gateway_has_zero_errors(fleet: Node) -> None:
    from hloserve.node.perf_analyzer import run_perf_analyzer

    assert fleet.gateway is not None and fleet.gateway.http_address is not None
    for protocol, url in (("grpc", fleet.gateway.address), ("http", fleet.gateway.http_address)):
        results, output = run_perf_analyzer(
            "affine", url, protocol=protocol, concurrency=(2,), request_count=200
        )
        assert [r.concurrency for r in results] == [2], output
        assert results[0].throughput > 0, output
        assert "error" not in output.lower(), output


def test_killing_a_worker_under_load(fleet: Node, gateway: Any, digits_model: Any) -> None:
    """Runs last: affine (2 replicas) keeps serving; digits (1 replica, on worker 0) answers
    UNAVAILABLE while worker 0 is down and serves again once it is back.

    The one load thread's request that worker 0 may hold when it is killed fails UNAVAILABLE
    and is not re-sent (query-of-death protection, docs/gateway.md "Proxy"); every other
    affine request succeeds."""
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    expected = _affine(_direct(fleet, 1), x)
    image = digits_model.load_split()[2][:1].astype(np.float32)
    expected_digits = _digits(_direct(fleet, 0), image)
    assert fleet.gateway is not None
    address = fleet.gateway.address
    failures: list[BaseException] = []
    served = [0]
    done = threading.Event()

    def load() -> None:  # bounded: 4000 requests or 120 s, ends when told
        client = grpcclient.InferenceServerClient(address)
        deadline = time.monotonic() + 120
        for _ in range(4000):
            if done.is_set() or time.monotonic() > deadline:
                break
            try:
                np.testing.assert_array_equal(_affine(client, x), expected)
                served[0] += 1
            except BaseException as exc:  # every failure is reported below
                failures.append(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    try:
        while served[0] < 20 and thread.is_alive():  # bounded by the loop's own limits
            time.sleep(0.05)
        fleet.kill_worker(0)
        with pytest.raises(InferenceServerException) as down:
            _digits(gateway, image)
        assert down.value.status() == "StatusCode.UNAVAILABLE" and "digits" in str(down.value)
        during = served[0]
        while served[0] < during + 20 and thread.is_alive():
            time.sleep(0.05)
        fleet.restart_worker(0, timeout_s=240)
        deadline = time.monotonic() + 30
        while True:  # the health probes bring worker 0 back (bounded: 30 s)
            try:
                np.testing.assert_array_equal(_digits(gateway, image), expected_digits)
                break
            except InferenceServerException as exc:
                assert exc.status() == "StatusCode.UNAVAILABLE", exc
                assert time.monotonic() < deadline, f"digits did not come back: {exc}"
                time.sleep(0.25)
    finally:
        done.set()
        thread.join(60)
    assert len(failures) <= 1, failures[:3]
    for failure in failures:  # the request worker 0 held when it was killed, if any
        assert isinstance(failure, InferenceServerException), failure
        assert failure.status() == "StatusCode.UNAVAILABLE", failure
        # the Python path names it; HAProxy (the default data plane) resets the stream
        held = ("failed while it held the request", "Stream removed")
        assert any(text in str(failure) for text in held), failure
    assert served[0] >= during + 20
