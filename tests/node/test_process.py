"""``hloserve node up|down`` with the process runtime: local tritonservers, no Docker.

One ``hloserve node up`` subprocess with two CPU workers (tritonservers from the
nvidia-pytriton wheel) serving the digits repository, and the gateway in front. Checks the
answers through the gateway, a worker killed under load being restarted by the node while
traffic recovers, the Prometheus targets and supervisor metrics it publishes (as ``hloserve
serve`` does), and ``hloserve node down`` (SIGTERM via the node's pid file) stopping it all
and removing its targets.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import yaml

from hloserve.model_repository_tools.build import build_repository
from hloserve.ports import free_ports
from tests.node.node_testing import (
    LoadLoop,
    NodeProcess,
    contiguous_free_ports,
    infer_digits,
    ready,
    successes,
    two_worker_ports,
)

# the node's own bound: up to STARTUP_S + 30 s for `node up` in the first test's setup
pytestmark = [pytest.mark.tritonserver, pytest.mark.slow, pytest.mark.timeout(600)]

grpcclient = pytest.importorskip("tritonclient.grpc")

STARTUP_S = 300.0


@pytest.fixture(scope="module")
def node(digits_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    work = tmp_path_factory.mktemp("process_node")
    (work / "bundles").mkdir()
    os.symlink(digits_bundle, work / "bundles" / "digits")
    build_repository(work / "bundles", work / "repository")
    gateway, http, admin, supervisor = free_ports(4)
    settings = {
        "name": f"ptest{os.getpid()}",
        "runtime": "process",
        "repository": str(work / "repository"),
        "cpu_workers": 2,
        "ports": two_worker_ports(contiguous_free_ports(6)),
        "restart": {"policy": "on-failure", "max_retries": 2},
        "tritonserver": {"startup_timeout_s": STARTUP_S},
        "gateway": {
            "listen": f"127.0.0.1:{gateway}",
            "http_listen": f"127.0.0.1:{http}",
            "admin_port": admin,
            "settings": {"discovery": {"poll_interval_seconds": 1}},
        },
        "admin_port": supervisor,
    }
    env = {**os.environ, "HLOSERVE_PROMETHEUS_TARGETS_DIR": str(work / "targets")}
    handle = NodeProcess(settings, work, STARTUP_S + 30, env=env)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="module")
def test_split(digits_model: Any, digits_params: Any) -> tuple[np.ndarray, np.ndarray]:
    _, _, x, _ = digits_model.load_split()
    return x, np.asarray(jax.jit(digits_model.apply)(digits_params, x))


def worker_pid(node: NodeProcess, index: int) -> int:
    lines = [
        ln for ln in node.log_text().splitlines() if f"worker {index} tritonserver (pid " in ln
    ]
    return int(lines[-1].split("(pid ")[1].split(")")[0])


def test_two_process_workers_serve_digits_through_the_gateway(
    node: NodeProcess, test_split: Any
) -> None:
    images, reference = test_split
    gateway = grpcclient.InferenceServerClient(node.gateway)
    for start in range(0, 32, 8):
        logits = infer_digits(gateway, images[start : start + 8])
        np.testing.assert_allclose(logits, reference[start : start + 8], rtol=1e-5, atol=1e-5)
    for _ in range(100):  # Triton's success count lags the answer: poll, bounded
        if all(successes(url) > 0 for url in node.worker_grpc):
            break
        time.sleep(0.1)
    assert all(successes(url) > 0 for url in node.worker_grpc)
    assert "[worker 0]" in node.log_text() and "[worker 1]" in node.log_text()
    settings = yaml.safe_load(node.config.read_text())["gateway"]
    http, admin = settings["http_listen"], settings["admin_port"]
    text = node.log_text()
    assert f"gateway gRPC    {node.gateway} (KServe V2" in text
    assert f"gateway HTTP    http://{http} (KServe V2)" in text
    assert f"gateway admin   http://127.0.0.1:{admin}/metrics, /healthz, /readyz" in text


def test_the_node_gateway_answers_kserve_http(node: NodeProcess, test_split: Any) -> None:
    """``gateway.http_listen``: KServe HTTP through the node's gateway, the same logits."""
    import tritonclient.http as httpclient

    images, reference = test_split
    url = yaml.safe_load(node.config.read_text())["gateway"]["http_listen"]
    client = httpclient.InferenceServerClient(url)
    try:
        tensor = httpclient.InferInput("image", [8, *images.shape[1:]], "FP32")
        tensor.set_data_from_numpy(np.ascontiguousarray(images[:8]))
        logits = client.infer("digits", [tensor]).as_numpy("logits")
        np.testing.assert_allclose(logits, reference[:8], rtol=1e-5, atol=1e-5)
        assert client.get_model_metadata("digits")["name"] == "digits"
    finally:
        client.close()


def _targets(node: NodeProcess) -> list[Path]:
    return list((node.config.parent / "targets").glob("*.json"))


def _node_metrics(node: NodeProcess) -> str:
    port = yaml.safe_load(node.config.read_text())["admin_port"]
    url = f"http://127.0.0.1:{port}/metrics"
    return str(urllib.request.urlopen(url, timeout=10).read().decode())


def test_the_node_writes_its_prometheus_targets(node: NodeProcess) -> None:
    """As ``hloserve serve`` does (docs/observability.md): both workers' metrics ports, the
    gateway's admin port and the supervisor's own, labelled with the node file's name."""
    settings = yaml.safe_load(node.config.read_text())
    files = _targets(node)
    assert [f.name for f in files] == [f"{settings['name']}.json"]
    groups = json.loads(files[0].read_text())
    metrics = settings["ports"]["metrics_base"]
    assert sorted(
        (g["labels"]["job"], g["labels"].get("worker"), g["targets"]) for g in groups
    ) == [
        ("hloserve-gateway", None, [f"127.0.0.1:{settings['gateway']['admin_port']}"]),
        ("hloserve-node", None, [f"127.0.0.1:{settings['admin_port']}"]),
        ("hloserve-worker", "worker0", [f"127.0.0.1:{metrics}"]),
        ("hloserve-worker", "worker1", [f"127.0.0.1:{metrics + 3}"]),
    ]
    assert {g["labels"]["node"] for g in groups} == {settings["name"]}
    assert f"admin http://127.0.0.1:{settings['admin_port']}/metrics" in node.log_text()
    assert "hloserve_node_workers_up 2.0" in _node_metrics(node)


def test_killed_worker_is_restarted_and_traffic_recovers(
    node: NodeProcess, test_split: Any
) -> None:
    images, reference = test_split
    load = LoadLoop(node.gateway, images, reference)
    try:
        load.wait_count(20, 60)
        os.kill(worker_pid(node, 0), signal.SIGKILL)
        node.wait_for("worker 0 was killed by SIGKILL; restart 1", 30)
        deadline = time.monotonic() + STARTUP_S
        while not ready(node.worker_http[0]) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert ready(node.worker_http[0]), node.log_text()[-3000:]
        load.wait_for_traffic_to(node.worker_grpc[0])
    finally:
        results = load.stop()
    assert len(results[-20:]) == 20 and all(results[-20:]), f"last answers {results[-20:]}"
    text = _node_metrics(node)
    assert 'hloserve_node_worker_restarts_total{worker="worker0"} 1.0' in text, text
    assert 'hloserve_node_worker_restarts_total{worker="worker1"} 0.0' in text, text


def test_node_down_stops_the_node_and_its_workers(node: NodeProcess) -> None:
    pids = [worker_pid(node, i) for i in (0, 1)]
    down = node.down()
    assert down.returncode == 0, down.stderr
    assert f"pid {node.process.pid}" in down.stdout
    assert node.process.wait(timeout=60) == 0
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    assert node.down().stdout.strip().endswith("nothing was running")
    assert _targets(node) == []  # removed at stop
