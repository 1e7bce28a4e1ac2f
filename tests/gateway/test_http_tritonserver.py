"""KServe HTTP through the gateway to two real tritonservers: the repository index merged and
system shared memory fanned out (issue 12; docs/gateway.md, "KServe HTTP").

Worker 0 serves ``affine`` and ``left``, worker 1 ``affine`` and ``right`` (copies of the
golden ``affine`` bundle), so the index through the gateway is a merge, and requests for
``affine`` reach both workers round robin. tritonclient's stock HTTP client talks to the
gateway's HTTP port (HAProxy); errors are compared byte for byte with a worker's own answer.
Regions are made with the standard library's ``multiprocessing.shared_memory``
(``tritonclient.utils.shared_memory`` imports ``pkg_resources``, which setuptools >= 81 no
longer has). The last test stops worker 1.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import ssl
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.gateway.config import GatewayConfig, TlsConfig
from hloserve.model_control import http_headers, local_key
from hloserve.model_repository_tools.build import build_repository
from hloserve.node.gateway_thread import GatewayThread
from hloserve.node.tritonserver import TritonServer
from tests.conftest import GOLDEN, serving_options
from tests.gateway.test_haproxy import _self_signed

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow]

httpclient = pytest.importorskip("tritonclient.http")

SHM = "/v2/systemsharedmemory"
#: Free ports for a gateway (model_copy: the config's validators want concrete ports).
FREE_PORTS = {"listen": "127.0.0.1:0", "admin_port": 0, "http_listen": "127.0.0.1:0"}


@dataclass
class Fleet:
    servers: list[TritonServer]
    gateway: GatewayThread
    http: str  # the gateway's KServe HTTP host:port

    def client(self) -> Any:
        return httpclient.InferenceServerClient(self.http)

    def direct(self, worker: int) -> Any:
        return httpclient.InferenceServerClient(self.servers[worker].urls.http)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("gateway_http")
    repos = []
    for own in ("left", "right"):
        bundles = root / own / "bundles"
        for name in ("affine", own):
            shutil.copytree(GOLDEN / "affine", bundles / name)
        build_repository(bundles, root / own / "repository")
        repos.append(root / own / "repository")
    with ExitStack() as stack:
        servers = [stack.enter_context(TritonServer(serving_options(r))) for r in repos]
        config = GatewayConfig(
            workers=tuple(s.urls.grpc for s in servers),
            worker_http=tuple(s.urls.http for s in servers),
        )
        gateway = GatewayThread(config.model_copy(update=FREE_PORTS))
        stack.callback(gateway.close)
        assert gateway.http_address is not None
        yield Fleet(servers, gateway, gateway.http_address)


def _call(
    address: str,
    method: str,
    path: str,
    body: bytes | None = None,
    context: ssl.SSLContext | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    host, _, port = address.rpartition(":")
    connection = (
        http.client.HTTPSConnection(host, int(port), timeout=30, context=context)
        if context is not None
        else http.client.HTTPConnection(host, int(port), timeout=30)
    )
    try:
        connection.request(method, path, body=body, headers=headers or {})
        reply = connection.getresponse()
        return reply.status, reply.read()
    finally:
        connection.close()


@contextmanager
def _made(**sizes: int) -> Iterator[dict[str, SharedMemory]]:
    """POSIX shared-memory segments, one per name; a segment's key is "/" + its name."""
    made: dict[str, SharedMemory] = {}
    try:
        for n, size in sizes.items():
            made[n] = SharedMemory(f"hloserve-gwh-{os.getpid()}-{n}", create=True, size=size)
        yield made
    finally:
        for segment in made.values():
            segment.close()
            segment.unlink()


def _key(segment: SharedMemory) -> str:
    return "/" + segment.name


def _index(address: str) -> list[dict[str, str]]:
    status, body = _call(address, "POST", "/v2/repository/index", headers=http_headers(local_key()))
    assert status == 200, body
    rows: list[dict[str, str]] = json.loads(body)
    return rows


def _regions(address: str) -> set[str]:
    status, body = _call(address, "GET", f"{SHM}/status")
    assert status == 200, body
    return {row["name"] for row in json.loads(body)}


def _affine(client: Any, x: np.ndarray) -> np.ndarray:
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    result: np.ndarray = client.infer("affine", [tensor]).as_numpy("y")
    return result


def test_the_http_index_is_every_workers_merged(fleet: Fleet) -> None:
    """Rows as the workers wrote them (no key needed: the gateway sends the workers' own),
    sorted by name; the gRPC index holds the same rows."""
    import tritonclient.grpc as grpcclient

    status, body = _call(fleet.http, "POST", "/v2/repository/index")
    assert status == 200, body
    merged = json.loads(body)
    direct = [_index(s.urls.http) for s in fleet.servers]
    rows = {json.dumps(row, sort_keys=True): row for rows in direct for row in rows}
    assert merged == sorted(rows.values(), key=lambda r: (r["name"], r["version"]))
    names = [row["name"] for row in merged]
    assert names == ["affine", "hloserve_runtime", "left", "right"]
    assert {"left", "right"} & {r["name"] for r in direct[0]} == {"left"}
    assert all(set(row) == {"name", "version", "state"} for row in merged)  # no empty reason
    assert body == json.dumps(merged, separators=(",", ":")).encode()  # Triton's compact JSON
    assert fleet.client().get_model_repository_index() == merged
    grpc_index = grpcclient.InferenceServerClient(fleet.gateway.address)
    by_grpc = grpc_index.get_model_repository_index().models
    assert [(m.name, m.version, m.state) for m in by_grpc] == [
        (r["name"], r["version"], r["state"]) for r in merged
    ]


def test_a_region_registered_over_http_reaches_every_worker_and_serves_inference(
    fleet: Fleet,
) -> None:
    """Input and output in system shared memory; requests go to both workers round robin and
    answer as a direct call does; unregistering removes the regions from every worker."""
    client = fleet.client()
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    expected = _affine(fleet.direct(0), x)
    with _made(i=x.nbytes, o=expected.nbytes) as made:
        np.ndarray(x.shape, np.float32, buffer=made["i"].buf)[:] = x
        y = np.ndarray(expected.shape, np.float32, buffer=made["o"].buf)
        client.register_system_shared_memory("gwh_in", _key(made["i"]), x.nbytes)
        client.register_system_shared_memory("gwh_out", _key(made["o"]), expected.nbytes)
        for server in fleet.servers:  # each worker's own status lists both
            assert _regions(server.urls.http) == {"gwh_in", "gwh_out"}
        status = client.get_system_shared_memory_status(region_name="gwh_in")
        assert status == fleet.direct(1).get_system_shared_memory_status(region_name="gwh_in")
        assert status == [{"name": "gwh_in", "key": _key(made["i"]), "offset": 0, "byte_size": 32}]
        before = [_successes(fleet.direct(i)) for i in (0, 1)]
        for i in range(4):  # round robin over both workers
            tensor = httpclient.InferInput("x", [2, 4], "FP32")
            tensor.set_shared_memory("gwh_in", x.nbytes)
            output = httpclient.InferRequestedOutput("y", binary_data=True)
            output.set_shared_memory("gwh_out", expected.nbytes)
            y[:] = 0
            client.infer("affine", [tensor], outputs=[output], request_id=str(i))
            np.testing.assert_array_equal(y, expected)
        after = [_successes(fleet.direct(i)) for i in (0, 1)]
        assert all(a > b for a, b in zip(after, before, strict=True))  # both workers served
        del y  # the view holds the segment's buffer
        client.unregister_system_shared_memory("gwh_in")
        for server in fleet.servers:
            assert _regions(server.urls.http) == {"gwh_out"}
        client.unregister_system_shared_memory()
        for server in fleet.servers:
            assert _regions(server.urls.http) == set()


def _successes(client: Any) -> int:
    stats = client.get_inference_statistics("affine")["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"])


def test_bad_shared_memory_calls_get_tritons_own_answers(fleet: Fleet) -> None:
    """Status code and body equal a worker's own answer; nothing stays registered; a region
    one worker refuses is rolled back from the other; the gateway keeps serving."""
    cases = [
        ("GET", f"{SHM}/region/gwh_zz/status", None, 404, "Unable to find system shared memory"),
        ("POST", f"{SHM}/region/gwh_zz/unregister", None, 200, ""),  # as Triton: not an error
        ("POST", f"{SHM}/region/gwh_r/register", b'{"key":"/hloserve-gwh-nope","offset":0,'
         b'"byte_size":64}', 500, "Unable to open shared memory region: '/hloserve-gwh-nope'"),
        ("POST", f"{SHM}/region/gwh_r/register", b'{"key":"KEY","offset":0,'
         b'"byte_size":1048576}', 400, "failed to register shared memory region 'gwh_r'"),
        ("POST", f"{SHM}/region/gwh_r/register", b'{"offset":0,"byte_size":64}', 400,
         "Shared memory register request has no 'key' field"),
        ("POST", f"{SHM}/region/gwh_r/register", b"{bad", 500, "failed to parse the request"),
        ("GET", f"{SHM}/region/gwh_r/register", None, 405, "Method Not Allowed"),
        ("GET", f"{SHM}/nothing", None, 404, "Not Found"),
        ("GET", "/v2/repository/index", None, 405, "Method Not Allowed"),
    ]  # fmt: skip
    keyed = http_headers(local_key())  # the gateway sends the key on index calls
    with _made(bad=64) as made:
        key = _key(made["bad"]).encode()
        for method, path, body, code, message in cases:
            body = body.replace(b"KEY", key) if body else body
            through = _call(fleet.http, method, path, body)
            own = _call(fleet.servers[0].urls.http, method, path, body, headers=keyed)
            assert through == own, (method, path)
            assert through[0] == code and message in through[1].decode(), (path, through)
            for server in fleet.servers:
                assert _regions(server.urls.http) == set(), path
        # worker 1 holds "gwh_dup" already: it refuses, worker 0's registration is undone
        good = b'{"key":"KEY","offset":0,"byte_size":64}'.replace(b"KEY", key)
        path = f"{SHM}/region/gwh_dup/register"
        assert _call(fleet.servers[1].urls.http, "POST", path, good)[0] == 200
        status, body = _call(fleet.http, "POST", path, good)
        assert (status, json.loads(body)) == (
            400,
            {"error": "shared memory region 'gwh_dup' already in manager"},
        )
        assert _regions(fleet.servers[0].urls.http) == set()
        assert _regions(fleet.servers[1].urls.http) == {"gwh_dup"}
        assert _call(fleet.http, "POST", f"{SHM}/unregister")[0] == 200
        assert _regions(fleet.servers[1].urls.http) == set()
    x = np.ones((1, 4), np.float32)  # still serving
    np.testing.assert_array_equal(_affine(fleet.client(), x), _affine(fleet.direct(0), x))
    assert _call(fleet.http, "POST", "/v2/repository/index")[0] == 200


def test_index_and_shared_memory_through_the_tls_port(fleet: Fleet, tmp_path: Path) -> None:
    """A second gateway on the same workers with TLS: the same paths answer over HTTPS."""
    cert, key = _self_signed(tmp_path)
    tls = TlsConfig(cert=cert, key=key)
    gateway = GatewayThread(fleet.gateway.config.model_copy(update={**FREE_PORTS, "tls": tls}))
    try:
        address = gateway.http_address
        assert address is not None
        context = ssl.create_default_context(cafile=str(cert))
        index = _call(address, "POST", "/v2/repository/index", context=context)
        assert index == _call(fleet.http, "POST", "/v2/repository/index")
        with _made(tls=64) as made:
            register = json.dumps({"key": _key(made["tls"]), "offset": 0, "byte_size": 64})
            path = f"{SHM}/region/gwh_tls/register"
            assert _call(address, "POST", path, register.encode(), context) == (200, b"")
            for server in fleet.servers:
                assert _regions(server.urls.http) == {"gwh_tls"}
            status, body = _call(address, "GET", f"{SHM}/region/gwh_tls/status", context=context)
            assert status == 200 and json.loads(body)[0]["name"] == "gwh_tls"
            path = f"{SHM}/region/gwh_tls/unregister"
            assert _call(address, "POST", path, None, context) == (200, b"")
            for server in fleet.servers:
                assert _regions(server.urls.http) == set()
        with pytest.raises((ConnectionError, http.client.HTTPException)):
            _call(address, "POST", "/v2/repository/index")  # plaintext on the TLS port
    finally:
        gateway.close()


def _stats(address: str, path: str) -> tuple[int, Any]:
    status, body = _call(address, "GET", path)
    return status, json.loads(body)


def test_http_statistics_are_every_workers_summed(fleet: Fleet) -> None:
    """``affine`` is on both workers: its counts through the gateway are the two workers'
    sums; ``left`` is on worker 0 only: its statistics are worker 0's own; the all-models
    form lists every model of either worker; a model no worker has gets Triton's own error."""
    client = fleet.client()
    for i in range(6):  # round robin: both workers serve some
        _affine(client, np.full((1, 4), i, np.float32))
    client.close()
    direct = [_stats(s.urls.http, "/v2/models/affine/stats")[1] for s in fleet.servers]
    counts = [d["model_stats"][0]["inference_count"] for d in direct]
    assert all(c > 0 for c in counts), counts
    for path in ("/v2/models/affine/stats", "/v2/models/affine/versions/1/stats"):
        status, merged = _stats(fleet.http, path)
        assert status == 200, merged
        (row,) = merged["model_stats"]
        assert (row["name"], row["version"]) == ("affine", "1")
        assert row["inference_count"] == sum(counts)
        assert row["execution_count"] == sum(d["model_stats"][0]["execution_count"] for d in direct)
        success = [d["model_stats"][0]["inference_stats"]["success"] for d in direct]
        assert row["inference_stats"]["success"] == {
            "count": sum(s["count"] for s in success),
            "ns": sum(s["ns"] for s in success),
        }
    assert _stats(fleet.http, "/v2/models/left/stats") == _stats(
        fleet.servers[0].urls.http, "/v2/models/left/stats"
    )
    status, every = _stats(fleet.http, "/v2/models/stats")
    assert status == 200
    names = [r["name"] for r in every["model_stats"]]
    assert names == ["affine", "hloserve_runtime", "left", "right"]
    nope = _call(fleet.http, "GET", "/v2/models/nope/stats")
    assert nope == _call(fleet.servers[0].urls.http, "GET", "/v2/models/nope/stats")
    assert nope[0] >= 400
    grpc_like = fleet.client().get_inference_statistics("affine")  # tritonclient's own call
    assert grpc_like["model_stats"][0]["inference_count"] == sum(counts)


@pytest.mark.filterwarnings("ignore:pkg_resources is deprecated:UserWarning")
def test_tritonclients_own_shared_memory_helpers_work_through_the_gateway(fleet: Fleet) -> None:
    """``tritonclient.utils.shared_memory`` imports ``pkg_resources``: the serving extra pins
    setuptools below 81, which still ships it."""
    import tritonclient.utils.shared_memory as shm

    handle = shm.create_shared_memory_region("gwh_tc", "/gwh_tc", 64)
    client = fleet.client()
    try:
        client.register_system_shared_memory("gwh_tc", "/gwh_tc", 64)
        assert "gwh_tc" in {r["name"] for r in client.get_system_shared_memory_status()}
        assert "gwh_tc" in _regions(fleet.servers[1].urls.http)  # on every worker
        client.unregister_system_shared_memory("gwh_tc")
    finally:
        client.close()
        shm.destroy_shared_memory_region(handle)


def test_with_a_worker_stopped_register_fails_whole_and_the_rest_still_answers(
    fleet: Fleet,
) -> None:
    """Runs last: it stops worker 1. Register is refused (503 naming the worker) and not left
    on worker 0; unregister and status answer from worker 0; the index is worker 0's."""
    stopped = fleet.servers[1].urls.http
    fleet.servers[1].stop()
    with _made(one=64) as made:
        body = json.dumps({"key": _key(made["one"]), "offset": 0, "byte_size": 64}).encode()
        status, answer = _call(fleet.http, "POST", f"{SHM}/region/gwh_one/register", body)
        assert status == 503
        assert f"worker {stopped}: ConnectionRefusedError" in answer.decode()
        assert _regions(fleet.servers[0].urls.http) == set()
    assert _call(fleet.http, "POST", f"{SHM}/unregister")[0] == 200
    assert _regions(fleet.http) == set()
    status, answer = _call(fleet.http, "POST", "/v2/repository/index")
    assert status == 200
    assert [r["name"] for r in json.loads(answer)] == ["affine", "hloserve_runtime", "left"]


def _expect_continue(address: str, path: str, length: int) -> tuple[int, bytes]:
    """POST headers announcing ``length`` bytes with ``Expect: 100-continue``; the answer that
    comes before any of the body is sent (status, body)."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        reply = http.client.HTTPResponse(sock)
        reply.begin()
        return reply.status, reply.read()


def test_a_json_body_over_the_limit_is_refused_and_the_workers_keep_serving(
    fleet: Fleet,
) -> None:
    """tritonserver 2.51 dies parsing a JSON body of ~4 MiB: the gateway answers 400 and sends
    nothing on; a JSON body under the limit, and binary data after a small header, pass."""
    from hloserve.gateway.dataplane import HTTP_MAX_JSON_BYTES

    request = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1] * 4}]}
    text = json.dumps(request)
    running = {s.pid: s for s in fleet.servers if s.is_running()}  # an earlier test stops one
    # the answer comes on the headers (as curl sends a large body: Expect: 100-continue)
    status, body = _expect_continue(fleet.http, "/v2/models/affine/infer", HTTP_MAX_JSON_BYTES + 1)
    assert status == 400, body[:300]
    assert f"limit of {HTTP_MAX_JSON_BYTES} bytes" in json.loads(body)["error"]
    header = json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32"}]}
    ).encode()  # a binary-extension request whose header claims a JSON part over the limit
    status, body = _call(
        fleet.http,
        "POST",
        "/v2/models/affine/infer",
        header + bytes(16),
        headers={"Inference-Header-Content-Length": str(HTTP_MAX_JSON_BYTES + 1)},
    )
    assert status == 400 and b"limit of" in body, body[:300]
    under = (text + " " * (3_000_000 - len(text))).encode()
    status, body = _call(fleet.http, "POST", "/v2/models/affine/infer", under)
    assert status == 200, body[:300]
    assert json.loads(body)["outputs"][0]["name"] == "y"
    client = fleet.client()
    x = np.ones((1, 4), np.float32)
    tensor = httpclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    assert client.infer("affine", [tensor]).as_numpy("y").shape == (1, 3)
    client.close()
    assert running and all(s.is_running() and s.pid == pid for pid, s in running.items())


def test_a_json_request_whose_data_does_not_fill_its_shape_never_reaches_a_worker(
    fleet: Fleet,
) -> None:
    """tritonserver 2.51 aborts (std::bad_alloc) on a JSON request declaring a shape it cannot
    allocate: the gateway answers it as Triton answers a small mismatch (500, naming the
    model, the input and both counts) and the workers keep serving; a JSON request that fills
    its shape is answered as a worker answers it, binary outputs included."""
    running = {s.pid: s for s in fleet.servers if s.is_running()}  # an earlier test stops one
    absurd = {"inputs": [{"name": "x", "shape": [1, 10**12], "datatype": "FP32", "data": [1, 2]}]}
    text = json.dumps(absurd).encode()
    whole = {"Inference-Header-Content-Length": str(len(text))}  # as tritonclient C++ sends
    for path, headers in (
        ("/v2/models/affine/infer", None),
        ("/v2/models/affine/versions/1/infer", None),
        ("/v2/models/affine/infer", whole),
    ):
        status, body = _call(fleet.http, "POST", path, text, headers=headers)
        assert status == 500, body[:300]
        error = json.loads(body)["error"]
        assert error.startswith("Unable to parse 'data': Shape does not match true shape")
        assert "model 'affine', input 'x': shape [1, 1000000000000] declares" in error
        assert "1000000000000 elements, 'data' holds 2" in error
    assert running and all(s.is_running() and s.pid == pid for pid, s in running.items())
    worker = next(i for i, s in enumerate(fleet.servers) if s.is_running())
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 7
    answers = []
    for client in (fleet.client(), fleet.direct(worker)):
        tensor = httpclient.InferInput("x", [2, 4], "FP32")
        tensor.set_data_from_numpy(x, binary_data=False)  # the tensor in the JSON
        wanted = [
            httpclient.InferRequestedOutput("y", binary_data=True),  # a binary output
            httpclient.InferRequestedOutput("label", binary_data=False),
        ]
        result = client.infer("affine", [tensor], outputs=wanted)
        answers.append((result.as_numpy("y"), result.as_numpy("label")))
        client.close()
    (y, label), (y_direct, label_direct) = answers
    assert y.shape == (2, 3) and y.tobytes() == y_direct.tobytes()
    assert label.tolist() == label_direct.tolist()
    unknown = json.dumps({"inputs": []}).encode()
    status, body = _call(fleet.http, "POST", "/v2/models/nope/infer", unknown)
    direct = _call(fleet.servers[worker].urls.http, "POST", "/v2/models/nope/infer", unknown)
    assert (status, body) == direct
