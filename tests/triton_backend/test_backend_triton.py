"""The front and runtime backends behind a real tritonserver (nvidia-pytriton wheel).

One server for the module: a repository built by ``build_repository`` from
    affine      the golden bundle (compiled 1, 2; max_batch_size 2)
    dtypes      identity for every executable dtype (compiled 1, 4)
    transposed  batch axis not leading (max_batch_size 0)
    unbatched   no batch axis
    big         20 MiB in, 20 MiB out
    broken      a copy of affine whose batch-2 artifact is then corrupted in the repository: the
                front refuses it in ``initialize`` (not ready), the others serve
    mismatched  a copy of affine whose batch-2 artifact is replaced by another model's: the
                front cannot tell (no JAX there), the runtime refuses to load it and each
                request gets the runtime's error
Front models have no ``model_warmup`` (see hloserve.model_repository_tools.config): each front
has the runtime compile its bundle over the channel instead (docs/serving.md).
"""

from __future__ import annotations

import importlib.util
import queue
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from hloserve.bundle import dtypes
from hloserve.bundle.bundle import load_bundle
from hloserve.node import tritonserver as ts
from hloserve.node.triton_options import TritonServerOptions
from tests.conftest import export_wide, serving_options
from tests.triton_backend.test_bundles import (
    EXECUTABLE_TOKENS,
    TRANSPOSED_W,
    export_dtypes,
    export_transposed,
    export_unbatched,
    extreme_values,
)

pytestmark = [
    pytest.mark.tritonserver,
    pytest.mark.skipif(
        importlib.util.find_spec("pytriton") is None, reason="nvidia-pytriton not installed"
    ),
]

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
BIG_K = 5 * 1024 * 1024  # f32 items per request: 20 MiB


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ts.TritonServer]:
    from hloserve.model_repository_tools.build import build_repository

    root = tmp_path_factory.mktemp("backend_triton")
    bundles = root / "bundles"
    shutil.copytree(GOLDEN / "affine", bundles / "affine")
    shutil.copytree(GOLDEN / "affine", bundles / "broken")
    shutil.copytree(GOLDEN / "affine", bundles / "mismatched")
    export_dtypes(bundles / "dtypes")
    export_transposed(bundles / "transposed")
    export_unbatched(bundles / "unbatched")
    export_wide(bundles / "big", BIG_K, lambda x: x + 1)
    repo = root / "repo"
    build_repository(bundles, repo)
    (repo / "broken" / "1" / "bundle" / "model.b2.mlirbc").write_bytes(b"ML\xefR corrupted")
    shutil.copyfile(
        repo / "dtypes" / "1" / "bundle" / "model.b4.mlirbc",
        repo / "mismatched" / "1" / "bundle" / "model.b2.mlirbc",
    )
    # as `hloserve serve` runs it: a model that fails to load leaves the server up and ready
    options = serving_options(repo, root / "tritonserver.log")
    start = time.perf_counter()
    with ts.TritonServer(options) as server:
        print(f"tritonserver ready in {time.perf_counter() - start:.1f} s")
        yield server


@pytest.fixture(scope="module")
def client(server: ts.TritonServer) -> Iterator[Any]:
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(server.urls.grpc) as client:
        yield client


def _input(name: str, array: np.ndarray, datatype: str | None = None) -> Any:
    import tritonclient.grpc as grpcclient

    kserve = datatype or dtypes.from_numpy(array.dtype).kserve
    tensor = grpcclient.InferInput(name, list(array.shape), kserve)
    tensor.set_data_from_numpy(array)
    return tensor


def _affine_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    b, w = load_bundle(GOLDEN / "affine").load_weights()
    y = np.tanh(x @ w + b)
    return y, np.argmax(y, axis=1).astype(np.int32)


def test_affine_batch_1_and_2_over_grpc_and_http(server: ts.TritonServer, client: Any) -> None:
    import tritonclient.http as httpclient

    expected = np.load(GOLDEN / "affine.expected.npz")
    x = expected["x"]
    for rows in (slice(0, 1), slice(0, 2)):
        result = client.infer("affine", [_input("x", x[rows])])
        np.testing.assert_allclose(result.as_numpy("y"), expected["y"][rows], rtol=1e-6)
        # label is a per-item scalar: Triton declares it dims [1] (reshape []), so [batch, 1]
        assert result.as_numpy("label").reshape(-1).tolist() == expected["label"][rows].tolist()
    http = httpclient.InferenceServerClient(server.urls.http)
    try:
        tensor = httpclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        result = http.infer("affine", [tensor])
        np.testing.assert_allclose(result.as_numpy("y"), expected["y"], rtol=1e-6)
    finally:
        http.close()


def test_affine_through_the_front(client: Any) -> None:
    """Batch 1 and 2 through front + runtime (the channel) give the golden answers
    (benchmarks/serve_overhead.py and channel_roundtrip.py time the path)."""
    expected = np.load(GOLDEN / "affine.expected.npz")
    x, y, label = expected["x"], expected["y"], expected["label"]
    for rows in (slice(0, 1), slice(0, 2), slice(1, 2)):
        front = client.infer("affine", [_input("x", x[rows])])
        np.testing.assert_allclose(front.as_numpy("y"), y[rows], rtol=1e-6)
        assert front.as_numpy("label").reshape(-1).tolist() == label[rows].tolist()


def _batch_counts(client: Any, model: str) -> dict[int, int]:
    stats = client.get_inference_statistics(model_name=model)
    return {s.batch_size: s.compute_infer.count for s in stats.model_stats[0].batch_stats}


def _settled_counts(client: Any, model: str, rows: int | None = None) -> dict[int, int]:
    """:func:`_batch_counts` once Triton has counted what it answered (it counts after the
    response, so a read right after the answers can miss the last executions): two reads
    0.2 s apart agree and, given ``rows``, they hold that many rows (bounded: 10 s)."""
    counts = _batch_counts(client, model)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.2)
        again = _batch_counts(client, model)
        total = sum(n * c for n, c in again.items())
        if again == counts and (rows is None or total >= rows):
            break
        counts = again
    return counts


def test_concurrent_single_requests_are_coalesced(client: Any) -> None:
    before = _settled_counts(client, "affine")  # an earlier test's last executions counted
    rng = np.random.default_rng(11)
    xs = [rng.standard_normal((1, 4)).astype(np.float32) for _ in range(48)]
    done: queue.Queue[tuple[int, Any, Any]] = queue.Queue()
    for i, x in enumerate(xs):
        client.async_infer(
            "affine",
            [_input("x", x)],
            callback=lambda result, error, i=i: done.put((i, result, error)),
        )
    answers = {}
    for _ in xs:
        i, result, error = done.get(timeout=60)
        assert error is None, str(error)
        answers[i] = result
    for i, x in enumerate(xs):
        y, label = _affine_reference(x)
        np.testing.assert_allclose(answers[i].as_numpy("y"), y, rtol=1e-5, atol=1e-6)
        assert answers[i].as_numpy("label").reshape(-1).tolist() == label.tolist()
    after = _settled_counts(client, "affine", sum(n * c for n, c in before.items()) + len(xs))
    grown = {n: after.get(n, 0) - before.get(n, 0) for n in after}
    print(f"affine executions by batch size for 48 concurrent requests: {grown}")
    assert sum(n * c for n, c in grown.items()) == len(xs)
    assert grown.get(2, 0) > 0, grown  # Triton's dynamic batcher handed the front 2 at once


def test_every_dtype_round_trips_bit_exactly(client: Any) -> None:
    """Batch 3 is not compiled (1, 4): padded to 4 in the front, sliced back."""
    inputs, sent = [], {}
    for i, token in enumerate(EXECUTABLE_TOKENS):
        values = extreme_values(token, 3, seed=i)
        sent[token] = values
        if token == "bf16":  # tritonclient carries BF16 as float32 holding the bf16 bits
            wide = (values.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            inputs.append(_input(f"x_{token}", wide, "BF16"))
        else:
            inputs.append(_input(f"x_{token}", values))
    result = client.infer("dtypes", inputs)
    for token in EXECUTABLE_TOKENS:
        got = result.as_numpy(f"y_{token}")
        if token == "bf16":
            got = (got.view(np.uint32) >> 16).astype(np.uint16).view(ml_dtypes.bfloat16)
        assert got.dtype == sent[token].dtype, token
        assert got.shape == sent[token].shape, token
        assert got.tobytes() == sent[token].tobytes(), token


def test_non_leading_batch_axis_and_unbatched(client: Any) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)  # (k=2, n=3): padded to 4 on axis 1
    result = client.infer("transposed", [_input("x", x)])
    np.testing.assert_array_equal(result.as_numpy("y"), x.T * TRANSPOSED_W)
    np.testing.assert_array_equal(result.as_numpy("z"), x + 1)
    u = np.array([1.0, -2.0, 0.5], np.float32)
    result = client.infer("unbatched", [_input("x", u)])
    np.testing.assert_array_equal(result.as_numpy("y"), u * 2 + [1.0, 2.0, 3.0])


def test_20_mib_request_and_response(client: Any) -> None:
    x = np.random.default_rng(5).standard_normal((1, BIG_K)).astype(np.float32)
    times = []
    for _ in range(3):  # the first calls grow the stubs' shared memory
        start = time.perf_counter()
        result = client.infer("big", [_input("x", x)])
        times.append(f"{(time.perf_counter() - start) * 1e3:.0f}")
        np.testing.assert_array_equal(result.as_numpy("y"), x + 1)
    print(f"20 MiB in + 20 MiB out, three calls: {', '.join(times)} ms")


def _error(client: Any, model: str, inputs: list[Any]) -> tuple[str, str]:
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as info:
        client.infer(model, inputs)
    return str(info.value.status()), str(info.value.message())


def test_errors_reach_the_client_with_their_status(client: Any) -> None:
    x = np.zeros((1, 4), np.float32)
    # checked by the front (max_batch_size 0: Triton cannot know the largest batch)
    status, message = _error(client, "transposed", [_input("x", np.zeros((2, 5), np.float32))])
    assert status == "StatusCode.INVALID_ARGUMENT", message
    assert "model 'transposed': batch size 5 is outside 1 to 4" in message
    # checked by Triton from the generated config
    status, message = _error(client, "affine", [_input("x", x.astype(np.float64))])
    assert status == "StatusCode.INVALID_ARGUMENT" and "x" in message, message
    status, message = _error(client, "affine", [_input("x", np.zeros((3, 4), np.float32))])
    assert status == "StatusCode.INVALID_ARGUMENT", message
    status, message = _error(client, "no_such_model", [_input("x", x)])
    assert status == "StatusCode.NOT_FOUND" and "no_such_model" in message, message
    # the runtime takes no inference requests: the fronts reach it over the channel
    status, message = _error(client, "hloserve_runtime", [_input("x", x)])
    assert status in ("StatusCode.UNIMPLEMENTED", "StatusCode.INVALID_ARGUMENT"), message
    still = client.infer("affine", [_input("x", x)]).as_numpy("y")  # still serving
    np.testing.assert_allclose(still, _affine_reference(x)[0], rtol=1e-6)


def test_a_damaged_bundle_fails_its_front_and_the_others_serve(
    server: ts.TritonServer, client: Any
) -> None:
    assert not client.is_model_ready("broken")
    status, message = _error(client, "broken", [_input("x", np.zeros((1, 4), np.float32))])
    print(f"request to a model that failed to load: {status} {message}")
    assert "broken" in message
    for model in ("affine", "dtypes", "transposed", "unbatched", "big", "hloserve_runtime"):
        assert client.is_model_ready(model), model
    assert client.infer("affine", [_input("x", np.zeros((1, 4), np.float32))]) is not None
    assert server.options.log_file is not None
    log = server.options.log_file.read_text()
    assert "model.b2.mlirbc is not a StableHLO portable artifact" in log


def test_a_bundle_the_runtime_cannot_load_answers_its_error(
    server: ts.TritonServer, client: Any
) -> None:
    x = np.zeros((1, 4), np.float32)
    # A front whose initialize finds the runtime listening fails to load with the runtime's
    # error; one that came up first (models load in parallel) answers it to every request.
    if client.is_model_ready("mismatched"):
        for _ in range(2):  # the runtime keeps the failure; it does not retry the load
            status, message = _error(client, "mismatched", [_input("x", x)])
            assert status == "StatusCode.INVALID_ARGUMENT", message  # the bundle's own error
            assert message.startswith("model 'mismatched' failed to load"), message
            assert "model.b2.mlirbc" in message and "[hloserve" not in message
    still = client.infer("affine", [_input("x", x)]).as_numpy("y")  # still serving
    np.testing.assert_allclose(still, _affine_reference(x)[0], rtol=1e-6)
    assert server.options.log_file is not None
    log = server.options.log_file.read_text()
    assert log.count("model 'mismatched' failed to load") >= 1
    assert "model 'affine' loaded in" in log


def test_server_log_is_clean(server: ts.TritonServer, client: Any) -> None:
    client.infer("affine", [_input("x", np.zeros((1, 4), np.float32))])
    assert server.options.log_file is not None
    log = server.options.log_file.read_text()
    for bad in ("Traceback", "PyCapsule", "Exception ignored", "not healthy"):
        assert bad not in log, bad


def test_front_waits_for_a_runtime_loaded_later(tmp_path: Path) -> None:
    """The front retries while the runtime is not loaded (explicit model control)."""
    import threading

    import tritonclient.grpc as grpcclient

    from hloserve.model_repository_tools.build import build_repository
    from hloserve.triton_backend.backends import backend_dirs

    bundles = tmp_path / "bundles"
    shutil.copytree(GOLDEN / "affine", bundles / "affine")
    repo = tmp_path / "repo"
    build_repository(bundles, repo, front_instances=1)
    options = TritonServerOptions.on_free_ports(
        repo,
        extra_backend_dirs=backend_dirs(),
        log_file=tmp_path / "tritonserver.log",
        model_control_mode="explicit",
        load_models=["affine"],
        startup_timeout_s=120.0,
    )
    expected = np.load(GOLDEN / "affine.expected.npz")
    outcome: dict[str, Any] = {}
    with ts.TritonServer(options) as server:
        client = grpcclient.InferenceServerClient(server.urls.grpc)
        assert not client.is_model_ready("hloserve_runtime")

        def ask() -> None:
            try:
                outcome["y"] = client.infer("affine", [_input("x", expected["x"])]).as_numpy("y")
            except Exception as exc:
                outcome["error"] = exc

        asking = threading.Thread(target=ask)
        start = time.perf_counter()
        asking.start()
        asking.join(timeout=1.5)
        assert asking.is_alive(), outcome  # waiting for the runtime, not failed
        client.load_model("hloserve_runtime")
        asking.join(timeout=90)
        print(f"answered {time.perf_counter() - start:.1f} s after it was sent")
        assert "error" not in outcome, outcome
        np.testing.assert_allclose(outcome["y"], expected["y"], rtol=1e-6)
        client.close()
