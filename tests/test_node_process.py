"""``hloserve node up|down`` with the process runtime: local tritonservers, no Docker.

One ``hloserve node up`` subprocess with two CPU workers (tritonservers from the
nvidia-pytriton wheel) serving the digits repository, and the gateway in front. Checks the
answers through the gateway, a worker killed under load being restarted by the node while
traffic recovers, and ``hloserve node down`` (SIGTERM via the node's pid file) stopping it all.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import yaml
from node_testing import (
    LoadLoop,
    NodeProcess,
    contiguous_free_ports,
    infer_digits,
    ready,
    successes,
    two_worker_ports,
)

from hloserve.model_repository_tools import build_repository
from hloserve.node.tritonserver import free_ports

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
    gateway, admin = free_ports(2)
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
            "admin_port": admin,
            "settings": {"discovery": {"poll_interval_seconds": 1}},
        },
    }
    handle = NodeProcess(settings, work, STARTUP_S + 30)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="module")
def test_split(digits_model: Any, digits_params: Any) -> tuple[np.ndarray, np.ndarray]:
    _, _, x, _ = digits_model.load_split()
    return x, np.asarray(jax.jit(digits_model.apply)(digits_params, x))


def worker_pid(node: NodeProcess, index: int) -> int:
    lines = [ln for ln in node.log_text().splitlines() if f"worker {index} pid " in ln]
    return int(lines[-1].split(" pid ")[1].split()[0])


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
    admin = yaml.safe_load(node.config.read_text())["gateway"]["admin_port"]
    assert f"gateway grpc {node.gateway} admin http://127.0.0.1:{admin} " in node.log_text()


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


def test_node_down_stops_the_node_and_its_workers(node: NodeProcess) -> None:
    pids = [worker_pid(node, i) for i in (0, 1)]
    down = node.down()
    assert down.returncode == 0, down.stderr
    assert f"pid {node.process.pid}" in down.stdout
    assert node.process.wait(timeout=60) == 0
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    assert node.down().stdout.strip().endswith("nothing was running")
