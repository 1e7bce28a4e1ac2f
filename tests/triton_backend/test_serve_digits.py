"""The main job end to end on a real tritonserver: digits (and affine) served by hloserve.

One server for the module (2 cores): bundles ``digits`` (trained, exported), ``affine`` (golden),
``big`` (20 MiB in and out) and ``broken`` (valid bundle whose weights are damaged in the built
repository, so it fails to load while the others serve).
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from hloserve.model_repository_tools.build import build_repository
from hloserve.node.tritonserver import TritonServer
from tests.conftest import BIG_ITEMS, GOLDEN, serving_bundles, serving_options

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow]

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402


@pytest.fixture(scope="module")
def server(digits_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    bundles = serving_bundles(tmp_path_factory.mktemp("serve") / "bundles", digits_bundle)
    shutil.copytree(GOLDEN / "affine", bundles / "broken")
    repo = bundles.parent / "repository"
    build_repository(bundles, repo)
    (repo / "broken" / "1" / "bundle" / "weights.safetensors").write_bytes(b"not safetensors")
    with TritonServer(serving_options(repo)) as srv:
        yield srv


@pytest.fixture(scope="module")
def grpc(server: TritonServer) -> Any:
    return grpcclient.InferenceServerClient(server.urls.grpc)


@pytest.fixture(scope="module")
def http(server: TritonServer) -> Any:
    return httpclient.InferenceServerClient(server.urls.http)


@pytest.fixture(scope="module")
def test_split(digits_model: Any, digits_params: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    _, _, x, y = digits_model.load_split()
    return x, y, np.asarray(jax.jit(digits_model.apply)(digits_params, x))


def infer_digits(client: Any, module: Any, images: np.ndarray) -> np.ndarray:
    tensor = module.InferInput("image", list(images.shape), "FP32")
    tensor.set_data_from_numpy(np.ascontiguousarray(images))
    return client.infer("digits", [tensor]).as_numpy("logits")


@pytest.mark.parametrize("batch", [1, 5, 8, 32])
def test_digits_through_triton_match_direct_jax(grpc: Any, test_split: Any, batch: int) -> None:
    images, _, reference = test_split
    count = 40 if batch == 1 else len(images) // batch * batch  # batch 1: a bounded sample
    logits = np.concatenate(
        [infer_digits(grpc, grpcclient, images[i : i + batch]) for i in range(0, count, batch)]
    )
    assert (logits.argmax(1) == reference[:count].argmax(1)).all()
    np.testing.assert_allclose(logits, reference[:count], rtol=1e-5, atol=1e-5)


def test_http_gives_the_same_answers(http: Any, test_split: Any) -> None:
    images, _, reference = test_split
    logits = infer_digits(http, httpclient, images[:32])
    np.testing.assert_allclose(logits, reference[:32], rtol=1e-5, atol=1e-5)


def test_64_concurrent_single_requests_are_coalesced(server: TritonServer, test_split: Any) -> None:
    images, _, reference = test_split
    local = threading.local()

    def one(i: int) -> np.ndarray:
        if not hasattr(local, "client"):
            local.client = grpcclient.InferenceServerClient(server.urls.grpc)
        return infer_digits(local.client, grpcclient, images[i : i + 1])[0]

    stats_client = grpcclient.InferenceServerClient(server.urls.grpc)
    with ThreadPoolExecutor(max_workers=64) as pool:
        answers = list(pool.map(one, range(64)))
    for i, logits in enumerate(answers):
        assert logits.argmax() == reference[i].argmax(), f"request {i} got another request's answer"
        np.testing.assert_allclose(logits, reference[i], rtol=1e-5, atol=1e-5)
    stats = stats_client.get_inference_statistics("digits", as_json=True)
    batch_sizes = {int(b["batch_size"]) for b in stats["model_stats"][0]["batch_stats"]}
    assert max(batch_sizes) > 1, f"no execution coalesced requests: {batch_sizes}"


def expect_error(call: Any, code: str, *words: str) -> None:
    with pytest.raises(InferenceServerException) as info:
        call()
    assert info.value.status() == f"StatusCode.{code}", info.value
    for word in words:
        assert word in info.value.message(), info.value.message()


def test_bad_requests_get_trition_status_codes_and_the_server_keeps_serving(
    grpc: Any, test_split: Any
) -> None:
    images = test_split[0]

    def send(
        array: np.ndarray, datatype: str = "FP32", name: str = "image", model: str = "digits"
    ) -> Any:
        tensor = grpcclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        return lambda: grpc.infer(model, [tensor])

    expect_error(send(images[:1].astype(np.float64), "FP64"), "INVALID_ARGUMENT", "image", "FP64")
    expect_error(send(images[:1, :, :4].copy()), "INVALID_ARGUMENT", "image")
    expect_error(send(np.zeros((33, 8, 8, 1), np.float32)), "INVALID_ARGUMENT", "batch")
    expect_error(send(images[:1], name="pixels"), "INVALID_ARGUMENT", "pixels")
    expect_error(lambda: grpc.infer("digits", []), "INVALID_ARGUMENT", "image")
    expect_error(send(images[:1], model="nope"), "NOT_FOUND", "nope")
    np.testing.assert_allclose(
        infer_digits(grpc, grpcclient, images[:8]), test_split[2][:8], rtol=1e-5, atol=1e-5
    )


def test_a_bundle_that_fails_to_load_leaves_the_others_serving(grpc: Any) -> None:
    assert not grpc.is_model_ready("broken")
    assert grpc.is_model_ready("digits") and grpc.is_model_ready("affine")
    x = np.ones((1, 4), np.float32)
    tensor = grpcclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(x)
    # Triton answers a model that failed to load as unknown: NOT_FOUND, naming it.
    expect_error(lambda: grpc.infer("broken", [tensor]), "NOT_FOUND", "broken")
    assert grpc.infer("affine", [tensor]).as_numpy("y").shape == (1, 3)


def test_20_mib_request_and_response_round_trip(grpc: Any, http: Any) -> None:
    x = np.random.default_rng(0).standard_normal((1, BIG_ITEMS)).astype(np.float32)
    for client, module in ((grpc, grpcclient), (http, httpclient)):
        tensor = module.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        y = client.infer("big", [tensor]).as_numpy("y")
        assert y.nbytes == 20 * 1024 * 1024 and np.array_equal(y, x * 2)


def test_metadata_and_config_over_grpc_and_http(grpc: Any, http: Any) -> None:
    meta = grpc.get_model_metadata("digits", as_json=True)
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("image", "FP32", ["-1", "8", "8", "1"])
    ]
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["outputs"]] == [
        ("logits", "FP32", ["-1", "10"])
    ]
    meta = http.get_model_metadata("affine")
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("x", "FP32", [-1, 4])
    ]
    assert [(t["name"], t["datatype"]) for t in meta["outputs"]] == [
        ("y", "FP32"),
        ("label", "INT32"),
    ]
    config = grpc.get_model_config("digits", as_json=True)["config"]
    assert int(config["max_batch_size"]) == 32
    assert [int(s) for s in config["dynamic_batching"]["preferred_batch_size"]] == [1, 8, 32]
    assert http.get_model_config("affine")["input"][0]["data_type"] == "TYPE_FP32"


def test_perf_analyzer_runs_with_zero_errors(server: TritonServer) -> None:
    from hloserve.node.perf_analyzer import run_perf_analyzer

    results, output = run_perf_analyzer(
        "digits", server.urls.grpc, concurrency=(1, 2), request_count=200
    )
    assert [r.concurrency for r in results] == [1, 2], output
    assert all(r.throughput > 0 for r in results), output
    assert "error" not in output.lower(), output
