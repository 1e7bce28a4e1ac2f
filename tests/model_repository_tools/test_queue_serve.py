"""Queue bounds and deadlines of front models, answered by a real tritonserver (issue 28).

The repository is built with two front instances per model (each front then gets its default
queue bound) but for ``slow``: ``tiny`` with a ``preprocess`` hook that sleeps :data:`HOOK_S`
seconds, so its two front instances stay busy while more requests arrive, and its queue is
bounded to one request (``QueueOptions(per_model={"slow": 1})``): under a burst Triton refuses
the overflow itself, and a request whose KServe ``timeout`` passes in the queue is dropped
there.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve import names
from hloserve.model_repository_tools.build import build_repository
from hloserve.model_repository_tools.build_options import QueueOptions
from hloserve.model_repository_tools.config import parse_config
from hloserve.node.tritonserver import TritonServer
from tests.conftest import TINY_PARAMS, serving_options

pytestmark = [pytest.mark.tritonserver]

grpcclient = pytest.importorskip("tritonclient.grpc")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException

#: Seconds the slow bundle's hook sleeps per request.
HOOK_S = 0.6
HOOK = f"import time\n\n\ndef preprocess(inputs):\n    time.sleep({HOOK_S})\n    return inputs\n"


def make_slow(tiny_bundle_src: Path, out: Path, edit: Callable[..., None]) -> Path:
    """``tiny`` with a sleeping ``preprocess`` hook (format 2) at ``out``."""
    shutil.copytree(tiny_bundle_src, out)
    (out / "model.py").write_text(HOOK)
    edit(out, lambda data: data.update(format_version=2))
    return out


def export_heavy(out: Path) -> Path:
    """A bundle whose one execution keeps the runtime busy for seconds on a CPU
    (1200000 dependent 256x256 steps: 3 s on an idle 2-core machine, more when loaded):
    ``y = f(x)``, f32 ``(1, 256)``."""
    import jax
    import jax.numpy as jnp

    from hloserve.export import OutputSpec, TensorSpec, export_bundle

    def heavy(_params: Any, x: Any) -> Any:
        step = jnp.eye(256, dtype=jnp.float32) * 1.0001
        return jax.lax.fori_loop(0, 1_200_000, lambda _, y: jnp.tanh(y @ step), x)

    x = TensorSpec(name="x", dtype="f32", shape="nk", dims={"k": 256})
    export_bundle(heavy, {}, [x], [OutputSpec("y", "nk")], [1], out)
    return out


@pytest.fixture(scope="module")
def server(
    tiny_bundle_src: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonServer]:
    import yaml

    def edit(bundle: Path, change: Callable[[dict[str, Any]], None]) -> None:
        data = yaml.safe_load((bundle / "manifest.yaml").read_text())
        change(data)
        (bundle / "manifest.yaml").write_text(yaml.safe_dump(data, sort_keys=False))

    src = tmp_path_factory.mktemp("queue") / "src"
    src.mkdir()
    make_slow(tiny_bundle_src, src / "slow", edit)
    export_heavy(src / "heavy")
    shutil.copytree(tiny_bundle_src, src / "tiny")
    repo = src.parent / "repository"
    build_repository(src, repo, front_instances=2, queue=QueueOptions(per_model={"slow": 1}))
    with TritonServer(serving_options(repo, src.parent / "server.log")) as srv:
        yield srv


@pytest.fixture(scope="module")
def grpc(server: TritonServer) -> Any:
    return grpcclient.InferenceServerClient(server.urls.grpc)


def _infer(client: Any, x: np.ndarray, **kwargs: Any) -> Any:
    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer("slow", [tensor], client_timeout=30.0, **kwargs)


def _expected(x: np.ndarray) -> np.ndarray:
    return x @ TINY_PARAMS["w"] + TINY_PARAMS["b"]


def test_every_front_gets_a_bounded_queue_and_timeouts(server: TritonServer) -> None:
    repo = server.options.model_repository
    slow = parse_config(repo / "slow" / "config.pbtxt").dynamic_batching.default_queue_policy
    assert slow.max_queue_size == 1
    assert slow.allow_timeout_override and slow.default_timeout_microseconds > 0
    tiny = parse_config(repo / "tiny" / "config.pbtxt")
    assert tiny.instance_group[0].count == names.QUEUE_POLICY_MIN_INSTANCES == 2  # as built
    policy = tiny.dynamic_batching.default_queue_policy
    # the default bound, max(128, 16 x the largest batch 4), and the queue deadlines
    assert (policy.max_queue_size, policy.allow_timeout_override) == (128, True)
    assert policy.default_timeout_microseconds == names.QUEUE_TIMEOUT_US


def test_a_burst_past_the_bound_is_refused_by_triton(grpc: Any) -> None:
    xs = [np.full((1, 4), i, np.float32) for i in range(10)]

    def call(x: np.ndarray) -> Any:
        try:
            return _infer(grpc, x)
        except InferenceServerException as exc:
            return exc

    with ThreadPoolExecutor(len(xs)) as pool:
        results = list(pool.map(call, xs))
    refused = [r for r in results if isinstance(r, InferenceServerException)]
    assert refused, "no request was refused"
    for error in refused:
        assert error.status() == "StatusCode.UNAVAILABLE"
        # Triton's own text (core r24.10 PolicyQueue::Enqueue, with InferenceRequest::LogRequest)
        assert re.fullmatch(r"\[request id: [^\]]+\] Exceeds maximum queue size", error.message())
    answered = [(x, r) for x, r in zip(xs, results, strict=True) if r not in refused]
    assert answered, "every request was refused"
    for x, result in answered:
        np.testing.assert_allclose(result.as_numpy("y"), _expected(x), rtol=1e-6)


def test_a_request_whose_timeout_passes_in_the_queue_is_dropped(grpc: Any) -> None:
    busy = [threading.Thread(target=_infer, args=(grpc, np.ones((1, 4), np.float32))) for _ in "ab"]
    for thread in busy:
        thread.start()
        time.sleep(HOOK_S / 8)  # the batcher hands it to an instance before the next arrives
    # both instances are executing: the next request waits in the queue
    started = time.monotonic()
    try:
        with pytest.raises(InferenceServerException) as caught:
            _infer(grpc, np.zeros((1, 4), np.float32), timeout=100_000)  # 100 ms, microseconds
    finally:
        for thread in busy:
            thread.join(timeout=30)
    assert time.monotonic() - started < HOOK_S * 2
    assert caught.value.status() == "StatusCode.UNAVAILABLE", caught.value
    assert "Request timeout expired" in caught.value.message()
    # without a timeout the same request waits its turn and runs
    x = np.full((1, 4), 2, np.float32)
    np.testing.assert_allclose(_infer(grpc, x).as_numpy("y"), _expected(x), rtol=1e-6)


def _executions(server: TritonServer, model: str = "slow", **labels: str) -> float:
    """hloserve_executions_total (or another runtime counter, ``name=``) of ``model``, once the
    runtime has published its counts (once a second, docs/serving.md)."""
    from prometheus_client.parser import text_string_to_metric_families

    name = labels.pop("name", "hloserve_executions_total")
    time.sleep(1.5)
    with urllib.request.urlopen(f"http://{server.urls.metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
        and sample.labels.get("model") == model
        and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def test_a_request_cancelled_before_it_is_sent_never_runs(server: TritonServer, grpc: Any) -> None:
    before = _executions(server)
    x = np.ones((1, 4), np.float32)
    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as caught:
        grpc.infer("slow", [tensor], client_timeout=HOOK_S / 3)  # a gRPC deadline
    assert caught.value.status() == "StatusCode.DEADLINE_EXCEEDED", caught.value
    time.sleep(HOOK_S)  # its hook ends; the front finds it cancelled and does not send it
    assert _executions(server) == before
    np.testing.assert_allclose(_infer(grpc, x).as_numpy("y"), _expected(x), rtol=1e-6)
    assert _executions(server) == before + 1


def test_a_grpc_deadline_through_the_gateway_reaches_the_worker(server: TritonServer) -> None:
    """The client's ``grpc-timeout`` goes through the gateway (HAProxy) to the worker, whose
    front finds the request cancelled after its hook and never sends it (issue 28 item 2);
    the gateway answers DEADLINE_EXCEEDED as Triton does."""
    from hloserve.gateway.config import GatewayConfig
    from hloserve.node.gateway_thread import GatewayThread

    config = GatewayConfig.model_validate({"workers": [server.urls.grpc]})
    gateway = GatewayThread(config.model_copy(update={"listen": "127.0.0.1:0", "admin_port": 0}))
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{gateway.port}")
        x = np.ones((1, 4), np.float32)
        np.testing.assert_allclose(_infer(client, x).as_numpy("y"), _expected(x), rtol=1e-6)
        before = _executions(server)
        tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("slow", [tensor], client_timeout=HOOK_S / 3)
        assert caught.value.status() == "StatusCode.DEADLINE_EXCEEDED", caught.value
        time.sleep(HOOK_S)  # its hook ends on the worker: cancelled, not sent
        assert _executions(server) == before
        np.testing.assert_allclose(_infer(client, x).as_numpy("y"), _expected(x), rtol=1e-6)
        assert _executions(server) == before + 1
    finally:
        gateway.close()


def test_a_request_cancelled_in_the_runtimes_queue_is_shed(server: TritonServer, grpc: Any) -> None:
    shed = {"name": "hloserve_scheduler_shed_total", "reason": "cancelled"}
    before = (_executions(server, "tiny"), _executions(server, "tiny", **shed))
    x = np.ones((1, 4), np.float32)
    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    heavy = grpcclient.InferInput("x", [1, 256], "FP32")
    heavy.set_data_from_numpy(np.full((1, 256), 0.01, np.float32))
    grpc.infer("heavy", [heavy], client_timeout=60.0)  # compiled and warm
    busy = threading.Thread(target=grpc.infer, args=("heavy", [heavy]))
    started = time.monotonic()
    busy.start()
    # the runtime executes heavy (3 s or more here; a loaded machine may take a second to start
    # it): tiny's work waits in its queue
    time.sleep(1.0)
    try:
        with pytest.raises(InferenceServerException) as caught:
            grpc.infer("tiny", [tensor], client_timeout=0.3)
    finally:
        busy.join(timeout=60)
    heavy_s = time.monotonic() - started
    assert caught.value.status() == "StatusCode.DEADLINE_EXCEEDED", caught.value
    assert heavy_s > 1.5, f"heavy ran {heavy_s:.2f} s: too short to keep tiny queued"
    after = (_executions(server, "tiny"), _executions(server, "tiny", **shed))
    assert after == (before[0], before[1] + 1)  # shed as cancelled, never executed
