"""Manifest ``labels:`` and ``format:`` on a real tritonserver: Triton's classification extension
(``class_count``) over gRPC and HTTP, answered by Triton itself from the generated
``label_filename``, directly and through the gateway (issue 27; over HTTP the image is sent as
JSON, which the gateway checks before passing it on with its ``classification`` parameter).

Model: ``digits`` with ``format: NHWC`` on its image input and ``labels: labels.txt`` (ten
digit names) on its ``logits`` output.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from hloserve.gateway.config import GatewayConfig
from hloserve.model_repository_tools.build import build_repository
from hloserve.model_repository_tools.validate import validate_repository
from hloserve.node.gateway_thread import GatewayThread
from hloserve.node.tritonserver import TritonServer
from tests.conftest import serving_options

pytestmark = [pytest.mark.tritonserver]

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")

LABELS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def label_digits(bundle: Path) -> Path:
    """Give the digits bundle at ``bundle`` an image format and a label file."""
    (bundle / "labels.txt").write_text("\n".join(LABELS) + "\n")
    path = bundle / "manifest.yaml"
    data = yaml.safe_load(path.read_text())
    data["inputs"][0]["format"] = "NHWC"
    data["outputs"][0]["labels"] = "labels.txt"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return bundle


@pytest.fixture(scope="module")
def server(digits_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    src = tmp_path_factory.mktemp("labels") / "src"
    src.mkdir()
    label_digits(Path(shutil.copytree(digits_bundle, src / "digits")))
    repo = src.parent / "repository"
    build_repository(src, repo, front_instances=1)
    with TritonServer(serving_options(repo, src.parent / "server.log")) as srv:
        yield srv


@pytest.fixture(scope="module")
def gateway(server: TritonServer) -> Iterator[tuple[str, str]]:
    """(gRPC, HTTP) addresses of a gateway over ``server``."""
    config = GatewayConfig(workers=(server.urls.grpc,), worker_http=(server.urls.http,))
    update = {"listen": "127.0.0.1:0", "admin_port": 0, "http_listen": "127.0.0.1:0"}
    thread = GatewayThread(config.model_copy(update=update))
    try:
        assert thread.http_address is not None
        yield f"127.0.0.1:{thread.port}", thread.http_address
    finally:
        thread.close()


def test_the_config_carries_the_format_and_the_label_file(server: TritonServer) -> None:
    client = grpcclient.InferenceServerClient(server.urls.grpc)
    config = client.get_model_config("digits", as_json=True)["config"]
    assert config["input"][0]["format"] == "FORMAT_NHWC"
    assert config["output"][0]["label_filename"] == "logits.labels.txt"
    labels = server.options.model_repository / "digits" / "logits.labels.txt"
    assert labels.read_text().splitlines() == LABELS
    assert validate_repository(server.options.model_repository) == []


@pytest.mark.parametrize("via", ["direct", "gateway"])
@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
def test_class_count_gives_the_top_classes_with_their_labels(
    server: TritonServer, gateway: tuple[str, str], module: Any, via: str
) -> None:
    urls = (server.urls.grpc, server.urls.http) if via == "direct" else gateway
    client = module.InferenceServerClient(urls[0] if module is grpcclient else urls[1])
    images = np.random.default_rng(0).random((2, 8, 8, 1), dtype=np.float32)
    tensor = module.InferInput("image", list(images.shape), "FP32")
    if module is httpclient:  # JSON: the gateway's checked path
        tensor.set_data_from_numpy(images, binary_data=False)
    else:
        tensor.set_data_from_numpy(images)
    logits = client.infer("digits", [tensor]).as_numpy("logits")
    top = client.infer(
        "digits", [tensor], outputs=[module.InferRequestedOutput("logits", class_count=3)]
    ).as_numpy("logits")
    assert top.shape == (2, 3)
    for row, scores in zip(top, logits, strict=True):
        entries = [bytes(e).decode().split(":") for e in row]
        indices = [int(index) for _, index, _ in entries]
        assert indices == list(np.argsort(-scores)[:3])
        assert [label for _, _, label in entries] == [LABELS[i] for i in indices]
        np.testing.assert_allclose(
            [float(v) for v, _, _ in entries], scores[indices], atol=1e-6
        )  # printed %f
