"""``hloserve serve PATH --workers 2`` as a user runs it: two tritonservers plus the gateway.

A subprocess with real signals: tritonclient's gRPC client reaches the model through the
gateway's port; a SIGKILLed worker is reported and the gateway keeps answering through the
other; SIGTERM stops the gateway and every worker, leaving no process behind.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.node.plan import worker_ports
from hloserve.node.procfs import session_pids
from tests.conftest import GOLDEN
from tests.node.test_serve_cli import (
    run_cli,
    serve_two_workers,
    stop_serve,
    stub_pids,
    wait_for_line,
)

# its own bounds: up to 300 s for "ready", then a worker restart (the default timeout is 300 s)
pytestmark = [pytest.mark.tritonserver, pytest.mark.slow, pytest.mark.timeout(600)]
grpcclient = pytest.importorskip("tritonclient.grpc")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException


def _affine(address: str, x: np.ndarray) -> np.ndarray:
    client = grpcclient.InferenceServerClient(address)
    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result: np.ndarray = client.infer("affine", [tensor]).as_numpy("y")
    return result


def _serve_two_workers(
    bundles: Path, log: Path, key: str, *extra: str
) -> tuple[subprocess.Popen[bytes], int]:
    """``hloserve serve BUNDLES --workers 2`` with the model-control key, its output in
    ``log``; the process and the gateway's gRPC port."""
    from hloserve.model_control import ENV_KEY

    proc, grpc_port, _, _ = serve_two_workers(bundles, log, *extra, env={ENV_KEY: key})
    return proc, grpc_port


def test_worker_ports_are_consecutive_from_the_base() -> None:
    ports = worker_ports(2, 8100)
    assert [(p.http, p.grpc, p.metrics) for p in ports] == [(8100, 8101, 8102), (8103, 8104, 8105)]
    free = worker_ports(2, 0)
    assert len({p for w in free for p in (w.http, w.grpc, w.metrics)}) == 6


def test_serve_workers_refuses_bad_settings_before_starting(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text('name: "m"')
    result = run_cli("serve", tmp_path, "--workers", "2", "--worker-port-base", "8000")
    assert result.returncode == 1
    assert "include the gateway's port(s) [8000, 8001, 8002]" in result.stderr
    result = run_cli("serve", tmp_path, "--workers", "2", "--worker-port-base", "65534")
    assert result.returncode == 1 and "are not all in 1..65535" in result.stderr
    result = run_cli("serve", tmp_path, "--workers", "0")
    assert result.returncode == 1 and "--workers must be at least 1" in result.stderr
    result = run_cli("serve", tmp_path, "--gateway-config", tmp_path / "g.yaml")
    assert result.returncode == 1 and "--gateway-config needs --workers 2" in result.stderr
    result = run_cli("serve", tmp_path, "--tls-cert", tmp_path / "c", "--tls-key", tmp_path / "k")
    assert result.returncode == 1 and "--tls-cert/--tls-key need --workers 2" in result.stderr


def _ready(client: Any) -> bool:
    """Whether ``affine`` is ready there (a restarted worker answers server-ready once its
    runtime model is loaded, then loads the others through the repository API)."""
    try:
        return bool(client.is_server_ready() and client.is_model_ready("affine"))
    except Exception:  # not listening yet
        return False


def test_two_workers_behind_the_gateway_survive_a_dead_worker_and_stop_together(
    tmp_path: Path,
) -> None:
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    (bundles / "affine").symlink_to(GOLDEN / "affine", target_is_directory=True)
    config = tmp_path / "gateway.yaml"
    config.write_text("health: {interval_seconds: 0.5, failure_threshold: 1}\n")
    log = tmp_path / "serve.log"
    proc, grpc_port, _, admin_port = serve_two_workers(
        bundles, log, "--gateway-config", str(config)
    )
    pids: list[int] = []
    try:
        wait_for_line(log, r"hloserve: ready after", proc, 300)
        text = log.read_text()
        pids = [int(p) for p in re.findall(r"worker \d tritonserver \(pid (\d+)\)", text)]
        assert len(pids) == 2, text
        assert f"gateway gRPC    127.0.0.1:{grpc_port}" in text
        assert f"http://127.0.0.1:{admin_port}/metrics" in text
        worker_grpc = re.findall(r"gRPC (127\.0\.0\.1:\d+)  metrics", text)
        gateway = f"127.0.0.1:{grpc_port}"
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        expected = _affine(worker_grpc[0], x)
        for _ in range(4):
            np.testing.assert_array_equal(_affine(gateway, x), expected)

        stub = stub_pids(pids[0], "affine")[0]
        os.kill(stub, signal.SIGKILL)  # a model process of worker 0 dies: it is reloaded there
        wait_for_line(
            log, rf"model 'affine': Python backend stub pid {stub} .*; reloading", proc, 30
        )
        wait_for_line(log, r"model 'affine': reloaded", proc, 120)
        for _ in range(6):
            np.testing.assert_array_equal(_affine(gateway, x), expected)

        os.kill(pids[1], signal.SIGKILL)  # a worker dies: it is restarted (on-failure)
        wait_for_line(log, r"worker 1 was killed by SIGKILL; restart 1 in", proc, 60)
        for _ in range(6):  # every request still succeeds, through worker 0 meanwhile
            np.testing.assert_array_equal(_affine(gateway, x), expected)
        restarted = grpcclient.InferenceServerClient(worker_grpc[1])
        deadline = time.monotonic() + 120
        while not _ready(restarted):
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.5)
        np.testing.assert_array_equal(_affine(worker_grpc[1], x), expected)  # back, same ports
        for _ in range(6):
            np.testing.assert_array_equal(_affine(gateway, x), expected)
        assert proc.poll() is None

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, log.read_text()[-3000:]
    finally:
        stop_serve(proc)
    deadline = time.monotonic() + 30
    while any(session_pids(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(session_pids(p) == [] for p in pids), "processes of a worker's session survived"
    assert "hloserve: stopped" in log.read_text()


#: ``affine`` with a ``preprocess`` hook that holds a request whose first value is over 100
#: for 3 s (in the front, so the request is in flight at the gateway and at a worker).
SLOW_HOOK = """
import time


def preprocess(inputs):
    if float(inputs["x"].reshape(-1)[0]) > 100:
        time.sleep(3)
    return inputs
"""


def test_sigterm_answers_the_requests_in_flight_before_stopping(tmp_path: Path) -> None:
    """``status --models`` lists the workers' models (before: no model list with --workers);
    SIGTERM while a gRPC and an HTTP request are in flight: both are answered (before, the
    gateway stopped at once and they failed with "Socket closed"), new connections are
    refused meanwhile (a client's open connection may still send), and serve exits 0."""
    import threading

    import tritonclient.http as httpclient

    bundles = tmp_path / "bundles"
    shutil.copytree(GOLDEN / "affine", bundles / "affine")
    (bundles / "affine" / "model.py").write_text(SLOW_HOOK)
    log = tmp_path / "serve.log"
    proc, grpc_port, http_port, _ = serve_two_workers(bundles, log, "--admin-port", "0")
    try:
        wait_for_line(log, r"hloserve: ready after", proc, 300)
        # the supervisor's /models lists the workers' models (hloserve status --models)
        admin = re.search(r"\n  admin +http://([0-9.:]+)/metrics \(supervisor\)", log.read_text())
        assert admin is not None, log.read_text()[-3000:]
        status = run_cli("status", "--models", admin.group(1))
        assert status.returncode == 0, status.stdout + status.stderr
        rows = {line.split()[0]: line.split()[1:3] for line in status.stdout.splitlines()[1:]}
        assert rows["affine"] == ["1", "READY"], status.stdout
        gateway = f"127.0.0.1:{grpc_port}"
        x = np.full((1, 4), 1000, np.float32)
        expected = _affine(gateway, x)  # held 3 s too
        answers: dict[str, Any] = {}

        def slow_grpc() -> None:
            try:
                answers["grpc"] = _affine(gateway, x)
            except Exception as exc:
                answers["grpc"] = exc

        def slow_http() -> None:
            client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
            tensor = httpclient.InferInput("x", [1, 4], "FP32")
            tensor.set_data_from_numpy(x)
            try:
                answers["http"] = client.infer("affine", [tensor]).as_numpy("y")
            except Exception as exc:
                answers["http"] = exc

        threads = [threading.Thread(target=f) for f in (slow_grpc, slow_http)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # both are in the hook now (3 s)
        proc.send_signal(signal.SIGTERM)
        wait_for_line(log, r"HAProxy drains", proc, 10)
        for port in (grpc_port, http_port):  # new connections: refused
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
        for thread in threads:
            thread.join(30)
        for protocol in ("grpc", "http"):
            assert isinstance(answers.get(protocol), np.ndarray), (answers, log.read_text()[-3000:])
            np.testing.assert_allclose(answers[protocol], expected, rtol=1e-5)
        assert proc.wait(timeout=90) == 0, log.read_text()[-3000:]
    finally:
        stop_serve(proc)
    assert "hloserve: stopped" in log.read_text()


def test_model_control_through_the_gateway_reaches_the_workers_with_the_key(
    tmp_path: Path,
) -> None:
    from hloserve.model_control import GRPC_METADATA_KEY

    bundles = tmp_path / "bundles"
    bundles.mkdir()
    (bundles / "affine").symlink_to(GOLDEN / "affine", target_is_directory=True)
    key = "TestKey-" + "k" * 20
    log = tmp_path / "serve.log"
    proc, grpc_port = _serve_two_workers(bundles, log, key)
    try:
        wait_for_line(log, r"hloserve: ready after", proc, 300)
        gateway = f"127.0.0.1:{grpc_port}"
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        expected = _affine(gateway, x)
        client = grpcclient.InferenceServerClient(gateway)
        with pytest.raises(InferenceServerException) as refused:  # no credential
            client.unload_model("affine")
        assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
        np.testing.assert_array_equal(_affine(gateway, x), expected)  # still served

        headers = {GRPC_METADATA_KEY: key}
        client.unload_model("affine", headers=headers)
        index = client.get_model_repository_index(headers=headers, as_json=True)
        states = {m["name"]: m.get("state") for m in index.get("models", [])}
        assert states.get("affine") != "READY", states
        deadline = time.monotonic() + 15
        while True:  # the table follows within a discovery pass; then NOT_FOUND
            with pytest.raises(InferenceServerException) as info:
                _affine(gateway, x)
            if info.value.status() == "StatusCode.NOT_FOUND" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert info.value.status() == "StatusCode.NOT_FOUND", str(info.value)

        client.load_model("affine", headers=headers)  # on every worker again
        deadline = time.monotonic() + 30
        while True:
            try:
                np.testing.assert_array_equal(_affine(gateway, x), expected)
                break
            except InferenceServerException:
                assert time.monotonic() < deadline, "affine not served again after the load"
                time.sleep(0.2)
        index = client.get_model_repository_index(headers=headers, as_json=True)
        ready = [m for m in index.get("models", []) if m["name"] == "affine"]
        assert [m.get("state") for m in ready] == ["READY"], index
        client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, log.read_text()[-3000:]
    finally:
        stop_serve(proc)


def test_lpt_packing_loads_a_model_no_worker_holds_on_its_chosen_worker(tmp_path: Path) -> None:
    """Explicit model control through the gateway in ``lpt_packing`` mode: a model in the
    repository that no worker has loaded goes where the placement puts it (one replica by
    default: one worker), not to every worker; it is served through the gateway after."""
    from hloserve.model_control import GRPC_METADATA_KEY

    bundles = tmp_path / "bundles"
    bundles.mkdir()
    for name in ("affine", "affine_b"):
        (bundles / name).symlink_to(GOLDEN / "affine", target_is_directory=True)
    gateway_file = tmp_path / "gateway.yaml"
    gateway_file.write_text("mode: lpt_packing\ndiscovery: {poll_interval_seconds: 1}\n")
    key = "TestKey-" + "p" * 20
    log = tmp_path / "serve.log"
    proc, grpc_port = _serve_two_workers(
        bundles, log, key, "--model-control-mode", "explicit", "--load-model", "affine",
        "--scheduling", "fifo", "--gateway-config", str(gateway_file),
    )  # fmt: skip
    try:
        wait_for_line(log, r"hloserve: ready after", proc, 300)
        workers = [
            m.group(1)
            for m in re.finditer(
                r"worker \d+ tritonserver \(pid \d+\).*gRPC (\S+)", log.read_text()
            )
        ]
        assert len(workers) == 2, log.read_text()[-3000:]
        gateway = f"127.0.0.1:{grpc_port}"
        headers = {GRPC_METADATA_KEY: key}

        def loaded_on() -> list[str]:
            on = []
            for worker in workers:
                index = grpcclient.InferenceServerClient(worker).get_model_repository_index(
                    headers=headers, as_json=True
                )
                states = {m["name"]: m.get("state") for m in index.get("models", [])}
                if states.get("affine_b") == "READY":
                    on.append(worker)
            return on

        assert loaded_on() == []
        grpcclient.InferenceServerClient(gateway).load_model("affine_b", headers=headers)
        assert len(loaded_on()) == 1, "lpt_packing places one replica: one worker loads it"
        assert "lpt_packing: new model 'affine_b' goes to" in log.read_text()
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        expected = _affine(gateway, x)
        client = grpcclient.InferenceServerClient(gateway)
        deadline = time.monotonic() + 30
        while True:  # the table follows within a discovery pass
            try:
                tensor = grpcclient.InferInput("x", [1, 4], "FP32")
                tensor.set_data_from_numpy(x)
                got = client.infer("affine_b", [tensor]).as_numpy("y")
                break
            except InferenceServerException:
                assert time.monotonic() < deadline, "affine_b not served after the load"
                time.sleep(0.2)
        np.testing.assert_array_equal(got, expected)
    finally:
        stop_serve(proc)
