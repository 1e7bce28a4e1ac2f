"""The control plane's KServe HTTP server alone (issue 12): HAProxy's rule for it, and its own
answers when no worker can give one. Triton's answers through it, with real tritonservers:
``tests/gateway/test_http_tritonserver.py``."""

from __future__ import annotations

import http.client
import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from hloserve.gateway.config import GatewayConfig
from hloserve.gateway.dataplane import (
    HTTP_ANY_BACKEND,
    HTTP_CONTROL_BACKEND,
    HTTP_MODEL_CONTROL_BACKEND,
    Layout,
    Listen,
    render_config,
)
from hloserve.gateway.fleet_http import (
    MAX_BODY_BYTES,
    FleetHttp,
    FleetHttpServer,
    json_data_mismatch,
)
from hloserve.gateway.haproxy import find_haproxy
from hloserve.ports import free_ports


@pytest.fixture
def dead_fleet() -> Iterator[FleetHttpServer]:
    """The server in front of one worker whose port nobody listens on."""
    fleet = FleetHttp([f"127.0.0.1:{free_ports(1)[0]}"], request_timeout_s=5, probe_timeout_s=5)
    server = FleetHttpServer(fleet)
    server.start()
    yield server
    server.close()


def _call(
    address: str, method: str, path: str, body: bytes | None = None, **headers: str
) -> tuple[int, bytes]:
    host, _, port = address.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers)
        reply = connection.getresponse()
        return reply.status, reply.read()
    finally:
        connection.close()


def test_no_worker_answering_is_503_naming_the_worker(dead_fleet: FleetHttpServer) -> None:
    worker = dead_fleet.fleet.workers[0]
    for method, path in (
        ("POST", "/v2/repository/index"),
        ("POST", "/v2/systemsharedmemory/region/r/register"),
        ("POST", "/v2/systemsharedmemory/unregister"),
        ("GET", "/v2/systemsharedmemory/status"),
        ("POST", "/v2/cudasharedmemory/region/r/register"),
        ("POST", "/v2/cudasharedmemory/region/r/unregister"),
        ("GET", "/v2/cudasharedmemory/status"),
        ("POST", "/v2/repository/models/m/load"),
    ):
        status, body = _call(dead_fleet.address, method, path, b"{}")
        assert status == 503, (path, body)
        message = json.loads(body)["error"]
        assert f"worker {worker}: ConnectionRefusedError" in message
        assert "no worker answered" in message


def test_a_body_without_length_or_too_long_is_refused(dead_fleet: FleetHttpServer) -> None:
    path = "/v2/systemsharedmemory/region/r/register"
    status, body = _call(
        dead_fleet.address, "POST", path, iter([b"{}"]), **{"Transfer-Encoding": "chunked"}
    )
    assert status == 400
    assert json.loads(body) == {"error": f"gateway: {path}: send the body with a Content-Length"}
    status, body = _call(
        dead_fleet.address, "POST", path, b"", **{"Content-Length": str(MAX_BODY_BYTES + 1)}
    )
    assert status == 400 and f"Content-Length must be 0 to {MAX_BODY_BYTES} bytes" in body.decode()
    assert _call(dead_fleet.address, "GET", "/v2/systemsharedmemory/status")[0] == 503


def test_a_worker_index_that_is_not_a_list_is_left_out() -> None:
    """A worker answering 200 with something other than Triton's JSON list is not merged."""

    class Garbage(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"nope")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    worker = ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=worker.serve_forever, daemon=True).start()
    fleet = FleetHttp([f"127.0.0.1:{worker.server_address[1]}"], 5, 5)
    try:
        answer = fleet.answer("POST", "/v2/repository/index", b"", {})
        assert answer.status == 503
        assert "its repository index is not a JSON list of objects" in answer.body.decode()
    finally:
        fleet.close()
        worker.shutdown()
        worker.server_close()


@pytest.mark.skipif(
    subprocess.run(["sh", "-c", "command -v haproxy || test -x /usr/sbin/haproxy"]).returncode,
    reason="HAProxy is not installed (apt-get install haproxy; scripts/env.sh does it)",
)
def test_haproxy_sends_index_shared_memory_and_model_control_to_the_control_plane(
    tmp_path: Path,
) -> None:
    """The rules are in the one KServe HTTP frontend, so the TLS port has them too; model
    load/unload waits longer; ``haproxy -c`` accepts the configuration without a warning."""
    config = GatewayConfig(
        workers=("127.0.0.1:8101", "127.0.0.1:8104"),
        worker_http=("127.0.0.1:8100", "127.0.0.1:8103"),
        http_listen="127.0.0.1:8000",
    )
    (tmp_path / "models.map").write_text("")
    listen = Listen(
        grpc="127.0.0.1:8001",
        control="127.0.0.1:9001",
        runtime_socket=str(tmp_path / "runtime.sock"),
        map_file=str(tmp_path / "models.map"),
        http=config.http_listen,
        http_control="127.0.0.1:9002",
        http_checked="127.0.0.1:9003",
    )
    text = render_config(Layout(), config, listen, str(tmp_path / "master.sock"))
    rules = [
        f"  use_backend {HTTP_CONTROL_BACKEND} if {{ path /v2/repository/index }}"
        " || { path_beg /v2/systemsharedmemory } || { path_beg /v2/cudasharedmemory }",
        f"  use_backend {HTTP_MODEL_CONTROL_BACKEND}"
        " if { path_reg ^/v2/repository/models/[^/]+/(load|unload)$ }",
        f"  use_backend {HTTP_CONTROL_BACKEND} if {{ path_end /stats }}"
        " { path_reg ^/v2/models(/[^/]+(/versions/[^/]+)?)?/stats$ }",
    ]
    frontend, checked = (
        text.split("frontend http\n")[1].split("\nbackend ")[0].split("frontend http_checked\n")
    )
    assert all(rule in frontend.splitlines() for rule in rules)
    by_model = "  use_backend %[var(txn.hbe)] if { var(txn.hbe) -m found }"
    lines = frontend.splitlines()  # before the by-model rule, which would take the stats
    assert lines.index(rules[2]) < lines.index(by_model)
    # an inference request whose tensors are all in the JSON (no binary data extension, or
    # a JSON part as long as the body): checked by the control plane
    infer = "{ path_beg /v2/models/ } { path_end /infer }"
    binary = "{ req.hdr(inference-header-content-length) -m found }"
    json_rules = [
        "  http-request set-var(txn.json_bytes) req.hdr_val(inference-header-content-length)"
        f" if {infer} {binary}",
        f"  use_backend {HTTP_CONTROL_BACKEND} if {infer} !{binary} || {infer}"
        " { req.hdr_val(content-length),sub(txn.json_bytes) -m int le 0 }",
    ]
    assert lines.index(json_rules[0]) < lines.index(json_rules[1]) < lines.index(by_model)
    # which re-sends it to the loopback frontend: the same routes, those rules left out
    assert checked.splitlines()[0] == "  bind 127.0.0.1:9003"
    assert checked.splitlines()[1:] == [line for line in lines[1:] if line not in json_rules]
    backend = f"backend {HTTP_CONTROL_BACKEND}\n  timeout server 73000ms\n"  # 60 + 8 + 5 s
    assert backend + "  server control 127.0.0.1:9002\n" in text
    backend = f"backend {HTTP_MODEL_CONTROL_BACKEND}\n  timeout server 3600s\n"
    assert backend + "  server control 127.0.0.1:9002\n" in text
    assert f"default_backend {HTTP_ANY_BACKEND}" in frontend
    without = render_config(
        Layout(), config, Listen(**{**listen.__dict__, "http_control": None}), "m"
    )
    assert HTTP_CONTROL_BACKEND not in without and "http_checked" not in without
    (tmp_path / "haproxy.cfg").write_text(text)
    check = subprocess.run(
        [find_haproxy(), "-c", "-f", str(tmp_path / "haproxy.cfg")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "WARNING" not in check.stdout + check.stderr


@pytest.mark.parametrize(
    ("inputs", "problem"),
    [
        ([{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3, 4]}], None),
        ([{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4]]}], None),
        ([{"name": "s", "shape": [2], "datatype": "BYTES", "data": ["ab", "c"]}], None),
        ([{"name": "e", "shape": [0, 4], "datatype": "FP32", "data": []}], None),
        # the worker answers these cleanly: not judged here
        ([{"name": "x", "shape": [1, 1e12], "datatype": "FP32", "data": [1]}], None),
        ([{"name": "x", "shape": [-1, 4], "datatype": "FP32", "data": [1]}], None),
        ([{"name": "x", "shape": [1, 10**12], "datatype": "FP32"}], None),
        (
            [
                {
                    "name": "x",
                    "shape": [1, 10**12],
                    "datatype": "FP32",
                    "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16},
                }
            ],
            None,
        ),
        (
            [{"name": "x", "shape": [1, 10**12], "datatype": "FP32", "data": [1.0, 2.0]}],
            "input 'x': shape [1, 1000000000000] declares 1000000000000 elements, 'data' holds 2",
        ),
        (
            [
                {"name": "a", "shape": [1], "datatype": "INT32", "data": [1]},
                {"name": "b", "shape": [2, 2], "datatype": "INT32", "data": [[1, 2], [3]]},
            ],
            "input 'b': shape [2, 2] declares 4 elements, 'data' holds 3",
        ),
    ],
)
def test_json_data_is_counted_against_its_shape(inputs: list[Any], problem: str | None) -> None:
    body = json.dumps({"inputs": inputs}).encode()
    found = json_data_mismatch("m", body)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert found.startswith("Unable to parse 'data': Shape does not match true shape")
        assert f"model 'm', {problem}" in found


def test_bodies_that_are_not_inference_json_are_left_to_the_worker() -> None:
    for body in (b"", b"{", b"[]", b'{"inputs": 3}', b'{"inputs": [3]}', b"[" * 100_000):
        assert json_data_mismatch("m", body) is None


@contextmanager
def _closing_frontend(answered: Callable[[int], bool]) -> Iterator[tuple[str, list[int]]]:
    """A stand-in for HAProxy's checked frontend that closes every connection after one
    request, without saying so (HTTP/1.1, no ``Connection: close``), as an idle kept-alive
    connection is closed by a reload; connection n answers only when ``answered(n)``.
    Yields its address and the connections it took."""
    taken: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            taken.append(len(taken) + 1)
            self.close_connection = True
            if answered(taken[-1]):
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", taken
    finally:
        server.shutdown()
        server.server_close()


def _infer_json(fleet: FleetHttp) -> Any:
    body = json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]})
    return fleet.answer("POST", "/v2/models/m/infer", body.encode(), {})


def test_a_kept_alive_connection_closed_unanswered_is_tried_once_on_a_new_one() -> None:
    with _closing_frontend(lambda n: True) as (address, taken):
        fleet = FleetHttp([], request_timeout_s=5, probe_timeout_s=5, checked=address)
        first, second = _infer_json(fleet), _infer_json(fleet)
        fleet.end_thread()
    assert (first.status, first.body, second.status, second.body) == (200, b"{}", 200, b"{}")
    assert taken == [1, 2]  # the second request: the kept-alive connection, then a new one
    with _closing_frontend(lambda n: n == 1) as (address, taken):
        fleet = FleetHttp([], request_timeout_s=5, probe_timeout_s=5, checked=address)
        assert _infer_json(fleet).status == 200
        refused = _infer_json(fleet)  # kept-alive, then one new connection: never more
    assert refused.status == 503 and taken == [1, 2]
    assert "the gateway's routing frontend: RemoteDisconnected" in json.loads(refused.body)["error"]
    with _closing_frontend(lambda n: False) as (address, taken):
        fleet = FleetHttp([], request_timeout_s=5, probe_timeout_s=5, checked=address)
        assert _infer_json(fleet).status == 503  # a new connection that fails: not re-sent
    assert taken == [1]
