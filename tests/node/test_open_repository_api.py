"""``hloserve serve --open-repository-api``: Triton's repository API (index, load, unload)
without the model-control key, so Triton's model-control clients work unchanged (issue 27
item 3; docs/serving.md, "Model control mode").

The calls are those of Triton's ``simple_grpc_model_control.py`` /
``simple_http_model_control.py`` (triton-inference-server/client, src/python/examples), made
on ``affine`` with tritonclient as the examples make them: index, load, ready, a load with a
malformed config override refused ("failed to load"), the load with the examples' override
``{"max_batch_size":"16"}`` (no ``backend``: Triton infers ``python`` from the front's
``1/model.py``) read back through ModelConfig and serving the same answers, unload, a load
of a name the repository lacks refused, and the examples' over-long ``file:`` override refused
with tritonserver's own status and words for a deeper over-long component (asked of the worker
in the same run) while the same tritonserver keeps serving. With the opt-in the gateway serves
the public ports even for one worker (the workers keep the key); without it one worker is
served directly and the key refuses the same load. With ``--workers 2`` the same calls pass
through the gateway without a token; GatewayControl still needs it. Without the opt-in the
gateway of ``--workers 2`` passes them with the control token sent as a header.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from grpc import RpcError, StatusCode
from grpc import insecure_channel as grpc_channel
from tritonclient.utils import InferenceServerException

from hloserve.model_control import ENV_KEY, GRPC_METADATA_KEY, HEADER
from hloserve.ports import free_ports
from hloserve.protos import gateway_control_pb2 as pb
from hloserve.protos import gateway_control_pb2_grpc as pb_grpc
from tests.conftest import GOLDEN, import_example
from tests.node.test_serve_cli import launch_serve, serve_two_workers, stop_serve, wait_for_line

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow]
grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")


#: The workers' model-control key in these tests (``HLOSERVE_MODEL_CONTROL_KEY``).
KEY = "openRepositoryApiKey0123"


@dataclass
class Served:
    """A ready ``hloserve serve``: its public endpoints, its log, and each worker's
    ``(pid, HTTP, gRPC)`` as the log reports them."""

    proc: subprocess.Popen[bytes]
    grpc: str
    http: str
    log: Path
    workers: list[tuple[int, str, str]]


def _workers(log: Path) -> list[tuple[int, str, str]]:
    pattern = r"worker \d tritonserver \(pid (\d+)\).*HTTP http://([\d.:]+)  gRPC ([\d.:]+)"
    return [(int(p), h, g) for p, h, g in re.findall(pattern, log.read_text())]


def _serve(tmp_path: Path, *args: str, env: Mapping[str, str] | None = None) -> Served:
    """``hloserve serve`` of ``affine`` with ``args``, once ready."""
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    (bundles / "affine").symlink_to(GOLDEN / "affine", target_is_directory=True)
    http, grpc, metrics = free_ports(3)
    ports = ("--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics))
    log = tmp_path / "serve.log"
    base = ("--worker-port-base", "0", "--admin-port", "0")
    proc = launch_serve(bundles, log, *ports, *base, *args, env=env)
    try:
        wait_for_line(log, r"hloserve: ready after", proc, 300)
    except BaseException:
        stop_serve(proc)
        raise
    return Served(proc, f"127.0.0.1:{grpc}", f"127.0.0.1:{http}", log, _workers(log))


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
    # below the generated preferred sizes [1, 2]: those above it are left out, not refused
    client.load_model("affine", headers=headers, config='{"max_batch_size":"1"}')
    assert _config(client) == {"max_batch_size": 1, "backend": "python"}
    assert _preferred(client) == [1]
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


def _preferred(client: Any) -> list[int]:
    """``affine``'s ``dynamic_batching.preferred_batch_size``."""
    config = client.get_model_config("affine")
    if isinstance(config, dict):  # HTTP: the config itself
        return [int(s) for s in config["dynamic_batching"]["preferred_batch_size"]]
    return list(config.config.dynamic_batching.preferred_batch_size)


def _infer(client: Any) -> dict[str, np.ndarray]:
    """``affine`` on two rows: its outputs by name."""
    module = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    tensor = module.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("affine", [tensor])
    return {name: result.as_numpy(name) for name in ("y", "label")}


def _over_long_file_override_is_refused(client: Any, worker: Any) -> None:
    """The examples' step: a load of ``affine`` with ``config="{}"`` and a ``file:`` override
    whose first path component is 256 bytes (tritonserver 2.51 aborts on it) is refused in
    the status and words ``worker`` (a tritonserver, asked with the key) gives for a deeper
    over-long component, naming the model; ``affine`` then answers as before."""
    before = _infer(client)
    grpc = isinstance(client, grpcclient.InferenceServerClient)
    key = {GRPC_METADATA_KEY if grpc else HEADER: KEY}
    with pytest.raises(InferenceServerException) as own:  # where tritonserver does not abort
        worker.load_model("nope", headers=key, config="{}", files={"file:1/" + "a" * 256: b"a"})
    with pytest.raises(InferenceServerException) as refused:
        client.load_model("affine", config="{}", files={"file:" + "a" * 256: b"a"})
    expected = own.value.message().replace("'nope'", "'affine'")
    assert "failed to poll from model repository" in expected, expected
    assert refused.value.status() == own.value.status()
    assert refused.value.status() == ("StatusCode.INTERNAL" if grpc else "500")
    assert refused.value.message().startswith(expected), (refused.value.message(), expected)
    assert "255 bytes" in refused.value.message()
    assert client.is_server_live() and client.is_model_ready("affine")
    after = _infer(client)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
def test_tritons_model_control_calls_work_unchanged_with_the_opt_in(
    tmp_path: Path, module: Any
) -> None:
    """One worker with the opt-in: the gateway on the public ports (its start warns), the
    examples' calls without a header, the over-long ``file:`` step refused and the same
    tritonserver (same pid, no restart) serving on."""
    served = _serve(tmp_path, "--open-repository-api", env={ENV_KEY: KEY})
    ((pid, worker_http, worker_grpc),) = served.workers
    grpc = module is grpcclient
    client = module.InferenceServerClient(served.grpc if grpc else served.http)
    worker = module.InferenceServerClient(worker_grpc if grpc else worker_http)
    try:
        text = served.log.read_text()
        assert f"gateway gRPC    {served.grpc}" in text, text
        assert "auth.open_repository_api: model load and unload need no credential" in text
        assert worker_grpc != served.grpc and worker_http != served.http
        _model_control_calls(client)
        _over_long_file_override_is_refused(client, worker)
        with pytest.raises(InferenceServerException) as keyed:  # the worker keeps the key
            worker.unload_model("affine")
        assert "restricted" in keyed.value.message(), keyed.value.message()
        assert served.proc.poll() is None and Path(f"/proc/{pid}").exists()
        assert _workers(served.log) == served.workers  # not restarted
        assert "SIGABRT" not in served.log.read_text()
    finally:
        client.close()
        worker.close()
        stop_serve(served.proc)


def test_without_the_opt_in_one_worker_is_direct_and_the_load_is_refused(tmp_path: Path) -> None:
    """No opt-in: no gateway (the hot path has no extra hop), tritonserver on the public
    ports, its repository API behind the key."""
    served = _serve(tmp_path)
    try:
        ((_, worker_http, worker_grpc),) = served.workers
        assert (worker_grpc, worker_http) == (served.grpc, served.http)
        assert "gateway" not in served.log.read_text()
        client = grpcclient.InferenceServerClient(served.grpc)
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("affine")
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        assert "This protocol is restricted" in refused.value.message()
    finally:
        stop_serve(served.proc)


TOKEN = "control-token-0123456789"


def _two_workers(root: Path, *args: str) -> Iterator[dict[str, Any]]:
    """``serve --workers 2 ARGS`` of ``affine`` with a control token:
    ``{"grpc": gateway, "http": gateway, "workers": [worker gRPC, ...], "worker_http": [...]}``."""
    (root / "bundles").mkdir()
    (root / "bundles" / "affine").symlink_to(GOLDEN / "affine", target_is_directory=True)
    log = root / "serve.log"
    proc, grpc, http, _ = serve_two_workers(
        root / "bundles",
        log,
        "--admin-port",
        "0",
        *args,
        env={"HLOSERVE_CONTROL_TOKEN": TOKEN, ENV_KEY: KEY},
    )
    try:
        wait_for_line(log, r"hloserve: ready after", proc, 600)
        workers = _workers(log)
        assert len(workers) == 2
        yield {
            "grpc": f"127.0.0.1:{grpc}",
            "http": f"127.0.0.1:{http}",
            "workers": [g for _, _, g in workers],
            "worker_http": [h for _, h, _ in workers],
        }
    finally:
        stop_serve(proc)


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``serve --open-repository-api --workers 2`` (see :func:`_two_workers`)."""
    yield from _two_workers(tmp_path_factory.mktemp("open"), "--open-repository-api")


@pytest.fixture(scope="module")
def two_keyed_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``serve --workers 2`` without the opt-in (see :func:`_two_workers`)."""
    yield from _two_workers(tmp_path_factory.mktemp("keyed"))


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
def test_through_the_gateway_of_two_workers_the_same_calls_work_without_a_token(
    two_workers: dict[str, Any], module: Any
) -> None:
    """With ``--workers 2 --open-repository-api`` the gateway's model control needs no
    credential (``auth.open_repository_api``; docs/gateway.md, "Control plane:
    authentication"): the examples' calls without a header, the override reaching both
    workers, the over-long ``file:`` step refused before any worker; GatewayControl still
    needs the control token; the workers keep the key."""
    grpc = module is grpcclient
    client = module.InferenceServerClient(two_workers["grpc" if grpc else "http"])
    replicas = tuple(grpcclient.InferenceServerClient(w) for w in two_workers["workers"])
    worker = module.InferenceServerClient(
        two_workers["workers"][0] if grpc else two_workers["worker_http"][0]
    )
    try:
        _model_control_calls(client, None, replicas)
        _over_long_file_override_is_refused(client, worker)
        with grpc_channel(two_workers["grpc"]) as channel:
            control = pb_grpc.GatewayControlStub(channel)
            with pytest.raises(RpcError) as refused:
                control.GetSchedulingStatus(pb.GetSchedulingStatusRequest(), timeout=30)
            assert refused.value.code() == StatusCode.UNAUTHENTICATED
            bearer = (("authorization", f"Bearer {TOKEN}"),)
            control.GetSchedulingStatus(pb.GetSchedulingStatusRequest(), metadata=bearer)
        with pytest.raises(InferenceServerException) as keyed:
            replicas[0].unload_model("affine")
        assert "restricted" in keyed.value.message(), keyed.value.message()
    finally:
        for one in (client, worker, *replicas):
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


@pytest.mark.parametrize("module", [grpcclient, httpclient], ids=["grpc", "http"])
def test_through_the_gateway_without_the_opt_in_the_calls_work_with_the_control_token(
    two_keyed_workers: dict[str, Any], module: Any
) -> None:
    """Without ``--open-repository-api`` the gateway's model control needs the control token
    (docs/gateway.md, "Control plane: authentication"): the examples' first load without it is
    refused UNAUTHENTICATED / 401; with it as tritonclient's ``authorization: Bearer`` header
    the examples' whole sequence passes, the override reaching both workers."""
    grpc = module is grpcclient
    client = module.InferenceServerClient(two_keyed_workers["grpc" if grpc else "http"])
    replicas = tuple(grpcclient.InferenceServerClient(w) for w in two_keyed_workers["workers"])
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("affine")
        assert refused.value.status() == ("StatusCode.UNAUTHENTICATED" if grpc else "401"), (
            refused.value.status(),
            refused.value.message(),
        )
        _model_control_calls(client, {"authorization": f"Bearer {TOKEN}"}, replicas)
    finally:
        for one in (client, *replicas):
            one.close()
