"""``hloserve node up|down`` with the docker runtime on a real Docker daemon.

One node for the module: ``hloserve node up`` (a subprocess, as users run it) with two CPU
worker containers of the local test image (tests/docker_image.py: nothing is pulled) serving the
digits repository, and the gateway in front. The tests check the answers through the gateway,
the containers as Docker sees them, a worker killed under load being restarted by Docker while
traffic recovers, and ``hloserve node down`` leaving no container. Without a daemon the module
is skipped, unless ``HLOSERVE_REQUIRE_DOCKER=1`` (CI) makes that a failure.
"""

from __future__ import annotations

import contextlib
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import yaml
from docker_image import container_env, container_mounts, ensure_test_image

from hloserve.errors import Status
from hloserve.model_repository_tools import build_repository
from hloserve.node.node import NodeError
from hloserve.node.tritonserver import free_ports

pytestmark = [pytest.mark.docker, pytest.mark.tritonserver, pytest.mark.slow]

docker = pytest.importorskip("docker")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

#: This host's hard memlock limit: a nested or unprivileged daemon cannot raise it.
MEMLOCK = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
HLOSERVE = str(Path(sys.executable).parent / "hloserve")
STARTUP_S = 300.0


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    try:
        daemon = docker.from_env()
        daemon.ping()
    except docker.errors.DockerException as exc:
        reason = f"no Docker daemon ({exc}); scripts/docker.sh starts one as root"
        if os.environ.get("HLOSERVE_REQUIRE_DOCKER") == "1":
            pytest.fail(f"HLOSERVE_REQUIRE_DOCKER=1 but {reason}")
        pytest.skip(reason)
    yield daemon
    daemon.close()


def _contiguous_free_ports(count: int) -> int:
    """First of ``count`` consecutive ports free on 127.0.0.1 (random search, bounded)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 60000)
        with contextlib.ExitStack() as stack:
            try:
                for port in range(base, base + count):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise RuntimeError(f"no {count} consecutive free ports found")


@dataclass
class Node:
    name: str
    config: Path
    process: subprocess.Popen[bytes]
    log: Path
    gateway: str
    worker_http: tuple[str, ...]
    worker_grpc: tuple[str, ...]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def node(
    client: Any, digits_bundle: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Node]:
    image = ensure_test_image(client)
    work = tmp_path_factory.mktemp("node")
    (work / "bundles").mkdir()
    os.symlink(digits_bundle, work / "bundles" / "digits")
    repo = work / "repository"
    build_repository(work / "bundles", repo)
    base = _contiguous_free_ports(6)
    gateway_port, admin_port = free_ports(2)
    name = f"hlotest{os.getpid()}"
    config = work / "node.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "runtime": "docker",
                "repository": str(repo),
                "cpu_workers": 2,
                "ports": {
                    "http_base": base,
                    "grpc_base": base + 1,
                    "metrics_base": base + 2,
                    "stride": 3,
                },
                "restart": {"policy": "on-failure", "max_retries": 3},
                "tritonserver": {"startup_timeout_s": STARTUP_S},
                "docker": {
                    "image": image,
                    "launcher": "hloserve",
                    "mounts": container_mounts(),
                    "env": container_env(),
                    "shm_size": "256m",
                    "stop_timeout_s": 10,
                    # memlock: -1 (the default) needs a daemon allowed to raise the hard limit
                    "ulimits": {"memlock": MEMLOCK, "stack": 67108864},
                },
                "gateway": {
                    "listen": f"127.0.0.1:{gateway_port}",
                    "admin_port": admin_port,
                    "settings": {"discovery": {"poll_interval_seconds": 1}},
                },
            }
        )
    )
    log = work / "node.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [HLOSERVE, "node", "up", "--config", str(config)], stdout=out, stderr=subprocess.STDOUT
        )
    handle = Node(
        name=name,
        config=config,
        process=process,
        log=log,
        gateway=f"127.0.0.1:{gateway_port}",
        worker_http=(f"127.0.0.1:{base}", f"127.0.0.1:{base + 3}"),
        worker_grpc=(f"127.0.0.1:{base + 1}", f"127.0.0.1:{base + 4}"),
    )
    try:
        deadline = time.monotonic() + STARTUP_S + 30
        while "worker(s) ready" not in handle.log_text():
            assert process.poll() is None, f"node up exited:\n{handle.log_text()[-4000:]}"
            assert time.monotonic() < deadline, f"node not ready:\n{handle.log_text()[-4000:]}"
            time.sleep(0.5)
        yield handle
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=60)
        if process.poll() is None:
            process.kill()
            process.wait()
        for container in client.containers.list(
            all=True, filters={"label": f"hloserve.node={name}"}
        ):
            container.remove(force=True)


@pytest.fixture(scope="module")
def test_split(digits_model: Any, digits_params: Any) -> tuple[np.ndarray, np.ndarray]:
    _, _, x, _ = digits_model.load_split()
    return x, np.asarray(jax.jit(digits_model.apply)(digits_params, x))


def infer(client: Any, images: np.ndarray) -> np.ndarray:
    tensor = grpcclient.InferInput("image", list(images.shape), "FP32")
    tensor.set_data_from_numpy(np.ascontiguousarray(images))
    return client.infer("digits", [tensor], client_timeout=30).as_numpy("logits")


def containers(client: Any, node: Node) -> list[Any]:
    found = client.containers.list(all=True, filters={"label": f"hloserve.node={node.name}"})
    return sorted(found, key=lambda c: c.labels["hloserve.worker"])


def successes(url: str) -> int:
    stats = grpcclient.InferenceServerClient(url).get_inference_statistics("digits", as_json=True)
    return int(stats["model_stats"][0]["inference_stats"]["success"].get("count", 0))


def test_two_cpu_worker_containers_serve_digits_through_the_gateway(
    client: Any, node: Node, test_split: Any
) -> None:
    found = containers(client, node)
    assert [c.name for c in found] == [f"hloserve-{node.name}-worker{i}" for i in (0, 1)]
    assert all(c.status == "running" for c in found)
    images, reference = test_split
    gateway = grpcclient.InferenceServerClient(node.gateway)
    for start in range(0, 64, 8):
        logits = infer(gateway, images[start : start + 8])
        np.testing.assert_allclose(logits, reference[start : start + 8], rtol=1e-5, atol=1e-5)
    # round robin over both containers (Triton's success count lags the answer: poll, bounded)
    for _ in range(100):
        if all(successes(url) > 0 for url in node.worker_grpc):
            break
        time.sleep(0.1)
    assert all(successes(url) > 0 for url in node.worker_grpc)
    assert "[worker 0]" in node.log_text() and "[worker 1]" in node.log_text()


def test_containers_are_what_the_node_file_asked_for(client: Any, node: Node) -> None:
    host_config = containers(client, node)[1].attrs["HostConfig"]
    assert host_config["NetworkMode"] == "host"
    assert host_config["ShmSize"] == 256 * 1024 * 1024
    assert host_config["RestartPolicy"] == {"Name": "on-failure", "MaximumRetryCount": 3}
    assert {u["Name"]: u["Soft"] for u in host_config["Ulimits"]} == {
        "memlock": MEMLOCK,
        "stack": 67108864,
    }
    assert any(b.endswith(":/models:ro") for b in host_config["Binds"])
    assert host_config["Init"] is True


def test_missing_image_is_a_clear_error(client: Any, node: Node) -> None:
    from hloserve.node.docker_runtime import DockerWorkers
    from hloserve.node.node import plan_workers
    from hloserve.node.node_config import load_node_config

    config = load_node_config(node.config, environ={})
    config = config.model_copy(
        update={
            "name": "hlomissing",
            "docker": config.docker.model_copy(update={"image": "hloserve-missing:0"}),
        }
    )
    with pytest.raises(NodeError, match="docker image 'hloserve-missing:0' is not present") as info:
        DockerWorkers(config, plan_workers(config)).start()
    assert info.value.status is Status.NOT_FOUND


def test_killed_worker_is_restarted_and_traffic_recovers(
    client: Any, node: Node, test_split: Any
) -> None:
    images, reference = test_split
    worker = containers(client, node)[0]
    restarts_before = worker.attrs["RestartCount"]
    results: list[bool] = []
    stop = threading.Event()

    def load() -> None:  # bounded: at most 3000 requests or until stopped
        gateway = grpcclient.InferenceServerClient(node.gateway)
        for i in range(3000):
            if stop.is_set():
                return
            try:
                logits = infer(gateway, images[i % 32 : i % 32 + 1])
                results.append(bool(np.allclose(logits, reference[i % 32 : i % 32 + 1], atol=1e-5)))
            except InferenceServerException:
                results.append(False)
            time.sleep(0.01)

    loader = threading.Thread(target=load)
    loader.start()
    try:
        while len(results) < 20 and loader.is_alive():
            time.sleep(0.1)
        os.kill(worker.attrs["State"]["Pid"], signal.SIGKILL)  # a crash, not a docker stop
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            worker.reload()
            if worker.attrs["RestartCount"] > restarts_before and _ready(node.worker_http[0]):
                break
            time.sleep(0.5)
        assert worker.attrs["RestartCount"] == restarts_before + 1, node.log_text()[-3000:]
        # traffic recovers: the restarted worker serves again, through the gateway
        served_after = len(results)
        for _ in range(300):
            if successes(node.worker_grpc[0]) > 0 and len(results) > served_after + 20:
                break
            time.sleep(0.2)
        assert successes(node.worker_grpc[0]) > 0, "the restarted worker got no traffic"
    finally:
        stop.set()
        loader.join(timeout=60)
    tail = results[-20:]
    assert len(tail) == 20 and all(tail), f"last answers {tail}"
    assert "restarted by Docker" in node.log_text()


def _ready(http: str) -> bool:
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{http}/v2/health/ready", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def test_node_down_removes_every_container(client: Any, node: Node) -> None:
    down = subprocess.run(
        [HLOSERVE, "node", "down", "--config", str(node.config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert down.returncode == 0, down.stderr
    assert f"hloserve-{node.name}-worker0" in down.stdout
    assert containers(client, node) == []
    assert node.process.wait(timeout=60) == 0
    assert f"hloserve node {node.name}: stopped" in node.log_text()
