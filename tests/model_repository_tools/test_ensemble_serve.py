"""A Triton ensemble beside the bundles, its steps bundle models, built and served by a real
tritonserver (issue 27): examples/digits_ensemble (``digits`` then ``softmax``)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.model_repository_tools.build import build_repository
from hloserve.model_repository_tools.foreign import repository_backends
from hloserve.node.triton_install import check_backends
from hloserve.node.tritonserver import TritonServer
from tests.conftest import import_example, serving_options

pytestmark = [pytest.mark.tritonserver]

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")


@pytest.fixture(scope="module")
def repository(digits_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    example = import_example("digits_ensemble", "export")
    src = tmp_path_factory.mktemp("ensemble") / "src"
    src.mkdir()
    shutil.copytree(digits_bundle, src / "digits")
    example.export_softmax(src)
    example.write_ensemble(src)
    repo = src.parent / "repository"
    build_repository(src, repo, front_instances=1)
    return repo


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[TritonServer]:
    with TritonServer(serving_options(repository, repository.parent / "server.log")) as srv:
        yield srv


def test_an_ensemble_needs_no_backend(repository: Path) -> None:
    assert "ensemble" not in repository_backends(repository)
    assert (repository / "digits_probs" / "1").is_dir()  # Triton needs its version directory
    check_backends(repository, {"python"})  # no "needs backend 'ensemble'"


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
def test_the_ensemble_chains_its_bundle_steps(server: TritonServer, module: Any) -> None:
    url = server.urls.grpc if module is grpcclient else server.urls.http
    client = module.InferenceServerClient(url)
    images = np.random.default_rng(3).random((3, 8, 8, 1), dtype=np.float32)
    tensor = module.InferInput("image", list(images.shape), "FP32")
    tensor.set_data_from_numpy(images)
    logits = client.infer("digits", [tensor]).as_numpy("logits")
    probs = client.infer("digits_probs", [tensor]).as_numpy("probs")
    expected = np.exp(logits - logits.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-6)
    config = client.get_model_config("digits_probs")
    platform = config.config.platform if module is grpcclient else config["platform"]
    assert platform == "ensemble"
