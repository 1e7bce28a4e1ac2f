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
client. With ``--workers 2`` the same calls pass through the gateway with its control token.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from hloserve.ports import free_ports
from tests.conftest import GOLDEN, import_example
from tests.node.test_serve_cli import launch_serve, serve_two_workers, stop_serve, wait_for_line

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


def _model_control_calls(
    client: Any, headers: dict[str, str] | None = None, replicas: tuple[Any, ...] = ()
) -> None:
    """The examples' sequence on ``affine`` (their ``simple``), asserting what they assert;
    ``headers`` go with each load and unload; ``replicas`` (clients of each worker, through
    the gateway) each hold the override, and after the reload the generated config."""
    index = client.get_model_repository_index()
    names = (
        [m.name for m in index.models] if hasattr(index, "models") else [m["name"] for m in index]
    )
    assert sorted(names) == ["affine", "hloserve_runtime"]
    client.load_model("affine", headers=headers)
    assert client.is_model_ready("affine")
    with pytest.raises(InferenceServerException) as bad:
        client.load_model(
            "affine",
            headers=headers,
            config='"parameters": {"config": {{"max_batch_size": "16"}}}',
        )
    assert "failed to load" in bad.value.message()
    before = _infer(client)
    # the override names no backend: Triton infers `python` from the front's 1/model.py
    client.load_model("affine", headers=headers, config='{"max_batch_size":"16"}')
    for one in (client, *replicas):
        assert _config(one) == {"max_batch_size": 16, "backend": "python"}
    after = _infer(client)
    for name in before:  # the same front: same answers, same shapes (label's reshape kept)
        np.testing.assert_array_equal(after[name], before[name])
    client.unload_model("affine", headers=headers)
    assert not client.is_model_ready("affine")
    with pytest.raises(InferenceServerException) as wrong:
        client.load_model("wrong_model_name", headers=headers)
    assert "failed to load" in wrong.value.message()
    # served again, from its config.pbtxt (the override went with the unload)
    client.load_model("affine", headers=headers)
    assert client.is_model_ready("affine")
    for one in (client, *replicas):
        assert _config(one) == {"max_batch_size": 2, "backend": "hloserve_front"}


def _config(client: Any) -> dict[str, Any]:
    """``affine``'s ModelConfig as JSON-like dict (gRPC: the message's fields)."""
    config = client.get_model_config("affine")
    if isinstance(config, dict):
        return {"max_batch_size": config["max_batch_size"], "backend": config["backend"]}
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


TOKEN = "control-token-0123456789"


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``serve --open-repository-api --workers 2`` of ``affine`` with a control token:
    ``{"grpc": gateway, "http": gateway, "workers": [worker gRPC, ...]}``."""
    root = tmp_path_factory.mktemp("open")
    (root / "bundles").mkdir()
    (root / "bundles" / "affine").symlink_to(GOLDEN / "affine", target_is_directory=True)
    log = root / "serve.log"
    proc, grpc, http, _ = serve_two_workers(
        root / "bundles",
        log,
        "--admin-port",
        "0",
        "--open-repository-api",
        env={"HLOSERVE_CONTROL_TOKEN": TOKEN},
    )
    try:
        wait_for_line(log, r"hloserve: ready after", proc, 600)
        workers = re.findall(r"worker \d .*HTTP http://[\d.:]+  gRPC ([\d.:]+)", log.read_text())
        assert len(workers) == 2
        yield {"grpc": f"127.0.0.1:{grpc}", "http": f"127.0.0.1:{http}", "workers": workers}
    finally:
        stop_serve(proc)


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
def test_through_the_gateway_the_same_calls_work_with_the_control_token(
    two_workers: dict[str, Any], module: Any
) -> None:
    """With ``--workers 2`` the workers' APIs are open and the gateway keeps model control
    behind its control token (docs/gateway.md, "Control plane: authentication"): the same
    calls with ``authorization: Bearer <token>`` as tritonclient sends a header; the
    override reaches both workers. Without the header a load is refused UNAUTHENTICATED /
    401 and nothing changes."""
    client = module.InferenceServerClient(two_workers["grpc" if module is grpcclient else "http"])
    replicas = tuple(grpcclient.InferenceServerClient(w) for w in two_workers["workers"])
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("affine", config='{"max_batch_size":"16"}')
        assert refused.value.status() in ("StatusCode.UNAUTHENTICATED", "401")
        assert "model control needs a credential" in refused.value.message()
        for one in replicas:
            assert _config(one) == {"max_batch_size": 2, "backend": "hloserve_front"}
        _model_control_calls(client, {"authorization": f"Bearer {TOKEN}"}, replicas)
    finally:
        for one in (client, *replicas):
            one.close()


def test_an_override_without_sequence_batching_of_a_stateful_front_is_refused(
    tmp_path: Path,
) -> None:
    """A stateful front (examples/sequence's ``simple_sequence``) cannot be completed into a
    stateful model (Triton's Python auto-complete sets no ``sequence_batching``): the load is
    refused naming the model and what is missing, and the model keeps serving as before."""
    bundles = tmp_path / "bundles"
    import_example("sequence", "export").export_sequence(bundles)
    (name,) = [p.name for p in bundles.iterdir()]
    http, grpc, metrics = free_ports(3)
    ports = ("--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics))
    log = tmp_path / "serve.log"
    proc = launch_serve(bundles, log, *ports, "--admin-port", "0", "--open-repository-api")
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
    try:
        wait_for_line(log, r"hloserve: ready after", proc, 300)
        with pytest.raises(InferenceServerException) as refused:
            client.load_model(name, config='{"max_batch_size":"16"}')
        message = refused.value.message()
        assert f"model {name!r}" in message and "sequence_batching" in message, message
        assert client.is_model_ready(name)
        assert client.get_model_config(name).config.HasField("sequence_batching")
    finally:
        client.close()
        stop_serve(proc)
