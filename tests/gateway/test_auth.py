"""The gateway's authenticated control plane (docs/gateway.md, "Control plane: authentication";
issue 28 item 4): ``GatewayControl`` and model control need the control token or a verified
client certificate, over gRPC and KServe HTTP(S) through HAProxy; inference, the repository
index, ``/metrics`` and ``/healthz`` stay open. A real ``run_gateway`` over in-process fake
workers (gRPC, and a plain HTTP one), certificates made with ``openssl``."""

from __future__ import annotations

import asyncio
import http.client
import json
import ssl
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import service_pb2

from hloserve.cli import main
from hloserve.errors import InvalidArgumentError, Status
from hloserve.gateway.auth import (
    CERT_HEADER,
    ENV_TOKEN,
    ENV_TOKEN_FILE,
    ControlAuth,
    read_token,
)
from hloserve.model_control import GRPC_METADATA_KEY, HEADER
from hloserve.ports import free_ports
from hloserve.protos import gateway_control_pb2 as pb
from hloserve.protos import gateway_control_pb2_grpc as pb_grpc
from tests.gateway.test_haproxy import _self_signed
from tests.gateway.test_proxy import FakeWorker, _infer, gateway, run

TOKEN = "auth-test-token-0123456789abcdef"
KEY = "hmworkerkey0123456789abcdef"  # the workers' model-control key
BEARER = (("authorization", f"Bearer {TOKEN}"),)


def test_read_token_from_a_file_or_the_environment(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"  {TOKEN}  \nsecond line ignored\n")
    assert read_token(token_file, {ENV_TOKEN: "x" * 20}) == TOKEN  # the file wins
    assert read_token(None, {ENV_TOKEN: TOKEN}) == TOKEN
    assert read_token(None, {ENV_TOKEN_FILE: str(token_file)}) == TOKEN
    assert read_token(None, {}) is None
    with pytest.raises(InvalidArgumentError, match="at least 16 characters, got 5"):
        read_token(None, {ENV_TOKEN: "short"})
    with pytest.raises(InvalidArgumentError, match=r"missing: cannot read it"):
        read_token(tmp_path / "missing", {})


def test_control_auth_accepts_each_credential_and_names_them_when_refusing() -> None:
    auth = ControlAuth(TOKEN, "s" * 32, KEY)
    auth.check({"authorization": f"Bearer {TOKEN}"}, model_control=False)
    auth.check({"authorization": f"bearer {TOKEN}"}, model_control=False)
    auth.check({CERT_HEADER: "s" * 32}, model_control=False)
    auth.check({HEADER: KEY}, model_control=True)
    auth.check({GRPC_METADATA_KEY: KEY}, model_control=True)
    for headers, model_control in (
        ({}, False),
        ({"authorization": f"Bearer {TOKEN}x"}, False),
        ({"authorization": TOKEN}, False),  # no scheme
        ({CERT_HEADER: "t" * 32}, False),
        ({HEADER: KEY}, False),  # the workers' key opens model control only
    ):
        with pytest.raises(Exception) as info:
            auth.check(headers, model_control)
        assert getattr(info.value, "status", None) == Status.UNAUTHENTICATED
        assert "needs a credential; send 'authorization: Bearer <control token>' or a client" in (
            str(info.value)
        )
    with pytest.raises(Exception, match="the gateway has no control token") as nothing:
        ControlAuth().check({"authorization": "Bearer "}, model_control=False)
    assert getattr(nothing.value, "status", None) == Status.UNAUTHENTICATED


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


class Certs:
    """A server certificate (localhost), a client CA, a client certificate it signed and a
    stranger's self-signed one."""

    def __init__(self, directory: Path) -> None:
        self.server, self.server_key = _self_signed(directory)
        self.ca, ca_key = directory / "ca.pem", directory / "ca.key"
        rsa = ("-newkey", "rsa:2048", "-nodes", "-days", "1")
        _openssl(
            "req", "-x509", *rsa, "-keyout", str(ca_key), "-out", str(self.ca), "-subj", "/CN=ca"
        )
        self.client, self.client_key = directory / "client.pem", directory / "client.key"
        csr = directory / "client.csr"
        _openssl(
            "req", *rsa[:3], "-keyout", str(self.client_key), "-out", str(csr), "-subj", "/CN=op"
        )
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(self.ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-out", str(self.client), "-days", "1",
        )  # fmt: skip
        self.stranger, self.stranger_key = directory / "stranger.pem", directory / "stranger.key"
        _openssl(
            "req", "-x509", *rsa, "-keyout", str(self.stranger_key), "-out", str(self.stranger),
            "-subj", "/CN=stranger",
        )  # fmt: skip

    def grpc_credentials(self, client: Path | None = None, key: Path | None = None) -> Any:
        return grpc.ssl_channel_credentials(
            self.server.read_bytes(),
            key.read_bytes() if key else None,
            client.read_bytes() if client else None,
        )

    def https(self, port: int, client: bool) -> http.client.HTTPSConnection:
        context = ssl.create_default_context(cafile=str(self.server))
        if client:
            context.load_cert_chain(str(self.client), str(self.client_key))
        return http.client.HTTPSConnection("localhost", port, context=context, timeout=10)


@dataclass
class LoadingWorker(FakeWorker):
    """A fake worker that answers RepositoryModelLoad and keeps each call's metadata."""

    loads: list[dict[str, str]] = field(default_factory=list)
    infers: list[dict[str, str]] = field(default_factory=list)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        self.infers.append({k: v for k, v in context.invocation_metadata()})
        return await super().ModelInfer(request, context)

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        self.loads.append({k: v for k, v in context.invocation_metadata()})
        return service_pb2.RepositoryModelLoadResponse()


class HttpWorker:
    """A worker's KServe HTTP port: 200 ``{}`` to everything, keeping each request's headers."""

    def __init__(self) -> None:
        seen: list[tuple[str, dict[str, str]]] = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            do_GET = do_POST = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.seen = seen
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def http_worker() -> Iterator[HttpWorker]:
    worker = HttpWorker()
    yield worker
    worker.close()


async def _status_code(channel: grpc.aio.Channel, metadata: Any = None) -> grpc.StatusCode:
    try:
        await pb_grpc.GatewayControlStub(channel).GetSchedulingStatus(
            pb.GetSchedulingStatusRequest(), metadata=metadata, timeout=10
        )
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def _load_code(channel: grpc.aio.Channel, metadata: Any = None) -> grpc.StatusCode:
    load = channel.unary_unary(
        "/inference.GRPCInferenceService/RepositoryModelLoad",
        request_serializer=service_pb2.RepositoryModelLoadRequest.SerializeToString,
        response_deserializer=service_pb2.RepositoryModelLoadResponse.FromString,
    )
    try:
        await load(
            service_pb2.RepositoryModelLoadRequest(model_name="echo"), metadata=metadata, timeout=10
        )
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _http(connection: http.client.HTTPConnection, path: str, **headers: str) -> Any:
    try:
        connection.request("POST" if path.endswith("load") else "GET", path, b"", headers)
        reply = connection.getresponse()
        return reply.status, reply.getheader("WWW-Authenticate"), reply.read()
    finally:
        connection.close()


def _plaintext(
    token_file: Path, http_port: int, http_worker: HttpWorker, **auth: Any
) -> dict[str, Any]:
    """Gateway settings without TLS: the token file and ``auth`` keys, the workers' key, the
    KServe HTTP listener on ``http_port`` in front of ``http_worker``."""
    return {
        "auth": {"token_file": str(token_file), **auth},
        "upstream": {"model_control_key": KEY},
        "http_listen": f"127.0.0.1:{http_port}",
        "worker_http": [http_worker.address],
    }


def test_plaintext_control_needs_the_token_and_model_control_the_token_or_key(
    tmp_path: Path, http_worker: HttpWorker
) -> None:
    """No TLS: GatewayControl only with the token (a wrong one refused); model load with the
    token (sent on with the gateway's own worker key) or the workers' key; inference, the
    index, /metrics and /healthz open; ``gateway-ctl`` reads the token from the environment."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    worker = LoadingWorker("w0")
    (http_port,) = free_ports(1)

    async def body() -> None:
        settings = _plaintext(token_file, http_port, http_worker)
        async with gateway(worker, **settings) as g:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{g.port}") as channel:
                assert await _status_code(channel) == grpc.StatusCode.UNAUTHENTICATED
                wrong = (("authorization", "Bearer " + "x" * 32),)
                assert await _status_code(channel, wrong) == grpc.StatusCode.UNAUTHENTICATED
                assert await _status_code(channel, BEARER) == grpc.StatusCode.OK
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await pb_grpc.GatewayControlStub(channel).Repack(pb.RepackRequest())
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert "the gateway control plane needs a credential" in str(
                    refused.value.details()
                )
                assert await _load_code(channel) == grpc.StatusCode.UNAUTHENTICATED
                assert worker.loads == []
                assert await _load_code(channel, BEARER) == grpc.StatusCode.OK
                assert worker.loads[-1][GRPC_METADATA_KEY] == KEY  # the gateway's own key
                assert "authorization" not in worker.loads[-1]
                assert await _load_code(channel, ((GRPC_METADATA_KEY, KEY),)) == grpc.StatusCode.OK
            # open: inference and the index through HAProxy, the admin port
            assert await _infer(g.client, np.ones((1, 2), np.float32), "open") == "w0"
            assert [m.name for m in (await g.client.get_model_repository_index()).models] == [
                "echo"
            ]
            for path in ("/metrics", "/healthz"):
                url = f"http://127.0.0.1:{g.admin}{path}"
                reply = await asyncio.to_thread(urllib.request.urlopen, url, timeout=10)
                assert reply.status == 200
            # KServe HTTP: 401 without a credential, nothing reaches the worker
            plain = http.client.HTTPConnection("127.0.0.1", http_port, timeout=10)
            load = "/v2/repository/models/echo/load"
            status, challenge, text = await asyncio.to_thread(_http, plain, load)
            assert (status, challenge) == (401, "Bearer")
            assert "model control needs a credential" in json.loads(text)["error"]
            assert not any(p == load for p, _ in http_worker.seen)
            plain = http.client.HTTPConnection("127.0.0.1", http_port, timeout=10)
            auth = {"Authorization": f"Bearer {TOKEN}"}
            assert (await asyncio.to_thread(_http, plain, load, **auth))[0] == 200
            headers = next(h for p, h in http_worker.seen if p == load)
            assert headers[HEADER] == KEY and "authorization" not in headers
            plain = http.client.HTTPConnection("127.0.0.1", http_port, timeout=10)
            ready = "/v2/models/echo/ready"
            assert (await asyncio.to_thread(_http, plain, ready))[0] == 200  # open
            # gateway-ctl without a token
            address = ["gateway-ctl", "--address", f"127.0.0.1:{g.port}", "status"]
            assert await asyncio.to_thread(main, address) == 1

    run(body)


def test_open_repository_api_opens_model_control_only(
    tmp_path: Path, http_worker: HttpWorker, caplog: pytest.LogCaptureFixture
) -> None:
    """``auth.open_repository_api`` (``serve --open-repository-api``): a model load passes
    without a credential over gRPC and HTTP, sent on with the gateway's own worker key (the
    workers stay keyed); GatewayControl still needs the token; the start logs the warning.
    Without the key the same load is refused (the test above)."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    worker = LoadingWorker("w0")
    (http_port,) = free_ports(1)
    auth = ControlAuth(TOKEN, None, KEY, open_repository_api=True)
    auth.check({}, model_control=True)
    with pytest.raises(Exception, match="the gateway control plane needs a credential"):
        auth.check({}, model_control=False)

    async def body() -> None:
        settings = _plaintext(token_file, http_port, http_worker, open_repository_api=True)
        async with gateway(worker, **settings) as g:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{g.port}") as channel:
                assert await _load_code(channel) == grpc.StatusCode.OK
                assert worker.loads[-1][GRPC_METADATA_KEY] == KEY  # the gateway's own key
                assert await _status_code(channel) == grpc.StatusCode.UNAUTHENTICATED
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await pb_grpc.GatewayControlStub(channel).Repack(pb.RepackRequest())
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert await _status_code(channel, BEARER) == grpc.StatusCode.OK
            plain = http.client.HTTPConnection("127.0.0.1", http_port, timeout=10)
            load = "/v2/repository/models/echo/load"
            assert (await asyncio.to_thread(_http, plain, load))[0] == 200
            headers = next(h for p, h in http_worker.seen if p == load)
            assert headers[HEADER] == KEY

    with caplog.at_level("WARNING", logger="hloserve.gateway"):
        run(body)
    assert "auth.open_repository_api: model load and unload need no credential" in caplog.text
    assert "whoever reaches the gateway's ports can run code" in caplog.text


def test_ctl_reads_the_token_file_named_by_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)

    async def body() -> None:
        async with gateway(FakeWorker("w0")) as g:  # the gateway reads HLOSERVE_CONTROL_TOKEN
            command = ["gateway-ctl", "--address", f"127.0.0.1:{g.port}", "status"]
            monkeypatch.delenv(ENV_TOKEN)
            assert await asyncio.to_thread(main, command) == 1
            assert "error (UNAUTHENTICATED): the gateway control plane needs a credential" in (
                capsys.readouterr().err
            )
            monkeypatch.setenv(ENV_TOKEN_FILE, str(token_file))
            assert await asyncio.to_thread(main, command) == 0
            assert "round_robin" in capsys.readouterr().out

    monkeypatch.setenv(ENV_TOKEN, TOKEN)
    run(body)


def test_tls_client_certificate_opens_the_control_plane_over_grpc_and_https(
    tmp_path: Path, http_worker: HttpWorker, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tls.verify_client: optional``: a certificate signed by the client CA opens
    GatewayControl and model control (gRPC and HTTPS) without the token; a connection without
    one is served (inference, HTTP ready) but its control calls are refused; a stranger's
    certificate fails the handshake. ``gateway-ctl`` with ``--tls-cert``/``--tls-key``."""
    certs = Certs(tmp_path)
    worker = LoadingWorker("w0")
    (http_port,) = free_ports(1)

    async def body() -> None:
        settings = {
            "tls": {
                "cert": str(certs.server),
                "key": str(certs.server_key),
                "client_ca": str(certs.ca),
                "verify_client": "optional",
            },
            "http_listen": f"127.0.0.1:{http_port}",
            "worker_http": [http_worker.address],
        }
        async with gateway(worker, **settings) as g:
            target = f"localhost:{g.port}"
            signed = certs.grpc_credentials(certs.client, certs.client_key)
            async with grpc.aio.secure_channel(target, signed) as channel:
                assert await _status_code(channel) == grpc.StatusCode.OK
                assert await _load_code(channel) == grpc.StatusCode.OK
                assert CERT_HEADER not in worker.loads[-1]  # the secret stays in the gateway
            async with grpc.aio.secure_channel(target, certs.grpc_credentials()) as channel:
                assert await _status_code(channel) == grpc.StatusCode.UNAUTHENTICATED
                assert await _load_code(channel) == grpc.StatusCode.UNAUTHENTICATED
                forged = ((CERT_HEADER, "0" * 32),)  # HAProxy replaces the client's header
                assert await _status_code(channel, forged) == grpc.StatusCode.UNAUTHENTICATED
            client = triton_aio.InferenceServerClient(
                target, ssl=True, root_certificates=str(certs.server)
            )
            try:  # inference needs no certificate
                assert await _infer(client, np.ones((1, 2), np.float32), "tls") == "w0"
            finally:
                await client.close()
            client = triton_aio.InferenceServerClient(
                target,
                ssl=True,
                root_certificates=str(certs.server),
                private_key=str(certs.client_key),
                certificate_chain=str(certs.client),
            )
            try:  # with one: the secret header is not sent to the worker
                assert await _infer(client, np.ones((1, 2), np.float32), "mtls") == "w0"
            finally:
                await client.close()
            assert len(worker.infers) == 2 and all(CERT_HEADER not in m for m in worker.infers)
            stranger = certs.grpc_credentials(certs.stranger, certs.stranger_key)
            async with grpc.aio.secure_channel(target, stranger) as channel:
                assert await _status_code(channel) == grpc.StatusCode.UNAVAILABLE  # handshake

            load = "/v2/repository/models/echo/load"
            status, challenge, _ = await asyncio.to_thread(
                _http, certs.https(http_port, False), load
            )
            assert (status, challenge) == (401, "Bearer")
            ready = "/v2/models/echo/ready"
            assert (await asyncio.to_thread(_http, certs.https(http_port, False), ready))[0] == 200
            assert (await asyncio.to_thread(_http, certs.https(http_port, True), load))[0] == 200
            headers = next(h for p, h in http_worker.seen if p == load)
            assert CERT_HEADER not in headers

            ctl = ["gateway-ctl", "--address", target, "--tls-ca", str(certs.server)]
            assert await asyncio.to_thread(main, [*ctl, "status"]) == 1
            assert "error (UNAUTHENTICATED)" in capsys.readouterr().err
            mine = ["--tls-cert", str(certs.client), "--tls-key", str(certs.client_key)]
            assert await asyncio.to_thread(main, [*ctl, *mine, "status"]) == 0
            assert "round_robin" in capsys.readouterr().out

    run(body)
