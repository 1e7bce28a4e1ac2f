"""A repository of bundles and foreign Triton models, served by a real tritonserver.

Models: ``digits`` (bundle), ``plus_one`` (a plain Python model with its config), ``times_two``
(a Python model without a config: Triton completes it through ``auto_complete_config``) and
the meta ``mixer``, which calls ``plus_one`` and ``digits`` in one ``run``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.model_repository_tools.build import build_repository
from hloserve.node.tritonserver import TritonServer
from tests.conftest import serving_options

pytestmark = [pytest.mark.tritonserver]

grpcclient = pytest.importorskip("tritonclient.grpc")

MODELS = Path(__file__).resolve().parents[1] / "foreign_models"


@pytest.fixture(scope="module")
def server(digits_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    src = tmp_path_factory.mktemp("foreign") / "src"
    src.mkdir()
    shutil.copytree(digits_bundle, src / "digits")
    for name in ("plus_one", "times_two", "mixer"):
        shutil.copytree(MODELS / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    repo = src.parent / "repository"
    build_repository(src, repo, front_instances=1)
    with TritonServer(serving_options(repo, src.parent / "server.log")) as srv:
        yield srv


@pytest.fixture(scope="module")
def grpc(server: TritonServer) -> Any:
    return grpcclient.InferenceServerClient(server.urls.grpc)


def _infer(client: Any, model: str, **tensors: np.ndarray) -> Any:
    inputs = []
    for name, array in tensors.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return client.infer(model, inputs)


def test_every_model_is_served(grpc: Any) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(_infer(grpc, "plus_one", x=x).as_numpy("y"), x + 1)
    np.testing.assert_array_equal(_infer(grpc, "times_two", x=x).as_numpy("y"), 2 * x)
    config = grpc.get_model_config("times_two", as_json=True)["config"]
    assert [t["name"] for t in config["input"]] == ["x"]  # completed by auto_complete_config
    image = np.random.default_rng(0).random((3, 8, 8, 1), dtype=np.float32)
    assert _infer(grpc, "digits", image=image).as_numpy("logits").shape == (3, 10)


def test_a_meta_calls_a_foreign_model_and_a_bundle_in_one_run(grpc: Any) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    image = np.random.default_rng(1).random((3, 8, 8, 1), dtype=np.float32)
    result = _infer(grpc, "mixer", x=x, image=image)
    np.testing.assert_array_equal(result.as_numpy("y"), x + 1)
    np.testing.assert_array_equal(
        result.as_numpy("logits"), _infer(grpc, "digits", image=image).as_numpy("logits")
    )
