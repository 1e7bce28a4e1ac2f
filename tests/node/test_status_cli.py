"""``hloserve status`` pointed at the wrong port, and piped into a reader that stops early."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures

import pytest

from hloserve.errors import InvalidArgumentError, UnavailableError
from hloserve.ports import free_port
from hloserve.prometheus_text import fetch_metrics

grpc = pytest.importorskip("grpc")  # absent from the numpy-2 leg (it comes with tritonclient)


@pytest.fixture
def grpc_port() -> Iterator[int]:
    """A gRPC server with no services on loopback (what Triton's gRPC port looks like to HTTP/1)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port
    server.stop(grace=None)


@pytest.fixture
def http_error_port() -> Iterator[int]:
    """An HTTP server that answers every GET with an error status (501: no handler)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    thread.join(10)


def test_a_grpc_port_is_named_as_not_a_metrics_endpoint(grpc_port: int) -> None:
    with pytest.raises(InvalidArgumentError, match="does not answer like Triton's metrics"):
        fetch_metrics(f"127.0.0.1:{grpc_port}", timeout_s=10)


def test_an_http_error_is_named_as_not_a_metrics_endpoint(http_error_port: int) -> None:
    with pytest.raises(InvalidArgumentError, match=r"metrics endpoint .*: HTTP 501"):
        fetch_metrics(f"127.0.0.1:{http_error_port}", timeout_s=10)


def test_nothing_listening_is_unavailable() -> None:
    with pytest.raises(UnavailableError, match="cannot read metrics"):
        fetch_metrics(f"127.0.0.1:{free_port()}", timeout_s=10)


def test_cli_on_a_grpc_port_prints_one_error_line(grpc_port: int) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hloserve.cli", "status", f"127.0.0.1:{grpc_port}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.startswith("error (INVALID_ARGUMENT): http://127.0.0.1:")
    assert "Traceback" not in result.stderr


def test_a_reader_that_stops_early_ends_the_output_quietly() -> None:
    code = "from hloserve.node.status import print_quietly; print_quietly('row\\n' * 200000)"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"row\n"
    proc.stdout.close()  # `| head -1`
    assert proc.wait(timeout=60) == 0
    assert proc.stderr.read() == b""
    proc.stderr.close()


def test_the_model_list_is_asked_again_while_the_supervisor_answers_503() -> None:
    """serve's admin port answers 503 while tritonserver does not answer it (busy a moment,
    e.g. loading a model): ``fetch_models`` asks again, 1 s apart, and then gives up."""
    import http.server
    import json
    import threading

    from hloserve.errors import UnavailableError
    from hloserve.node.status import UNAVAILABLE_TRIES, fetch_models

    busy = [2]  # 503 this many times, then the list

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if busy[0] > 0:
                busy[0] -= 1
                self.send_error(503)
                return
            body = json.dumps({"models": [{"name": "a"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        address = f"127.0.0.1:{server.server_address[1]}"
        assert fetch_models(address) == [{"name": "a"}]
        busy[0] = UNAVAILABLE_TRIES
        with pytest.raises(UnavailableError, match="the server does not answer"):
            fetch_models(address)
    finally:
        server.shutdown()
        server.server_close()
