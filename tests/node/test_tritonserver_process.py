"""A real tritonserver from the nvidia-pytriton wheel, run by hloserve.node.tritonserver.

Models are tiny Python models that move tensors by DLPack (``as_numpy()`` is not reliable
under numpy>=2 with the 2.51 stub: docs/notes_tritonserver.md, "Tensors in the stub"):
    add_one:      a Python-based backend ``addone`` (``<backend-dir>/addone/model.py``), FP32 + 1.
    add_two_bls:  the plain ``python`` backend, calls ``add_one`` twice by BLS.

``pb_utils.Tensor.from_dlpack(name, ndarray)`` alone wedges the 2.51 stub: it renames NumPy's
capsule to "used_dlpack", NumPy's capsule destructor only recognises "used_dltensor", and the
stub then spins printing "PyCapsule_GetPointer called with incorrect name" until Triton
declares it unhealthy. ``_to_pb`` hands over the capsule and renames it as NumPy expects.
"""

from __future__ import annotations

import dataclasses
import http.server
import importlib.util
import os
import signal
import socket
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from hloserve.errors import InvalidArgumentError, PortInUseError, TritonServerError
from hloserve.node import procfs
from hloserve.node import tritonserver as ts
from hloserve.node.triton_options import TritonServerOptions
from hloserve.ports import free_ports

pytestmark = [
    pytest.mark.tritonserver,
    pytest.mark.skipif(
        importlib.util.find_spec("pytriton") is None, reason="nvidia-pytriton not installed"
    ),
]

HELPER = '''
import ctypes

import numpy as np
import triton_python_backend_utils as pb_utils

_set_name = ctypes.pythonapi.PyCapsule_SetName
_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _to_pb(name, array):
    """NumPy array -> pb_utils.Tensor by DLPack; the tensor takes ownership of the capsule."""
    capsule = np.ascontiguousarray(array).__dlpack__()
    tensor = pb_utils.Tensor.from_dlpack(name, capsule)
    _set_name(capsule, b"used_dltensor")  # consumed, in the name NumPy's destructor checks
    return tensor
'''

ADD_ONE_BACKEND = (
    HELPER
    + """

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = np.from_dlpack(pb_utils.get_input_tensor_by_name(request, "INPUT0"))
            out = _to_pb("OUTPUT0", x + np.float32(1))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""
)

ADD_TWO_BLS = (
    HELPER
    + """

class TritonPythonModel:
    def _add_one(self, x):
        request = pb_utils.InferenceRequest(
            model_name="add_one",
            requested_output_names=["OUTPUT0"],
            inputs=[_to_pb("INPUT0", x)],
        )
        response = request.exec()
        if response.has_error():
            raise pb_utils.TritonModelException(response.error().message())
        return np.from_dlpack(pb_utils.get_output_tensor_by_name(response, "OUTPUT0")).copy()

    def execute(self, requests):
        responses = []
        for request in requests:
            x = np.from_dlpack(pb_utils.get_input_tensor_by_name(request, "INPUT0")).copy()
            out = _to_pb("OUTPUT0", self._add_one(self._add_one(x)))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""
)

BLS_TO_MISSING = (
    HELPER
    + """

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = np.from_dlpack(pb_utils.get_input_tensor_by_name(request, "INPUT0")).copy()
            bls = pb_utils.InferenceRequest(
                model_name="no_such_model",
                requested_output_names=["OUTPUT0"],
                inputs=[_to_pb("INPUT0", x)],
            ).exec()
            error = bls.error().message() if bls.has_error() else "no error"
            status = pb_utils.TritonError.UNAVAILABLE
            responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(error, status)))
        return responses
"""
)

BROKEN_BACKEND = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("hloserve-test: initialize refuses on purpose")

    def execute(self, requests):
        return []
"""


def _config(name: str, backend: str) -> str:
    return textwrap.dedent(f"""\
        name: "{name}"
        backend: "{backend}"
        max_batch_size: 8
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        instance_group [ {{ kind: KIND_CPU count: 1 }} ]
        """)


def _write_model(repo: Path, name: str, backend: str, model_py: str | None = None) -> None:
    version = repo / name / "1"
    version.mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(_config(name, backend))
    if model_py is not None:
        (version / "model.py").write_text(model_py)


def _backend_dir(root: Path, name: str, model_py: str) -> Path:
    directory = root / "backends_src" / name
    directory.mkdir(parents=True)
    (directory / "model.py").write_text(model_py)
    return directory


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    stat = procfs.proc_stat(pid)
    return stat is not None and stat[0] != "Z"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ts.TritonServer]:
    root = tmp_path_factory.mktemp("triton")
    repo = root / "repo"
    _write_model(repo, "add_one", "addone")
    _write_model(repo, "add_two_bls", "python", ADD_TWO_BLS)
    _write_model(repo, "bls_to_missing", "python", BLS_TO_MISSING)
    options = TritonServerOptions.on_free_ports(
        repo,
        extra_backend_dirs={"addone": _backend_dir(root, "addone", ADD_ONE_BACKEND)},
        log_file=root / "tritonserver.log",
        startup_timeout_s=90.0,
    )
    with ts.TritonServer(options) as server:
        yield server


def test_infer_grpc(server: ts.TritonServer) -> None:
    import tritonclient.grpc as grpcclient

    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    with grpcclient.InferenceServerClient(server.urls.grpc) as client:
        inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        result = client.infer("add_one", [inp])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + 1)
        n = 200
        start = time.perf_counter()
        for _ in range(n):
            client.infer("add_one", [inp])
        per_request_ms = (time.perf_counter() - start) / n * 1e3
    print(f"add_one gRPC sequential: {per_request_ms:.3f} ms/request")


def test_infer_http(server: ts.TritonServer) -> None:
    import tritonclient.http as httpclient

    x = np.full((3, 4), -2.5, dtype=np.float32)
    client = httpclient.InferenceServerClient(server.urls.http)
    try:
        inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        result = client.infer("add_one", [inp])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + 1)
    finally:
        client.close()


def test_bls_chains_two_calls(server: ts.TritonServer) -> None:
    import tritonclient.grpc as grpcclient

    x = np.array([[0.5, 1.5, -1.0, 100.0]], dtype=np.float32)
    with grpcclient.InferenceServerClient(server.urls.grpc) as client:
        inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        result = client.infer("add_two_bls", [inp])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + 2)
        n = 100
        start = time.perf_counter()
        for _ in range(n):
            client.infer("add_two_bls", [inp])
        per_request_ms = (time.perf_counter() - start) / n * 1e3
    print(f"add_two_bls (2 BLS calls) gRPC sequential: {per_request_ms:.3f} ms/request")
    assert server.options.log_file is not None
    assert "Exception ignored" not in server.options.log_file.read_text()


def test_bls_to_a_missing_model_returns_an_error_response(server: ts.TritonServer) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    x = np.zeros((1, 4), dtype=np.float32)
    with grpcclient.InferenceServerClient(server.urls.grpc) as client:
        inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException) as info:
            client.infer("bls_to_missing", [inp])
    print(f"BLS to a missing model, gRPC: {info.value.status()} {info.value.message()}")
    assert "no_such_model" in str(info.value.message())
    assert info.value.status() == "StatusCode.UNAVAILABLE"  # the code the model chose
    http = httpclient.InferenceServerClient(server.urls.http)
    try:
        hinp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        hinp.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException) as hinfo:
            http.infer("bls_to_missing", [hinp])
    finally:
        http.close()
    print(f"BLS to a missing model, HTTP: {hinfo.value.status()} {hinfo.value.message()}")
    assert hinfo.value.status() == "503"


def test_stubs_run_in_server_session(server: ts.TritonServer) -> None:
    assert server.pid is not None
    pids = procfs.session_pids(server.pid)
    stubs = [p for p in pids if "triton_python_backend_stub" in _cmdline(p)]
    assert len(stubs) == 3, {p: _cmdline(p) for p in pids}  # one instance per model


def test_second_server_on_same_ports_is_refused(server: ts.TritonServer) -> None:
    other = ts.TritonServer(server.options)
    with pytest.raises(PortInUseError, match=rf"http port 127\.0\.0\.1:{server.options.http_port}"):
        other.start()
    assert other.pid is None


def test_port_taken_after_check_fails_clearly(tmp_path: Path) -> None:
    """Triton itself exits when it cannot bind; a foreign 200 on the port is not "ready"."""

    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    repo = tmp_path / "repo"
    _write_model(repo, "add_two_bls", "python", ADD_TWO_BLS)
    options = TritonServerOptions.on_free_ports(repo, log_file=tmp_path / "log.txt")
    foreign = http.server.ThreadingHTTPServer(("127.0.0.1", options.http_port), Ready)
    thread = threading.Thread(target=foreign.serve_forever, daemon=True)
    thread.start()
    server = ts.TritonServer(options)
    try:
        with mock.patch.object(ts, "check_ports_free"):
            server.start()
        with pytest.raises(TritonServerError, match="exited with code") as info:
            server.wait_ready(60.0)
        assert f"127.0.0.1:{options.http_port}' already in use" in str(info.value)
    finally:
        server.stop()
        foreign.shutdown()
        foreign.server_close()
        thread.join(timeout=5)


def test_wait_ready_reports_model_failure_with_log_tail(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _write_model(repo, "broken", "python", BROKEN_BACKEND)
    options = TritonServerOptions.on_free_ports(repo)  # output forwarded, tail kept
    server = ts.TritonServer(options)
    server.start()
    try:
        with pytest.raises(TritonServerError, match="initialize refuses on purpose"):
            server.wait_ready(60.0)
    finally:
        server.stop()


def test_an_argument_tritonserver_refuses_is_named_before_its_usage_text(tmp_path: Path) -> None:
    """tritonserver prints "unrecognized option" first, then ~400 lines of usage: the error
    keeps the first lines as well as the last."""
    repo = tmp_path / "repo"
    _write_model(repo, "broken", "python", BROKEN_BACKEND)
    options = dataclasses.replace(
        TritonServerOptions.on_free_ports(repo), extra_args=("--bogus-flag=1",)
    )
    server = ts.TritonServer(options)
    server.start()
    try:
        with pytest.raises(TritonServerError) as info:
            server.wait_ready(60.0)
    finally:
        server.stop()
    message = str(info.value)
    assert "exited with code 1 before it was ready" in message, message[:500]
    assert "unrecognized option '--bogus-flag=1'" in message, message[:500]
    assert message.count("\n") < 70  # the head, "...", the tail: not the whole usage text


def test_stop_leaves_no_process_nor_files(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _write_model(repo, "add_one", "addone")
    _write_model(repo, "add_two_bls", "python", ADD_TWO_BLS)
    options = TritonServerOptions.on_free_ports(
        repo,
        extra_backend_dirs={"addone": _backend_dir(tmp_path, "addone", ADD_ONE_BACKEND)},
        log_file=tmp_path / "log.txt",
    )
    server = ts.TritonServer(options)
    t0 = time.perf_counter()
    server.start()
    waited = server.wait_ready(90.0)
    print(f"tritonserver ready in {time.perf_counter() - t0:.2f} s (waited {waited:.2f} s)")
    assert server.pid is not None
    session = server.pid
    pids = procfs.session_pids(session)
    assert session in pids and len(pids) >= 3, pids  # server + two stubs
    run_dir = server._run_dir
    assert run_dir is not None and (run_dir / "backends" / "python").is_dir()
    assert any(Path("/dev/shm").glob(f"{server._shm_prefix}*"))
    t0 = time.perf_counter()
    server.stop(timeout_s=30.0)
    print(f"tritonserver stopped in {time.perf_counter() - t0:.2f} s")
    assert procfs.session_pids(session) == []
    assert not any(_alive(p) for p in pids)
    assert not run_dir.exists()
    assert not any(Path("/dev/shm").glob(f"{server._shm_prefix}*"))
    server.stop()  # idempotent


def test_stop_kills_a_server_that_ignores_sigterm(tmp_path: Path) -> None:
    """SIGKILL reaches stubs too: they share the server's process group."""
    repo = tmp_path / "repo"
    _write_model(repo, "add_two_bls", "python", ADD_TWO_BLS)
    options = TritonServerOptions.on_free_ports(repo, log_file=tmp_path / "log.txt")
    server = ts.TritonServer(options)
    server.start()
    server.wait_ready(90.0)
    assert server.pid is not None
    session = server.pid
    pids = procfs.session_pids(session)
    os.kill(session, signal.SIGSTOP)  # the server can no longer act on SIGTERM
    server.stop(timeout_s=1.0)
    assert procfs.session_pids(session) == []
    assert not any(_alive(p) for p in pids)


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = free_ports(5)
    assert len(set(ports)) == 5
    for port in ports:
        assert 10000 <= port < ephemeral_low  # no self-connect when polled before bound
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    base, *rest = free_ports(3, contiguous=True)
    assert rest == [base + 1, base + 2]


def test_backend_dir_without_model_py_is_rejected(tmp_path: Path) -> None:
    options = TritonServerOptions.on_free_ports(tmp_path, extra_backend_dirs={"empty": tmp_path})
    server = ts.TritonServer(options)
    with pytest.raises(InvalidArgumentError, match=r"has no model\.py"):
        server.start()
    assert server.pid is None
