"""``hloserve serve --open-repository-api``: Triton's repository API (index, load, unload)
without the model-control key, so Triton's model-control clients work unchanged (issue 27
item 3; docs/serving.md, "Model control mode").

The calls are those of Triton's ``simple_grpc_model_control.py`` /
``simple_http_model_control.py`` (triton-inference-server/client, src/python/examples), made
on ``affine`` with tritonclient as the examples make them: index, load, ready, a load with a
malformed config override refused ("failed to load"), the load with the examples' override
``{"max_batch_size":"16"}`` (no ``backend``: Triton infers ``python`` from the front's
``1/model.py``) read back through ModelConfig and serving the same answers, unload, a load
of a name the repository lacks refused. The default (the key) refuses the same load from the same
client.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from hloserve.ports import free_ports
from tests.conftest import GOLDEN
from tests.node.test_serve_cli import launch_serve, stop_serve, wait_for_line

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow]
grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")


def _serve(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], str, str]:
    """``hloserve serve`` of ``affine`` with ``args``, once ready: (process, gRPC, HTTP)."""
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    (bundles / "affine").symlink_to(GOLDEN / "affine", target_is_directory=True)
    http, grpc, metrics = free_ports(3)
    ports = ("--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics))
    log = tmp_path / "serve.log"
    proc = launch_serve(bundles, log, *ports, "--admin-port", "0", *args)
    try:
        wait_for_line(log, r"hloserve: ready after", proc, 300)
    except BaseException:
        stop_serve(proc)
        raise
    return proc, f"127.0.0.1:{grpc}", f"127.0.0.1:{http}"


def _model_control_calls(client: Any) -> None:
    """The examples' sequence on ``affine`` (their ``simple``), asserting what they assert."""
    index = client.get_model_repository_index()
    names = (
        [m.name for m in index.models] if hasattr(index, "models") else [m["name"] for m in index]
    )
    assert sorted(names) == ["affine", "hloserve_runtime"]
    client.load_model("affine")
    assert client.is_model_ready("affine")
    with pytest.raises(InferenceServerException) as bad:
        client.load_model("affine", config='"parameters": {"config": {{"max_batch_size": "16"}}}')
    assert "failed to load" in bad.value.message()
    before = _infer(client)
    # the override names no backend: Triton infers `python` from the front's 1/model.py
    client.load_model("affine", config='{"max_batch_size":"16"}')
    assert _config(client)["max_batch_size"] == 16
    assert _config(client)["backend"] == "python"
    after = _infer(client)
    for name in before:  # the same front: same answers, same shapes (label's reshape kept)
        np.testing.assert_array_equal(after[name], before[name])
    client.unload_model("affine")
    assert not client.is_model_ready("affine")
    with pytest.raises(InferenceServerException) as wrong:
        client.load_model("wrong_model_name")
    assert "failed to load" in wrong.value.message()
    client.load_model("affine")  # served again, from its config.pbtxt (the override is gone)
    assert client.is_model_ready("affine")
    assert _config(client)["max_batch_size"] == 2
    assert _config(client)["backend"] == "hloserve_front"


def _config(client: Any) -> dict[str, Any]:
    """``affine``'s ModelConfig as JSON-like dict (gRPC: the message's fields)."""
    config = client.get_model_config("affine")
    if isinstance(config, dict):
        return config
    return {"max_batch_size": config.config.max_batch_size, "backend": config.config.backend}


def _infer(client: Any) -> dict[str, np.ndarray]:
    """``affine`` on two rows: its outputs by name."""
    module = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    tensor = module.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("affine", [tensor])
    return {name: result.as_numpy(name) for name in ("y", "label")}


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
def test_tritons_model_control_calls_work_unchanged_with_the_opt_in(
    tmp_path: Path, module: Any
) -> None:
    proc, grpc, http = _serve(tmp_path, "--open-repository-api")
    client = module.InferenceServerClient(grpc if module is grpcclient else http)
    try:
        _model_control_calls(client)
    finally:
        client.close()
        stop_serve(proc)


def test_without_the_opt_in_the_same_load_is_refused(tmp_path: Path) -> None:
    proc, grpc, _ = _serve(tmp_path)
    try:
        client = grpcclient.InferenceServerClient(grpc)
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("affine")
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        assert "This protocol is restricted" in refused.value.message()
    finally:
        stop_serve(proc)
